package pool

import (
	"fmt"
	"sync"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/nixl"
)

// MaxPreparedDescs bounds one side's prepared descriptor lists (a head
// slice in NHD layout is one descriptor per token of every page of every
// region); past it, writes of that shape prepare their own lists.
const MaxPreparedDescs = 1 << 22

// maxSlicePieces is the bound a slice shape's prepared pieces are held to
// (MaxPreparedDescs; the tests lower it to reach the write's own lists).
var maxSlicePieces = MaxPreparedDescs

// sideLists are one side's descriptors, prepared once: every page of every
// KV region (index r·pages + p), and in host memory the aux items followed
// by every state region's items (so aux item i is host index i); head-slice
// pieces per slice shape.
type sideLists struct {
	pages     int
	kv        *nixl.Prepped
	host      *nixl.Prepped // nil when the side has no aux or state items
	stateBase []int
	slices    map[sliceKey]*sliceList
}

// sliceKey names a head-slice shape on one side. unit 0 cuts each page as
// a whole (both sides' pages hold the same tokens); otherwise each page is
// cut unit by unit (units of unit tokens: pages of different sizes).
type sliceKey struct {
	head, heads, perToken, headBytes, tokens int
	layout                                   PageLayout
	regionOffset, regions                    int
	unit                                     int
	// wholeUnit: NHD, the slice holds every head of both sides' pages —
	// a unit is one contiguous piece.
	wholeUnit bool
}

type sliceList struct {
	l       *nixl.Prepped // nil: too many pieces, prepare per write
	pieces  int           // per page
	perUnit int           // per unit (unit slices): a unit's pieces are consecutive
}

// descs returns the descriptors of one slice shape over a side's pages:
// for region i (of regions, from regionOffset) and page p, pieces at
// ((i·pages)+p)·n + t; with units, unit u of a page has pieces
// prepSide prepares a side's page and host lists (remote "" for local).
func prepSide(a *nixl.Agent, remote string, l Layout) (*sideLists, error) {
	s := &sideLists{pages: kvlayout.Pages(l), slices: map[sliceKey]*sliceList{}}
	prep := func(kind nixl.MemKind, d []nixl.Desc) (*nixl.Prepped, error) {
		if remote == "" {
			return a.PrepLocal(kind, d)
		}
		return a.PrepRemote(remote, kind, d)
	}
	if n := len(l.Regions) * s.pages; n > MaxPreparedDescs {
		return nil, fmt.Errorf("transfer: %d pages × %d regions is more than %d prepared descriptors", s.pages, len(l.Regions), MaxPreparedDescs)
	}
	kv := make([]nixl.Desc, 0, len(l.Regions)*s.pages)
	for _, r := range l.Regions {
		for p := 0; p < s.pages; p++ {
			kv = append(kv, nixl.Desc{Addr: r.Addr + uintptr(uint64(p)*l.PageBytes), Len: l.PageBytes, Dev: r.Dev})
		}
	}
	var err error
	if len(kv) > 0 {
		if s.kv, err = prep(l.Kind, kv); err != nil {
			return nil, err
		}
	}
	var host []nixl.Desc
	for i := 0; i < kvlayout.AuxItems(l); i++ {
		host = append(host, nixl.Desc{Addr: l.Aux.Addr + uintptr(uint64(i)*l.AuxItemBytes), Len: l.AuxItemBytes, Dev: l.Aux.Dev})
	}
	for _, st := range l.State {
		s.stateBase = append(s.stateBase, len(host))
		for i := 0; i < kvlayout.Items(st); i++ {
			host = append(host, nixl.Desc{Addr: st.Addr + uintptr(uint64(i)*st.ItemBytes), Len: st.ItemBytes, Dev: st.Dev})
		}
	}
	if len(host) > 0 {
		if s.host, err = prep(nixl.DRAM, host); err != nil {
			s.release()
			return nil, err
		}
	}
	return s, nil
}

