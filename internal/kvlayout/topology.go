package kvlayout

import (
	"fmt"

	"github.com/kvbridge/kvbridge/internal/mem"
	"github.com/kvbridge/kvbridge/transfer"
)

// The rank mapping: which prefill ranks a decode rank pulls a room from,
// which heads and layers each writes, which one writes aux — SGLang's rules
// for heterogeneous TP, replicated KV heads, MLA, PP and DP attention. It is
// pure arithmetic: the decode rank computes its links from the prefill
// instance's topology, the prefill rank computes each write's slice from
// the decode rank's REGISTER, and both arrive at the same answer.

// The model and placement types are package transfer's (public, so go
// doc shows their fields); kvlayout works on them.
type (
	PageLayout = transfer.PageLayout
	Model      = transfer.Model
	Parallel   = transfer.Parallel
)

// Page layouts and the regions of a layer: transfer's.
const (
	NHD             = transfer.NHD
	HND             = transfer.HND
	RegionsPerLayer = transfer.RegionsPerLayer
)

// ParsePageLayout: transfer.ParsePageLayout.
func ParsePageLayout(s string) (PageLayout, error) { return transfer.ParsePageLayout(s) }

// Link is one prefill rank (of the room's DP group) a decode rank pulls a
// room from.
type Link struct {
	TPRank, PPRank int
	// Dummy: the rank writes nothing for this decode rank (its heads come
	// from a lower rank, or MLA's latent from one rank only); it still gets
	// a REQUEST (every prefill rank serves every room of its group) and
	// sends its notifications.
	Dummy bool
	// FirstHead, Heads: the global heads it writes.
	FirstHead, Heads int
	// Aux: it writes the aux item and the state items (exactly one link
	// of a decode rank, on the last prefill stage).
	Aux bool
	// Required is how many decode ranks' REQUESTs that prefill rank waits
	// for.
	Required int
}

// ErrTopology: transfer.ErrTopology.
var ErrTopology = transfer.ErrTopology

// stages returns the prefill PP stages a decode stage pulls from.
func stages(prefillPP, decodePP, decodeStage int) ([]int, error) {
	switch {
	case prefillPP == decodePP:
		return []int{decodeStage}, nil
	case decodePP == 1:
		s := make([]int, prefillPP)
		for i := range s {
			s[i] = i
		}
		return s, nil
	}
	return nil, fmt.Errorf("%w: prefill PP %d → decode PP %d (decode PP must equal prefill PP, or be 1)", ErrTopology, prefillPP, decodePP)
}

// contact returns the prefill TP ranks [first, first+n) decode TP rank d
// sends REQUESTs to, and how many decode ranks each of them waits for.
func contact(prefillTP, decodeTP, d int) (first, n, required int, err error) {
	switch {
	case prefillTP >= decodeTP && prefillTP%decodeTP == 0:
		r := prefillTP / decodeTP
		return d * r, r, 1, nil
	case prefillTP < decodeTP && decodeTP%prefillTP == 0:
		r := decodeTP / prefillTP
		return d / r, 1, r, nil
	}
	return 0, 0, 0, fmt.Errorf("%w: prefill TP %d → decode TP %d (one must divide the other)", ErrTopology, prefillTP, decodeTP)
}

// written returns the global heads [first, first+n) prefill TP rank p
// writes into decode TP rank d: the heads of d that p holds and that no
// lower rank of d's contact set holds (a replicated head is written once).
func written(m Model, prefillTP, p, decodeTP, d int) (first, n int, err error) {
	cFirst, cN, _, err := contact(prefillTP, decodeTP, d)
	if err != nil {
		return 0, 0, err
	}
	if p < cFirst || p >= cFirst+cN {
		return 0, 0, fmt.Errorf("%w: prefill TP rank %d is not among decode TP rank %d's prefill ranks [%d, %d)", ErrTopology, p, d, cFirst, cFirst+cN)
	}
	dFirst, dN, err := m.Heads(decodeTP, d)
	if err != nil {
		return 0, 0, err
	}
	pFirst, pN, err := m.Heads(prefillTP, p)
	if err != nil {
		return 0, 0, err
	}
	lo, hi := max(dFirst, pFirst), min(dFirst+dN, pFirst+pN)
	for q := cFirst; q < p && lo < hi; q++ {
		qFirst, qN, _ := m.Heads(prefillTP, q)
		if qFirst <= lo && qFirst+qN > lo {
			lo = min(qFirst+qN, hi) // lower ranks hold lower heads: they cover a prefix hold lower heads: they cover a prefix
		}
	}
	if lo >= hi {
		return 0, 0, nil
	}
	return lo, hi - lo, nil
}

