package pool

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/nixl"
)

// Read is one pull read (docs/PROTOCOL.md "Pull"): the pieces Writes would
// carry from Remote's memory (Source) into the pool's own, read from
// Remote — the pages in one transfer, the host items (aux, state) in
// another. A Job carrying a Read is posted by a worker like a write, its transfers' completions come to the worker like a write's,
// bounded by the same stall deadline, and it is Done once each has ended:
// quiesced unless a failure may still land (one the engine reported
// complete that did not deliver, canary.ErrNotDelivered, lands nothing
// more). A read whose preparation fails is Done, quiesced, without its
// gate, and so is one the pool is closing before it was prepared (its
// transfers in flight when the pool begins to close are released at once,
// failing it with ErrClosed, not quiesced); one its gate refuses is
// Dropped.
type Read struct {
	Remote string  // the loaded agent the read goes through
	Source Layout  // the memory it reads (Remote's regions)
	Writes []Write // what Remote's rank would have written here
	Slice  *Slice  // the rank mapping's slice (nil: identical layouts)
	// Until ends the lease: no transfer of the read is posted at or after
	// it (one posted before may still land).
	Until time.Time
	// Hold (optional) is read-locked from the read's preparation through
	// its gate to its last post: whoever replaces Remote's metadata holds
	// it for writing, so no read is prepared through one remote and posted
	// through its successor, and the gate sees the offer it is posted
	// under.
	Hold *sync.RWMutex
	// Bytes and Transfers: what the read moves, set before it is posted.
	Bytes     uint64
	Transfers int
}

// ErrLeaseEnded fails a read whose lease (Read.Until) ended before its
// (next) transfer was posted.
var ErrLeaseEnded = errors.New("transfer: the read's lease ended")

// errGated: a read's gate refused it (Dropped is called).
var errGated = errors.New("transfer: read gated")

// startRead prepares a read under its Hold, passes it through its job's
// gate and posts its transfers, with done told when each is final. A nil
// flight means the read is over: gated (errGated), or failed with err —
// posted says whether anything of it reached the engine's post.
func (p *Pool) startRead(j Job, done chan<- *nixl.Xfer) (f *flight, posted bool, err error) {
	rd := j.Read
	if rd.Hold != nil {
		rd.Hold.RLock()
		defer rd.Hold.RUnlock()
	}
	var kvSrc, kvDst, hostSrc, hostDst []nixl.Desc
	for i := range rd.Writes {
		w := &rd.Writes[i]
		s, t, err := ReadPairs(w, rd.Source, p.local, rd.Slice)
		if err != nil {
			return nil, false, err
		}
		if w.AuxSrc >= 0 || w.State >= 0 {
			hostSrc, hostDst = append(hostSrc, s...), append(hostDst, t...)
		} else {
			kvSrc, kvDst = append(kvSrc, s...), append(kvDst, t...)
		}
	}
	var xs []*nixl.Xfer
	var releases []func()
	release := func() {
		for _, f := range releases {
			f()
		}
	}
	prep := func(srcKind, dstKind nixl.MemKind, src, dst []nixl.Desc) error {
		if len(src) == 0 {
			return nil
		}
		lp, err := p.agent.PrepLocal(dstKind, dst)
		if err != nil {
			return err
		}
		releases = append(releases, func() { lp.Release() })
		rp, err := p.agent.PrepRemote(rd.Remote, srcKind, src)
		if err != nil {
			return err
		}
		releases = append(releases, func() { rp.Release() })
		idx := make([]int, len(src))
		for i := range idx {
			idx[i] = i
		}
		x, err := p.agent.NewXfer(nixl.Read, lp, idx, rp, idx, nil)
		if err != nil {
			return err
		}
		releases = append(releases, func() { p.agent.Release(x) })
		xs = append(xs, x)
		return nil
	}
	err = prep(rd.Source.Kind, p.local.Kind, kvSrc, kvDst)
	if err == nil {
		err = prep(nixl.DRAM, nixl.DRAM, hostSrc, hostDst)
	}
	if err == nil && len(xs) == 0 {
		// Nothing to read (ReadPairs refuses what lies outside the
		// regions, so only a read of no pieces): it cannot count as what
		// it stands for.
		err = errors.New("transfer: the read names nothing to read")
	}
	if err != nil {
		release()
		return nil, false, err
	}
	rd.Bytes, rd.Transfers = 0, len(xs)
	for _, d := range kvDst {
		rd.Bytes += d.Len
	}
	for _, d := range hostDst {
		rd.Bytes += d.Len
	}
	// The gate, right before the posts (under the Hold).
	if !j.Gate(nil) {
		release()
		return nil, false, errGated
	}
	f = &flight{job: j, deadline: time.Now().Add(p.cfg.Stall), done: release}
	for i, x := range xs {
		var perr error
		unposted := false
		if !p.cfg.Now().Before(rd.Until) {
			// The lease ended (its preparation, or the posts before, took
			// it): this transfer and the rest are not posted.
			perr, unposted = fmt.Errorf("%w (%v) before its transfer %d of %d was posted", ErrLeaseEnded, rd.Until, i+1, len(xs)), true
		} else if perr = p.agent.PostTo(x, done); perr != nil {
			// Refused before the engine saw it (its lists are stale) only
			// then: any other failed post may have started.
			unposted = errors.Is(perr, nixl.ErrStalePrep)
		}
		if perr == nil {
			f.xs = append(f.xs, x)
			continue
		}
		if i == 0 {
			release()
			return nil, !unposted, perr
		}
		// The transfers posted before are waited for: the read fails once
		// they have ended, quiesced unless one of them, or this failed
		// post, may still land.
		f.err = perr
		f.landable = !unposted
		break
	}
	f.left = len(f.xs)
	return f, true, nil
}

