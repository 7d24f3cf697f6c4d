package kvmanager

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/kvbridge/kvbridge/internal/canary"
	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"go.uber.org/zap"
)

// The decode rank's write check (docs/PROTOCOL.md "Writes checked before
// they count"): an engine can report a write complete whose bytes did not
// all land (NIXL 1.4.0 over cma: docs/ENGINES.md), and the prefill rank's
// notification follows that report. Before a room's REQUEST goes out its
// destination pieces — the descriptors a write of them fills, before
// merging (kvlayout.Tails) — get a canary in their last 8 bytes, and a
// notification whose pieces still end with it fails the room
// (core.CodeNotDelivered) instead of counting. Host memory only: VRAM
// pages are not checked (their state items are).
type writeCheck struct {
	key uint64 // canaries are this key mixed with the room id
	// skipped: BenchmarkWriteCheck's reference (the same rooms unchecked).
	skipped atomic.Bool
	warned  atomic.Bool // uncheckedLink logged
}

func newWriteCheck() *writeCheck {
	var b [8]byte
	rand.Read(b[:])
	return &writeCheck{key: binary.LittleEndian.Uint64(b[:])}
}

// canary is room's canary: random to the prefill rank, so KV bytes equal
// to it by chance are one in 2⁶⁴.
func (w *writeCheck) canary(room uint64) uint64 {
	z := w.key ^ (room * 0x9e3779b97f4a7c15)
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// slice is what source link l writes into this rank: its head slice (nil
// without a Model: whole pages) and the regions [rlo, rhi) of this rank it
// writes; write false for a dummy.
func (d *Decode) slice(l core.Link) (s *kvlayout.Slice, rlo, rhi int, write bool, err error) {
	if l.Dummy {
		return nil, 0, 0, false, nil
	}
	m := d.cfg.Model
	if kvlayout.NoModel(m) {
		return nil, 0, len(d.cfg.Layout.Regions), true, nil
	}
	if l.InstTP == 0 || l.InstPP == 0 {
		// A target named explicitly (CreateReceiver) under a Model: the
		// instance's shape, and so what this rank writes, is not known.
		return nil, 0, 0, false, fmt.Errorf("prefill rank %d named without its instance's shape (CreateReceiver with explicit targets under a Model)", l.Rank)
	}
	src := m
	if l.Pages.Src > 0 {
		src = kvlayout.WithPages(m, l.Pages.Src)
	}
	p := kvlayout.Parallel{TPSize: l.InstTP, TPRank: l.Rank, PPSize: l.InstPP, PPRank: l.PP}
	if s, err = kvlayout.Plan(src, m, p, d.cfg.Parallel); err != nil || s == nil {
		return nil, 0, 0, false, err
	}
	_, n := m.StageLayers(p.PPSize, p.PPRank)
	return s, s.RegionOffset, s.RegionOffset + n*kvlayout.RegionsPerLayer, true, nil
}

// pageMap is link l's page map (the zero map: pages of the same size).
func pageMap(l core.Link) kvlayout.PageMap {
	if l.Pages.Src == 0 || l.Pages.Dst == 0 {
		return kvlayout.PageMap{Src: 1, Dst: 1}
	}
	return l.Pages
}

// tails appends the tails of what source l writes of spec at positions
// [off, off+n) of its pages, in this rank's regions [rlo, rhi) clipped to
// the source's, and with state its state items. last: the positions are
// the room's last chunk's, whose last page may be filled only in part
// (kvlayout.WrittenUnits).
func (d *Decode) tails(spec core.RequestSpec, l core.Link, off, n, rlo, rhi int, state, last bool, out []uint64) ([]uint64, error) {
	if spec.Dummy || spec.Pull {
		return out, nil
	}
	s, lo, hi, write, err := d.slice(l)
	if err != nil || !write {
		return out, err
	}
	lay := d.cfg.Layout
	if lay.Kind == nixl.DRAM && n > 0 {
		units := kvlayout.WrittenUnits(pageMap(l), spec.DstPages, off, n, last, nil)
		out = kvlayout.Tails(lay, s, max(rlo, lo), min(rhi, hi), units, out)
	}
	if state && l.Aux {
		for i, items := range spec.StateIndices {
			if i >= len(lay.State) || lay.State[i].ItemBytes < kvlayout.TailBytes {
				continue
			}
			st := lay.State[i]
			for _, it := range items {
				if int(it) < kvlayout.Items(st) {
					out = append(out, uint64(st.Addr)+(uint64(it)+1)*st.ItemBytes-kvlayout.TailBytes)
				}
			}
		}
	}
	return out, nil
}

// writeTails is where room's canaries go: the end of every piece its
// sources will write (nil when nothing is checked). Computed before
// InitReceiver's step, planted in it (plant).
func (d *Decode) writeTails(room uint64, spec core.RequestSpec) []uint64 {
	if d.wcheck.skipped.Load() || spec.Pull || spec.Dummy {
		return nil
	}
	var tails []uint64
	for _, l := range d.roomLinks(room) {
		t, err := d.tails(spec, l, 0, len(spec.DstPages), 0, len(d.cfg.Layout.Regions), true, false, tails)
		if err != nil {
			d.uncheckedLink(room, l, err) // that link's writes are not checked; the others' are
			continue
		}
		tails = t
	}
	return tails
}

// roomLinks are a live room's sources' links, by uid.
func (d *Decode) roomLinks(room uint64) []core.Link {
	var links []core.Link
	d.read(func(c *core.Core) {
		for uid := 0; ; uid++ {
			_, l, ok := c.WriteSource(room, uid)
			if !ok {
				break
			}
			links = append(links, l)
		}
	})
	return links
}

// plant (InitReceiver's step, under the core's lock) plants room's
// canaries only if that step will send its REQUEST: a second Init, or one
// racing an Abort, Clear or Close, plants nothing into pages a write may
// have filled or that were given back.
func (d *Decode) plant(room uint64, tails []uint64) func(c *core.Core) {
	return func(c *core.Core) {
		if len(tails) > 0 && c.Initable(room) {
			canary.Plant(tails, d.wcheck.canary(room))
		}
	}
}

// uncheckedLink logs, once per process, a room link whose writes the
// check cannot follow (its plan failed: a room created with explicit
// targets under a Model names no instance shape).
func (d *Decode) uncheckedLink(room uint64, l core.Link, err error) {
	if d.wcheck.warned.CompareAndSwap(false, true) {
		d.log.Warn("write check: a room's prefill rank's writes are not checked (no plan for its link; logged once)",
			zap.Uint64("room", room), zap.Int("rank", l.Rank), zap.Error(err))
	}
}

// checkWrite returns what of notification n did not land ("" when
// everything it names did, or it cannot be checked).
func (d *Decode) checkWrite(n core.Notified) string {
	w := d.wcheck
	if w.skipped.Load() || !n.Aux && n.Hi == 0 {
		return "" // (an earlier revision's notification names no positions)
	}
	var spec core.RequestSpec
	var l core.Link
	var ok bool
	d.read(func(c *core.Core) { spec, l, ok = c.WriteSource(n.Room, n.UID) })
	if !ok || n.Off < 0 && !n.Aux || n.Off+n.N > len(spec.DstPages) {
		return "" // (the core refuses it)
	}
	off, cnt, rlo, rhi := n.Off, n.N, n.Lo*kvlayout.RegionsPerLayer, n.Hi*kvlayout.RegionsPerLayer
	if n.Aux {
		off, cnt = 0, 0
	}
	tails, err := d.tails(spec, l, off, cnt, rlo, rhi, n.Aux, n.Total > 0, nil)
	if err != nil {
		return ""
	}
	i := canary.Find(tails, w.canary(n.Room))
	if i < 0 {
		return ""
	}
	return fmt.Sprintf("the piece ending at %#x (%s) still ends with the canary planted before the REQUEST", tails[i]+kvlayout.TailBytes, d.describe(tails[i]))
}

// describe names the region and page (or state item) of a tail address.
func (d *Decode) describe(a uint64) string {
	lay := d.cfg.Layout
	for r, reg := range lay.Regions {
		if a >= uint64(reg.Addr) && a < uint64(reg.Addr)+reg.Len && lay.PageBytes > 0 {
			return fmt.Sprintf("region %d (layer %d %s), page %d", r, r/kvlayout.RegionsPerLayer, [2]string{"K", "V"}[r%2], (a-uint64(reg.Addr))/lay.PageBytes)
		}
	}
	for i, st := range lay.State {
		if a >= uint64(st.Addr) && a < uint64(st.Addr)+st.Len && st.ItemBytes > 0 {
			return fmt.Sprintf("state region %d, item %d", i, (a-uint64(st.Addr))/st.ItemBytes)
		}
	}
	return "outside the registered memory"
}