// u·perUnit … (u+1)·perUnit−1 of it (HND: one per head; NHD: one per token).
func (k sliceKey) descs(l Layout) ([]nixl.Desc, int, int) {
	hb := uint64(k.headBytes)
	n, size := 1, uint64(k.heads)*uint64(k.tokens)*hb
	if k.layout != HND {
		n, size = k.tokens, uint64(k.heads)*hb
	}
	units, perUnit, unitTokens := 1, n, k.tokens
	if k.unit > 0 {
		units, unitTokens = k.tokens/k.unit, k.unit
		perUnit, size = k.heads, uint64(k.unit)*hb // HND: a head's tokens of the unit
		switch {
		case k.layout != HND && k.wholeUnit:
			perUnit, size = 1, uint64(k.unit)*uint64(k.heads)*hb // NHD, every head: the unit
		case k.layout != HND:
			perUnit, size = k.unit, uint64(k.heads)*hb // NHD: a token's heads
		}
		n = units * perUnit
	}
	pages := kvlayout.Pages(l)
	total := k.regions * pages * n
	if total > maxSlicePieces {
		return nil, n, perUnit
	}
	out := make([]nixl.Desc, 0, total)
	for i := 0; i < k.regions; i++ {
		r := l.Regions[i+k.regionOffset]
		for p := 0; p < pages; p++ {
			base := r.Addr + uintptr(uint64(p)*l.PageBytes)
			for u := 0; u < units; u++ {
				for t := 0; t < perUnit; t++ {
					var off uint64
					switch {
					case k.layout != HND: // NHD: the heads of token u·unit + t
						off = uint64((u*unitTokens+t)*k.perToken+k.head) * hb
					case k.unit > 0: // HND: head t's tokens of unit u
						off = uint64((k.head+t)*k.tokens+u*unitTokens) * hb
					default: // HND: the heads' block
						off = uint64(k.head) * uint64(k.tokens) * hb
					}
					out = append(out, nixl.Desc{Addr: base + uintptr(off), Len: size, Dev: r.Dev})
				}
			}
		}
	}
	return out, n, perUnit
}

func (s *sideLists) slice(a *nixl.Agent, remote string, l Layout, k sliceKey) (*sliceList, error) {
	if sl, ok := s.slices[k]; ok {
		return sl, nil
	}
	d, n, perUnit := k.descs(l)
	sl := &sliceList{pieces: n, perUnit: perUnit}
	if d != nil {
		var err error
		if remote == "" {
			sl.l, err = a.PrepLocal(l.Kind, d)
		} else {
			sl.l, err = a.PrepRemote(remote, l.Kind, d)
		}
		if err != nil {
			return nil, err
		}
	}
	s.slices[k] = sl
	return sl, nil
}

func (s *sideLists) release() {
	for _, p := range []*nixl.Prepped{s.kv, s.host} {
		if p != nil {
			p.Release()
		}
	}
	for _, sl := range s.slices {
		if sl.l != nil {
			sl.l.Release()
		}
	}
}

// peerLists are one peer's remote lists; writes made from them hold a
// reference, so lists replaced (the peer registered again) or evicted are
// released only when their last write is.
type peerLists struct {
	*sideLists
	layout Layout
	refs   int
	dead   bool
	used   uint64
}

// sameLayout reports whether two layouts describe the same memory.
func sameLayout(a, b Layout) bool {
	if a.Kind != b.Kind || a.PageBytes != b.PageBytes || a.Aux != b.Aux || a.AuxItemBytes != b.AuxItemBytes ||
		len(a.Regions) != len(b.Regions) || len(a.State) != len(b.State) {
		return false
	}
	for i := range a.Regions {
		if a.Regions[i] != b.Regions[i] {
			return false
		}
	}
	for i := range a.State {
		if a.State[i] != b.State[i] {
			return false
		}
	}
	return true
}

// lists is the pool's prepared descriptor lists: the local side's, made at
// the first use, and each peer's, made when the peer registers (PreparePeer)
// or at its first write, at most MaxPeers of them (least recently used
// evicted).
type lists struct {
	agent    *nixl.Agent
	local    Layout
	maxPeers int

	mu      sync.Mutex
	self    *sideLists
	selfErr error
	peers   map[string]*peerLists
	clock   uint64
}

func (ls *lists) localLists() (*sideLists, error) {
	if ls.self == nil && ls.selfErr == nil {
		ls.self, ls.selfErr = prepSide(ls.agent, "", ls.local)
	}
	return ls.self, ls.selfErr
}

