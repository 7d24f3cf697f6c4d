package kvmanager

import (
	"fmt"
	"runtime"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/pool"
)

// checkDigest is the decode rank's digest check (docs/PROTOCOL.md
// "Digest"): for a room that asked for one, the CRC-32C of each page a
// notification names (or a pull read, once done: its PAGES' sums), summed over this rank's own pieces of it
// (kvlayout.DigestPieces of the units it says it filled), must be the one
// the prefill rank summed from its source before the write. It returns
// the first page that does not match ("" when all do, or the room did not
// ask); the core fails the room (core.CodeCorrupt). A notification
// without digests for such a room the core fails itself. (A failure to
// sum here is this rank's, not the prefill rank's: see digestOf.)
func (d *Decode) checkDigest(n core.Notified) string {
	corrupt, _, err := d.digestOf(n)
	if err != nil {
		return err.Error()
	}
	return corrupt
}

// digestOf is checkDigest, and whether every page n names was summed and
// matched (checked): the core records a digest room's pages as landed only
// then (a room that failed already is not checked here, and what its
// notifications name is not vouched for in its load report). err: this
// rank could not sum its own pieces (its CUDA driver failed, say) — the
// room fails, but not corrupt: nothing says the prefill rank's bytes were
// wrong.
func (d *Decode) digestOf(n core.Notified) (corrupt string, checked bool, err error) {
	if n.Aux || n.N == 0 || n.Digests == nil {
		return "", false, nil
	}
	var spec core.RequestSpec
	var l core.Link
	var ok bool
	d.read(func(c *core.Core) { spec, l, ok = c.WriteSource(n.Room, n.UID) })
	if !ok || !spec.Digest || spec.Dummy || n.Off < 0 || n.Off+n.N > len(spec.DstPages) {
		return "", false, nil // (the core refuses what is out of range)
	}
	s, lo, hi, write, err := d.slice(l)
	if err != nil || !write {
		d.digestErrors.Add(1)
		return "", false, fmt.Errorf("this decode rank cannot plan its pieces of the notification's pages (%v)", err)
	}
	units := kvlayout.DigestUnits(pageMap(l), spec.DstPages, n.Off, n.N, n.LastUnits, nil)
	rlo, rhi := max(n.Lo*kvlayout.RegionsPerLayer, lo), min(n.Hi*kvlayout.RegionsPerLayer, hi)
	pieces, ends := kvlayout.DigestPieces(d.cfg.Layout, s, false, rlo, rhi, kvlayout.UnitRuns(units), nil, nil)
	sums, err := pool.SumPieces(d.agent, d.cfg.Layout, rlo, rhi, pieces, ends)
	if err != nil {
		d.digestErrors.Add(1)
		return "", false, fmt.Errorf("this decode rank could not sum its %d pages of layers %d–%d for their digest: %w", n.N, n.Lo, n.Hi, err)
	}
	if len(sums) != len(n.Digests) {
		return fmt.Sprintf("its %d pages make %d digests here", n.N, len(sums)), false, nil
	}
	for i, got := range sums {
		if got != n.Digests[i] {
			return fmt.Sprintf("position %d (decode page %d), layers %d–%d: CRC-32C %08x, the prefill rank's digest %08x", n.Off+i, spec.DstPages[n.Off+i], n.Lo, n.Hi, got, n.Digests[i]), false, nil
		}
	}
	d.digestPages.Add(uint64(len(sums)))
	return "", true, nil
}

// digestable says why a room's pages could not be summed here, if they
// could not: a source whose writes this rank cannot plan (a room created
// with explicit targets under a Model names no instance shape) would fail
// a good room corrupt at its first notification, so the room is refused
// instead.
func (d *Decode) digestable(room uint64) error {
	for _, l := range d.roomLinks(room) {
		if _, _, _, _, err := d.slice(l); err != nil {
			return err
		}
	}
	return nil
}

// checkAside hands a notification with digests to the digest workers (one
// a CPU, started at the first), so summing its pages — a pass over them —
// holds neither the notifier nor the other rooms' notifications behind it;
// the queue is bounded (the notifier waits when it is full). Notifications
// of one room may then be stepped out of their order, which the core takes
// (a room succeeds once every chunk and layer is counted, whatever the
// order).
func (d *Decode) checkAside(n core.Notified) {
	d.digestOnce.Do(func() {
		d.digestQ = make(chan core.Notified, 64)
		for range runtime.GOMAXPROCS(0) {
			d.spawn(d.digestWorker)
		}
	})
	select {
	case d.digestQ <- n:
	case <-d.closing:
	}
}

// digestWorker checks and steps the notifications checkAside queues.
func (d *Decode) digestWorker() {
	for {
		select {
		case n := <-d.digestQ:
			d.notified(n)
		case <-d.closing:
			return
		}
	}
}