// Links maps a decode rank onto a prefill instance (only its sizes are
// read) for one room.
func Links(m Model, prefill, decode Parallel) ([]Link, error) {
	prefill, decode = prefill.Norm(), decode.Norm()
	if err := ValidateModel(m); err != nil {
		return nil, err
	}
	if err := decode.Validate(); err != nil {
		return nil, err
	}
	sts, err := stages(prefill.PPSize, decode.PPSize, decode.PPRank)
	if err != nil {
		return nil, err
	}
	cFirst, cN, required, err := contact(prefill.TPSize, decode.TPSize, decode.TPRank)
	if err != nil {
		return nil, err
	}
	var links []Link
	for _, s := range sts {
		for p := cFirst; p < cFirst+cN; p++ {
			h0, hn, err := written(m, prefill.TPSize, p, decode.TPSize, decode.TPRank)
			if err != nil {
				return nil, err
			}
			links = append(links, Link{TPRank: p, PPRank: s, Dummy: hn == 0, FirstHead: h0, Heads: hn, Required: required})
		}
	}
	// Aux and state: the lowest real TP rank of the last prefill stage —
	// when this decode rank pulls from that stage.
	for i := range links {
		if links[i].PPRank == prefill.PPSize-1 && !links[i].Dummy {
			links[i].Aux = true
			break
		}
	}
	return links, nil
}

// Slice is what one prefill rank writes into one decode rank's pages: a
// range of heads (local offsets on each side) over the prefill rank's
// regions, into the decode rank's regions shifted by RegionOffset.
//
// When the two sides' pages hold different numbers of tokens
// (DstPageTokens ≠ PageTokens), a write's runs count units of the smaller
// page instead of pages (MapPages makes them): unit u of a side lies in
// its page u / (its page tokens / Unit()), at token (u mod that) × Unit().
type Slice struct {
	// Full: whole pages (both ranks hold exactly the heads written, in pages
	// of the same size): contiguous runs of pages stay one segment.
	Full               bool
	SrcHead, DstHead   int // first written head, local to each side
	Heads              int // heads written
	SrcHeads, DstHeads int // heads per token on each side (page geometry)
	HeadBytes          int
	PageTokens         int // tokens per page on the prefill side
	DstPageTokens      int // tokens per page on the decode side (0: PageTokens)
	Layout             PageLayout
	RegionOffset       int // remote region = local region + RegionOffset
}

// dstTokens is the decode side's tokens per page.
func (s *Slice) dstTokens() int {
	if s.DstPageTokens == 0 {
		return s.PageTokens
	}
	return s.DstPageTokens
}

// Pages is the slice's page map: prefill page tokens to decode's.
func (s *Slice) Pages() PageMap { return PageMap{Src: s.PageTokens, Dst: s.dstTokens()} }

// Paged reports whether the write's runs count pages (both sides' pages
// hold the same tokens); otherwise they count units of Unit() tokens.
func (s *Slice) Paged() bool { return s.dstTokens() == s.PageTokens }

// Unit is the tokens of one run unit: the smaller side's page.
func (s *Slice) Unit() int { return min(s.PageTokens, s.dstTokens()) }