// peer returns the remote lists for a peer of layout l, preparing them if
// missing or made for another layout, with a reference taken (ls.mu held).
func (ls *lists) peer(remote string, l Layout) (*peerLists, error) {
	ls.clock++
	if p, ok := ls.peers[remote]; ok && sameLayout(p.layout, l) {
		p.refs++
		p.used = ls.clock
		return p, nil
	}
	side, err := prepSide(ls.agent, remote, l)
	if err != nil {
		return nil, err
	}
	ls.drop(remote)
	if len(ls.peers) >= ls.maxPeers {
		var lru string
		var min uint64
		for name, p := range ls.peers {
			if lru == "" || p.used < min {
				lru, min = name, p.used
			}
		}
		ls.drop(lru)
	}
	p := &peerLists{sideLists: side, layout: l, refs: 1, used: ls.clock}
	ls.peers[remote] = p
	return p, nil
}

// drop forgets a peer's lists, releasing them once unreferenced (ls.mu held).
func (ls *lists) drop(remote string) {
	if p, ok := ls.peers[remote]; ok {
		delete(ls.peers, remote)
		p.dead = true
		if p.refs == 0 {
			p.release()
		}
	}
}

// dropStale forgets a peer's lists after a post found them stale; the next
// write prepares them again from the metadata loaded now.
func (ls *lists) dropStale(remote string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.drop(remote)
}

func (ls *lists) unref(p *peerLists) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if p.refs--; p.refs == 0 && p.dead {
		p.release()
	}
}

// close releases everything (no write in flight).
func (ls *lists) close() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for name := range ls.peers {
		ls.drop(name)
	}
	if ls.self != nil {
		ls.self.release()
		ls.self = nil
	}
}

// indices maps a write onto the prepared lists: the local and remote
// lists and the index pairs, with the reference to release after the
// write. ok is false when the write's shape has no prepared list (an NHD
// slice too large); the caller prepares its own then.
func (ls *lists) indices(w *Write) (l, r *nixl.Prepped, li, ri []int, ref *peerLists, ok bool, err error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	self, err := ls.localLists()
	if err != nil {
		return nil, nil, nil, nil, nil, false, err
	}
	peer, err := ls.peer(w.Remote, w.Peer)
	if err != nil {
		return nil, nil, nil, nil, nil, false, err
	}
	fail := func(format string, args ...any) (*nixl.Prepped, *nixl.Prepped, []int, []int, *peerLists, bool, error) {
		peer.refs--
		if peer.refs == 0 && peer.dead {
			peer.release()
		}
		return nil, nil, nil, nil, nil, false, fmt.Errorf("transfer: "+format, args...)
	}
	local, remote := ls.local, w.Peer
	switch {
	case w.State >= 0:
		if w.State >= len(local.State) || w.State >= len(remote.State) || local.State[w.State].ItemBytes != remote.State[w.State].ItemBytes {
			return fail("state region %d does not match on both sides", w.State)
		}
		for _, run := range w.Runs {
			for k := uint32(0); k < run.Len; k++ {
				if int(run.Src+k) >= kvlayout.Items(local.State[w.State]) || int(run.Dst+k) >= kvlayout.Items(remote.State[w.State]) {
					return fail("state item %d → %d is outside state region %d", run.Src+k, run.Dst+k, w.State)
				}
				li = append(li, self.stateBase[w.State]+int(run.Src+k))
				ri = append(ri, peer.stateBase[w.State]+int(run.Dst+k))
			}
		}
		return self.host, peer.host, li, ri, peer, true, nil
	case w.AuxSrc >= 0:
		if local.AuxItemBytes == 0 || local.AuxItemBytes != remote.AuxItemBytes {
			return fail("aux items of %d and %d bytes", local.AuxItemBytes, remote.AuxItemBytes)
		}
		if w.AuxSrc >= kvlayout.AuxItems(local) || w.AuxDst < 0 || w.AuxDst >= kvlayout.AuxItems(remote) {
			return fail("aux item %d → %d is outside the aux regions (%d, %d items)", w.AuxSrc, w.AuxDst, kvlayout.AuxItems(local), kvlayout.AuxItems(remote))
		}
		return self.host, peer.host, []int{w.AuxSrc}, []int{w.AuxDst} /* aux items open the host list */, peer, true, nil
	case w.Slice != nil && w.Slice.Full:
		return ls.pages(w, self, peer, w.Slice.RegionOffset, fail)
	case w.Slice != nil:
		s := w.Slice
		if s.RegionOffset < 0 || len(local.Regions)+s.RegionOffset > len(remote.Regions) {
			return fail("%d regions at offset %d do not fit the peer's %d", len(local.Regions), s.RegionOffset, len(remote.Regions))
		}
		unit := 0
		if !s.Paged() {
			unit = s.Unit() // pages of different sizes: the runs count units
		}
		whole := unit > 0 && s.Heads == s.SrcHeads && s.Heads == s.DstHeads
		lk := sliceKey{s.SrcHead, s.Heads, s.SrcHeads, s.HeadBytes, s.PageTokens, s.Layout, 0, len(local.Regions), unit, whole}
		rk := sliceKey{s.DstHead, s.Heads, s.DstHeads, s.HeadBytes, s.Pages().Dst, s.Layout, s.RegionOffset, len(local.Regions), unit, whole}
		lsl, err := self.slice(ls.agent, "", local, lk)
		if err != nil {
			return fail("%v", err)
		}
		rsl, err := peer.slice(ls.agent, w.Remote, remote, rk)
		if err != nil {
			return fail("%v", err)
		}
		if lsl.l == nil || rsl.l == nil {
			peer.refs--
			if peer.refs == 0 && peer.dead {
				peer.release()
			}
			return nil, nil, nil, nil, nil, false, nil
		}
		// A run unit's pieces: a page's (same page sizes), or the unit's
		// inside its page.
		sPer, dPer := 1, 1
		if unit > 0 {
			sPer, dPer = s.PageTokens/unit, s.Pages().Dst/unit
		}
		m := lsl.perUnit
		rlo, rhi := w.Layers.Regions(len(local.Regions))
		for i := rlo; i < rhi; i++ {
			for _, run := range w.Runs {
				for k := uint32(0); k < run.Len; k++ {
					su, du := int(run.Src+k), int(run.Dst+k)
					if su/sPer >= self.pages || du/dPer >= peer.pages {
						return fail("unit %d → %d is outside the regions (%d, %d pages)", su, du, self.pages, peer.pages)
					}
					lb := (i*self.pages+su/sPer)*lsl.pieces + su%sPer*m
					rb := (i*peer.pages+du/dPer)*rsl.pieces + du%dPer*m
					for t := 0; t < m; t++ {
						li, ri = append(li, lb+t), append(ri, rb+t)
					}
				}
			}
		}
		return lsl.l, rsl.l, li, ri, peer, true, nil
	}
	return ls.pages(w, self, peer, 0, fail)
}