// ReadPairs turns a write that src's rank would make into dst's memory —
// page runs over its layers (with the rank mapping's slice s, nil for
// identical layouts), one aux item, or state items — into descriptor
// pairs: srcDescs[i] holds what dstDescs[i] receives. A decode rank that
// pulls reads srcDescs from the prefill rank into its own dstDescs (a
// NIXL READ). Every piece is checked to lie inside its side's regions
// first: a run, item or layer outside them is an error, nothing is
// returned for it.
func ReadPairs(w *Write, src, dst Layout, s *Slice) (srcDescs, dstDescs []nixl.Desc, err error) {
	switch {
	case w.State >= 0:
		if w.State >= len(src.State) || w.State >= len(dst.State) || src.State[w.State].ItemBytes != dst.State[w.State].ItemBytes {
			return nil, nil, fmt.Errorf("transfer: state region %d does not match on both sides", w.State)
		}
		ss, ds := src.State[w.State], dst.State[w.State]
		for _, run := range w.Runs {
			for k := uint32(0); k < run.Len; k++ {
				si, di := int(run.Src+k), int(run.Dst+k)
				if si >= kvlayout.Items(ss) || di >= kvlayout.Items(ds) {
					return nil, nil, fmt.Errorf("transfer: state item %d → %d is outside state region %d (%d, %d items)", si, di, w.State, kvlayout.Items(ss), kvlayout.Items(ds))
				}
				srcDescs = append(srcDescs, item(ss.Desc, si, ss.ItemBytes))
				dstDescs = append(dstDescs, item(ds.Desc, di, ds.ItemBytes))
			}
		}
		return srcDescs, dstDescs, nil
	case w.AuxSrc >= 0:
		if src.AuxItemBytes == 0 || src.AuxItemBytes != dst.AuxItemBytes {
			return nil, nil, fmt.Errorf("transfer: aux items of %d and %d bytes", src.AuxItemBytes, dst.AuxItemBytes)
		}
		if w.AuxSrc >= kvlayout.AuxItems(src) || w.AuxDst < 0 || w.AuxDst >= kvlayout.AuxItems(dst) {
			return nil, nil, fmt.Errorf("transfer: aux item %d → %d is outside the aux regions (%d, %d items)", w.AuxSrc, w.AuxDst, kvlayout.AuxItems(src), kvlayout.AuxItems(dst))
		}
		return []nixl.Desc{item(src.Aux, w.AuxSrc, src.AuxItemBytes)}, []nixl.Desc{item(dst.Aux, w.AuxDst, dst.AuxItemBytes)}, nil
	}
	if l := w.Layers; l.Hi != 0 && (l.Lo < 0 || l.Lo >= l.Hi || 2*l.Hi > len(src.Regions)) {
		return nil, nil, fmt.Errorf("transfer: layers [%d, %d) are not within the source's %d layers", l.Lo, l.Hi, len(src.Regions)/2)
	}
	rlo, rhi := w.Layers.Regions(len(src.Regions))
	if s != nil {
		sl := *s
		loc := src
		loc.Regions, sl.RegionOffset = src.Regions[rlo:rhi], sl.RegionOffset+rlo
		if err := kvlayout.CheckRuns(w.Runs, loc, dst, &sl); err != nil {
			return nil, nil, err
		}
		srcDescs, dstDescs = kvlayout.ExpandSlice(w.Runs, loc, dst, &sl)
		return srcDescs, dstDescs, nil
	}
	if len(src.Regions) > len(dst.Regions) || src.PageBytes != dst.PageBytes {
		return nil, nil, fmt.Errorf("transfer: %d regions of %d-byte pages do not fit %d of %d-byte pages", len(src.Regions), src.PageBytes, len(dst.Regions), dst.PageBytes)
	}
	sp, dp := kvlayout.Pages(src), kvlayout.Pages(dst)
	for i := rlo; i < rhi; i++ {
		for _, run := range w.Runs {
			if int(run.Src)+int(run.Len) > sp || int(run.Dst)+int(run.Len) > dp {
				return nil, nil, fmt.Errorf("transfer: pages %d+%d → %d+%d are outside the regions (%d, %d pages)", run.Src, run.Len, run.Dst, run.Len, sp, dp)
			}
			n := uint64(run.Len) * src.PageBytes
			srcDescs = append(srcDescs, nixl.Desc{Addr: src.Regions[i].Addr + uintptr(uint64(run.Src)*src.PageBytes), Len: n, Dev: src.Regions[i].Dev})
			dstDescs = append(dstDescs, nixl.Desc{Addr: dst.Regions[i].Addr + uintptr(uint64(run.Dst)*dst.PageBytes), Len: n, Dev: dst.Regions[i].Dev})
		}
	}
	return srcDescs, dstDescs, nil
}

// item is the i-th item of size n in region d.
func item(d nixl.Desc, i int, n uint64) nixl.Desc {
	return nixl.Desc{Addr: d.Addr + uintptr(uint64(i)*n), Len: n, Dev: d.Dev}
}