// PageRatio checks that two page sizes (tokens per page) can be mapped
// onto each other: one divides the other.
func PageRatio(prefill, decode int) error {
	if prefill < 1 || decode < 1 || (prefill%decode != 0 && decode%prefill != 0) {
		return fmt.Errorf("%w: prefill pages of %d tokens, decode pages of %d (one must divide the other)", ErrTopology, prefill, decode)
	}
	return nil
}

// Plan computes what prefill rank p, holding model src, writes into decode
// rank d, holding model dst (nil for a dummy: nothing). The two models must
// be the same but for their page tokens, and one page size must divide the
// other.
func Plan(src, dst Model, p, d Parallel) (*Slice, error) {
	p, d = p.Norm(), d.Norm()
	m := src
	if err := ValidateModel(m); err != nil {
		return nil, err
	}
	if WithPages(src, dst.PageTokens) != dst {
		return nil, fmt.Errorf("%w: models differ beyond their page tokens: prefill %+v, decode %+v", ErrTopology, src, dst)
	}
	if err := PageRatio(src.PageTokens, dst.PageTokens); err != nil {
		return nil, err
	}
	sts, err := stages(p.PPSize, d.PPSize, d.PPRank)
	if err != nil {
		return nil, err
	}
	inStage := false
	for _, s := range sts {
		inStage = inStage || s == p.PPRank
	}
	if !inStage {
		return nil, fmt.Errorf("%w: prefill stage %d does not feed decode stage %d", ErrTopology, p.PPRank, d.PPRank)
	}
	h0, hn, err := written(m, p.TPSize, p.TPRank, d.TPSize, d.TPRank)
	if err != nil || hn == 0 {
		return nil, err
	}
	pFirst, pN, _ := m.Heads(p.TPSize, p.TPRank)
	dFirst, dN, _ := m.Heads(d.TPSize, d.TPRank)
	pl, _ := m.StageLayers(p.PPSize, p.PPRank)
	dl, _ := m.StageLayers(d.PPSize, d.PPRank)
	s := &Slice{Full: hn == pN && hn == dN && src.PageTokens == dst.PageTokens, SrcHead: h0 - pFirst, DstHead: h0 - dFirst, Heads: hn,
		SrcHeads: pN, DstHeads: dN, HeadBytes: m.HeadBytes, PageTokens: src.PageTokens, Layout: m.Layout,
		RegionOffset: (pl - dl) * RegionsPerLayer}
	if dst.PageTokens != src.PageTokens {
		s.DstPageTokens = dst.PageTokens
	}
	return s, nil
}

// CheckLayouts verifies that a prefill and a decode layout fit their
// models and shapes: regions per stage layer, page bytes per TP size and
// page tokens.
func CheckLayouts(pm Model, p Parallel, pl Layout, dm Model, d Parallel, dl Layout) error {
	p, d = p.Norm(), d.Norm()
	for _, side := range []struct {
		name string
		m    Model
		par  Parallel
		lay  Layout
	}{{"prefill", pm, p, pl}, {"decode", dm, d, dl}} {
		_, layers := side.m.StageLayers(side.par.PPSize, side.par.PPRank)
		if len(side.lay.Regions) != layers*RegionsPerLayer {
			return fmt.Errorf("%s (%v) has %d regions, its %d layers need %d", side.name, side.par, len(side.lay.Regions), layers, layers*RegionsPerLayer)
		}
		want, err := side.m.PageBytes(side.par.TPSize)
		if err != nil {
			return err
		}
		if side.lay.PageBytes != want {
			return fmt.Errorf("%s (%v) has %d-byte pages, the model at TP %d with %d-token pages needs %d", side.name, side.par, side.lay.PageBytes, side.par.TPSize, side.m.PageTokens, want)
		}
	}
	return nil
}

