package kvlayout

import (
	"testing"

	"github.com/kvbridge/kvbridge/internal/mem"
	"github.com/stretchr/testify/require"
)

// TestTailsStayInside: units past the regions' pages (a REQUEST naming a
// page out of range, which the prefill rank refuses) give no tail, with or
// without a slice: the decode rank plants and reads only inside its own
// registered memory. Without a slice a tail ends each whole page.
func TestTailsStayInside(t *testing.T) {
	dst := Layout{Kind: mem.DRAM, PageBytes: 64, Regions: []mem.Desc{{Addr: 1 << 20, Len: 4 * 64}, {Addr: 2 << 20, Len: 4 * 64}}}
	require.Equal(t, []uint64{1<<20 + 64 - 8, 1<<20 + 4*64 - 8, 2<<20 + 64 - 8, 2<<20 + 4*64 - 8},
		Tails(dst, nil, -1, 9, []uint32{0, 3, 4, 1 << 31}, nil), "pages 0 and 3 of both regions; 4 and 2³¹ are out of range")
	s := &Slice{Heads: 2, SrcHeads: 2, DstHeads: 4, DstHead: 2, HeadBytes: 4, PageTokens: 2, DstPageTokens: 4, Layout: HND}
	for _, a := range Tails(dst, s, 0, 2, []uint32{0, 1, 6, 7, 8, 9, 1 << 31}, nil) {
		in := false
		for _, r := range dst.Regions {
			in = in || a >= uint64(r.Addr) && a+TailBytes <= uint64(r.Addr)+r.Len
		}
		require.True(t, in, "tail %#x outside the regions", a)
	}
	require.Len(t, Tails(dst, s, 0, 2, []uint32{8, 9, 1 << 31}, nil), 0, "units of page 4 and past: none")
}

// TestWrittenUnitsPast32Bits: a destination page whose units pass 32 bits
// (a page number out of any layout, ×4 units a page) gives no unit, not
// one wrapped onto page 0's.
func TestWrittenUnitsPast32Bits(t *testing.T) {
	pm := PageMap{Src: 2, Dst: 8}
	require.Empty(t, WrittenUnits(pm, []uint32{1 << 30}, 0, 1, false, nil))
	require.Equal(t, []uint32{4, 5, 6, 7, 8}, WrittenUnits(pm, []uint32{1, 2, 1 << 30}, 0, 2, true, nil), "the last chunk's last page: its first unit")
	require.Equal(t, []uint32{4, 5, 6, 7}, WrittenUnits(pm, []uint32{1, 2}, 0, 1, false, nil))
	require.Equal(t, []uint32{4, 5, 6, 7, 8}, WrittenUnits(pm, []uint32{1, 2}, -1, 9, true, nil), "positions outside dst left out")
}
