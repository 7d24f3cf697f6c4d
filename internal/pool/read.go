package pool

import (
	"fmt"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/nixl"
)

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
	case s != nil:
		sl := *s
		rlo, rhi := w.Layers.Regions(len(src.Regions))
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
	rlo, rhi := w.Layers.Regions(len(src.Regions))
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