// CheckRuns verifies that every unit of runs lies in a page of each side's
// regions (local.Pages(), remote.Pages()) and that the local regions, at
// the slice's offset, fit the remote's: ExpandSlice's input is then inside
// the registered memory.
func CheckRuns(runs []Run, local, remote Layout, s *Slice) error {
	if s.RegionOffset < 0 || len(local.Regions)+s.RegionOffset > len(remote.Regions) {
		return fmt.Errorf("transfer: %d regions at offset %d do not fit the peer's %d", len(local.Regions), s.RegionOffset, len(remote.Regions))
	}
	unit := s.Unit()
	sPer, dPer := uint64(s.PageTokens/unit), uint64(s.dstTokens()/unit)
	for _, run := range runs {
		if run.Len == 0 {
			continue
		}
		// Units only grow along a run: its last unit is its furthest.
		ls, ld := uint64(run.Src)+uint64(run.Len)-1, uint64(run.Dst)+uint64(run.Len)-1
		if ls/sPer >= uint64(Pages(local)) || ld/dPer >= uint64(Pages(remote)) {
			return fmt.Errorf("transfer: units %d+%d → %d+%d are outside the regions (%d, %d pages of %d and %d tokens)",
				run.Src, run.Len, run.Dst, run.Len, Pages(local), Pages(remote), s.PageTokens, s.dstTokens())
		}
	}
	return nil
}

// ExpandSlice turns runs into descriptor pairs for a head slice: for each
// local region, for each page (or unit, when the page sizes differ), one
// segment per head (HND) or per token (NHD); segments contiguous on both
// sides are merged, so a Full slice of contiguous pages is one descriptor
// per run per region, as Expand makes.
func ExpandSlice(runs []Run, local, remote Layout, s *Slice) (l, r []mem.Desc) {
	hb := uint64(s.HeadBytes)
	add := func(ld, rd mem.Desc) {
		if n := len(l); n > 0 && l[n-1].Addr+uintptr(l[n-1].Len) == ld.Addr && r[n-1].Addr+uintptr(r[n-1].Len) == rd.Addr &&
			l[n-1].Dev == ld.Dev && r[n-1].Dev == rd.Dev {
			l[n-1].Len += ld.Len
			r[n-1].Len += rd.Len
			return
		}
		l, r = append(l, ld), append(r, rd)
	}
	// A run unit of each side: its page, and the token it starts at.
	unit, sTok, dTok := s.Unit(), s.PageTokens, s.dstTokens()
	sPer, dPer := uint32(sTok/unit), uint32(dTok/unit)
	for i, lr := range local.Regions {
		rr := remote.Regions[i+s.RegionOffset]
		for _, run := range runs {
			for k := uint32(0); k < run.Len; k++ {
				su, du := run.Src+k, run.Dst+k
				lp := lr.Addr + uintptr(uint64(su/sPer)*local.PageBytes)
				rp := rr.Addr + uintptr(uint64(du/dPer)*remote.PageBytes)
				st, dt := int(su%sPer)*unit, int(du%dPer)*unit
				switch {
				case s.Full:
					add(mem.Desc{Addr: lp, Len: local.PageBytes, Dev: lr.Dev}, mem.Desc{Addr: rp, Len: remote.PageBytes, Dev: rr.Dev})
				case s.Layout == HND:
					// For each head, its unit of tokens.
					n := uint64(unit) * hb
					for h := 0; h < s.Heads; h++ {
						add(mem.Desc{Addr: lp + uintptr((uint64((s.SrcHead+h)*sTok+st))*hb), Len: n, Dev: lr.Dev},
							mem.Desc{Addr: rp + uintptr((uint64((s.DstHead+h)*dTok+dt))*hb), Len: n, Dev: rr.Dev})
					}
				default: // NHD: for each token, its heads.
					n := uint64(s.Heads) * hb
					for t := 0; t < unit; t++ {
						add(mem.Desc{Addr: lp + uintptr((uint64((st+t)*s.SrcHeads+s.SrcHead))*hb), Len: n, Dev: lr.Dev},
							mem.Desc{Addr: rp + uintptr((uint64((dt+t)*s.DstHeads+s.DstHead))*hb), Len: n, Dev: rr.Dev})
					}
				}
			}
		}
	}
	return l, r
}
