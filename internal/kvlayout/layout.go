package kvlayout

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/kvbridge/kvbridge/internal/mem"
	"github.com/kvbridge/kvbridge/transfer"
)

// The layout types are package transfer's (public, so go doc shows their
// fields); kvlayout works on them.
type (
	Layout      = transfer.Layout
	StateRegion = transfer.StateRegion
)

// ProofBytes: transfer.ProofBytes.
const ProofBytes = transfer.ProofBytes

// Span is a byte range [Addr, Addr+Len) of registered memory: host memory
// (DRAM) or device Dev's memory (VRAM).
type Span struct {
	Kind      mem.MemKind
	Dev       uint64
	Addr, Len uint64
}

// End is the first byte past the span (the top of the address space for a
// span that would wrap around it).
func (s Span) End() uint64 {
	if s.Len > math.MaxUint64-s.Addr {
		return math.MaxUint64
	}
	return s.Addr + s.Len
}

// space names the address space the span lies in: host memory is one,
// whatever device number it was registered with; each device's memory is
// its own.
func (s Span) space() (mem.MemKind, uint64) {
	if s.Kind == mem.DRAM {
		return s.Kind, 0
	}
	return s.Kind, s.Dev
}

func (s Span) sameSpace(o Span) bool {
	k, d := s.space()
	ko, do := o.space()
	return k == ko && d == do
}

// Overlap finds two spans that share a byte — the same address space and
// intersecting ranges — and returns their indices (i < j); ok is false
// when no two do. An empty span shares no byte. It sorts a copy of the
// indices: O(n log n) for n spans.
func Overlap(spans []Span) (i, j int, ok bool) {
	idx := make([]int, 0, len(spans))
	for k, s := range spans {
		if s.Len > 0 {
			idx = append(idx, k)
		}
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		ka, da := spans[a].space()
		kb, db := spans[b].space()
		return cmp.Or(cmp.Compare(ka, kb), cmp.Compare(da, db), cmp.Compare(spans[a].Addr, spans[b].Addr))
	})
	// Sorted by space, then start, the spans before the first overlap are
	// disjoint, so the one just before a span ends furthest of them.
	for n := 1; n < len(idx); n++ {
		a, b := spans[idx[n-1]], spans[idx[n]]
		if a.sameSpace(b) && b.Addr < a.End() {
			return min(idx[n-1], idx[n]), max(idx[n-1], idx[n]), true
		}
	}
	return 0, 0, false
}

// Run is a contiguous stretch of pages: Len pages from Src on the prefill
// side to Dst on the decode side.
type Run struct {
	Src, Dst uint32
	Len      uint32
}

// Runs groups page pairs (src[i] → dst[i]) into maximal runs where both
// sides are consecutive, so a contiguous chunk becomes one descriptor per
// region instead of one per page.
func Runs(src, dst []uint32) []Run {
	var out []Run
	for i := 0; i < len(src); i++ {
		if n := len(out); n > 0 {
			r := &out[n-1]
			if src[i] == r.Src+r.Len && dst[i] == r.Dst+r.Len {
				r.Len++
				continue
			}
		}
		out = append(out, Run{Src: src[i], Dst: dst[i], Len: 1})
	}
	return out
}

// Expand turns runs into descriptor pairs over every region: for each
// region, one local and one remote descriptor per run.
func Expand(runs []Run, local, remote Layout) (l, r []mem.Desc) {
	l = make([]mem.Desc, 0, len(runs)*len(local.Regions))
	r = make([]mem.Desc, 0, len(runs)*len(local.Regions))
	for i := range local.Regions {
		lr, rr := local.Regions[i], remote.Regions[i]
		for _, run := range runs {
			n := uint64(run.Len) * local.PageBytes
			l = append(l, mem.Desc{Addr: lr.Addr + uintptr(uint64(run.Src)*local.PageBytes), Len: n, Dev: lr.Dev})
			r = append(r, mem.Desc{Addr: rr.Addr + uintptr(uint64(run.Dst)*remote.PageBytes), Len: n, Dev: rr.Dev})
		}
	}
	return l, r
}

// Items is how many items a state region holds.
func Items(s StateRegion) int {
	if s.ItemBytes == 0 {
		return 0
	}
	return int(s.Len / s.ItemBytes)
}

// Pages is how many pages each of a layout's regions holds.
func Pages(l Layout) int {
	if len(l.Regions) == 0 || l.PageBytes == 0 {
		return 0
	}
	return int(l.Regions[0].Len / l.PageBytes)
}

// AuxItems is how many aux items a layout's aux region holds.
func AuxItems(l Layout) int {
	if l.AuxItemBytes == 0 {
		return 0
	}
	return int(l.Aux.Len / l.AuxItemBytes)
}

// WithPages is the model with pages of n tokens.
func WithPages(m Model, n int) Model {
	m.PageTokens = n
	return m
}

// NoModel reports whether no model was given (then no mapping applies:
// one prefill rank feeds one decode rank with identical layouts).
func NoModel(m Model) bool { return m == Model{} }

// ValidateLayout checks a layout is usable (kvmanager.Config.Validate
// names the field).
func ValidateLayout(l Layout) error {
	switch {
	case len(l.Regions) == 0 || len(l.Regions)%2 != 0:
		return fmt.Errorf("transfer: layout needs K and V regions per layer, got %d regions", len(l.Regions))
	case l.PageBytes == 0:
		return fmt.Errorf("transfer: page size is 0")
	}
	for i, r := range l.Regions {
		if r.Len != l.Regions[0].Len || r.Len%l.PageBytes != 0 {
			return fmt.Errorf("transfer: region %d is %d bytes, want %d (a whole number of %d-byte pages)",
				i, r.Len, l.Regions[0].Len, l.PageBytes)
		}
	}
	for i, st := range l.State {
		if st.ItemBytes == 0 || st.Len%st.ItemBytes != 0 {
			return fmt.Errorf("transfer: state region %d of %d bytes is not a whole number of %d-byte items", i, st.Len, st.ItemBytes)
		}
	}
	if l.AuxItemBytes != 0 && l.Aux.Len%l.AuxItemBytes != 0 {
		return fmt.Errorf("transfer: aux region of %d bytes is not a whole number of %d-byte items", l.Aux.Len, l.AuxItemBytes)
	}
	return nil
}

// ValidateModel checks a model on its own.
func ValidateModel(m Model) error {
	switch {
	case m.Layers < 1 || m.KVHeads < 1 || m.HeadBytes < 1 || m.PageTokens < 1:
		return fmt.Errorf("transfer: model needs layers, KV heads, head bytes and page tokens ≥ 1, got %+v", m)
	case m.MLA && m.KVHeads != 1:
		return fmt.Errorf("transfer: an MLA model has one latent (KV heads 1), got %d", m.KVHeads)
	case m.Layout != NHD && m.Layout != HND:
		return fmt.Errorf("transfer: page layout %v", m.Layout)
	}
	return nil
}
