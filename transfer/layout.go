package transfer

import (
	"fmt"

	"github.com/kvbridge/kvbridge/nixl"
)

// Layout is one rank's registered KV memory: Regions[i] is layer i/2, K for
// even i and V for odd i, each a run of pages of PageBytes bytes.
type Layout struct {
	Kind      nixl.MemKind
	Regions   []nixl.Desc // one per layer and K/V, in layer order, K before V
	PageBytes uint64
	// Aux holds per-request auxiliary items (AuxItemBytes each).
	Aux          nixl.Desc
	AuxItemBytes uint64
	// State regions hold per-request state items (e.g. a hybrid model's
	// recurrent state), written with the last chunk. Host memory.
	State []StateRegion
}

// StateRegion is one state region of ItemBytes-sized items.
type StateRegion struct {
	nixl.Desc
	ItemBytes uint64
}

// Items is how many items the region holds.
func (s StateRegion) Items() int {
	if s.ItemBytes == 0 {
		return 0
	}
	return int(s.Len / s.ItemBytes)
}

// Pages is how many pages each region holds.
func (l Layout) Pages() int {
	if len(l.Regions) == 0 || l.PageBytes == 0 {
		return 0
	}
	return int(l.Regions[0].Len / l.PageBytes)
}

// AuxItems is how many aux items the aux region holds.
func (l Layout) AuxItems() int {
	if l.AuxItemBytes == 0 {
		return 0
	}
	return int(l.Aux.Len / l.AuxItemBytes)
}

// Validate checks the layout is usable.
func (l Layout) Validate() error {
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
func Expand(runs []Run, local, remote Layout) (l, r []nixl.Desc) {
	l = make([]nixl.Desc, 0, len(runs)*len(local.Regions))
	r = make([]nixl.Desc, 0, len(runs)*len(local.Regions))
	for i := range local.Regions {
		lr, rr := local.Regions[i], remote.Regions[i]
		for _, run := range runs {
			n := uint64(run.Len) * local.PageBytes
			l = append(l, nixl.Desc{Addr: lr.Addr + uintptr(uint64(run.Src)*local.PageBytes), Len: n, Dev: lr.Dev})
			r = append(r, nixl.Desc{Addr: rr.Addr + uintptr(uint64(run.Dst)*remote.PageBytes), Len: n, Dev: rr.Dev})
		}
	}
	return l, r
}