// pages maps whole pages of every local region onto the peer's regions
// from offset on.
func (ls *lists) pages(w *Write, self *sideLists, peer *peerLists, offset int,
	fail func(string, ...any) (*nixl.Prepped, *nixl.Prepped, []int, []int, *peerLists, bool, error)) (*nixl.Prepped, *nixl.Prepped, []int, []int, *peerLists, bool, error) {
	local, remote := ls.local, w.Peer
	if offset < 0 || len(local.Regions)+offset > len(remote.Regions) {
		return fail("%d regions at offset %d do not fit the peer's %d", len(local.Regions), offset, len(remote.Regions))
	}
	if local.PageBytes != remote.PageBytes {
		return fail("pages of %d and %d bytes", local.PageBytes, remote.PageBytes)
	}
	var n int
	for _, run := range w.Runs {
		n += int(run.Len)
	}
	rlo, rhi := w.Layers.Regions(len(local.Regions))
	li, ri := make([]int, 0, n*(rhi-rlo)), make([]int, 0, n*(rhi-rlo))
	for i := rlo; i < rhi; i++ {
		for _, run := range w.Runs {
			if int(run.Src+run.Len) > self.pages || int(run.Dst+run.Len) > peer.pages {
				return fail("pages %d+%d → %d+%d are outside the regions (%d, %d pages)", run.Src, run.Len, run.Dst, run.Len, self.pages, peer.pages)
			}
			lb, rb := i*self.pages+int(run.Src), (i+offset)*peer.pages+int(run.Dst)
			for k := 0; k < int(run.Len); k++ {
				li, ri = append(li, lb+k), append(ri, rb+k)
			}
		}
	}
	return self.kv, peer.kv, li, ri, peer, true, nil
}
