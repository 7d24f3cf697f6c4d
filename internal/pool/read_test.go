package pool

import (
	"testing"

	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadPairs: the descriptor pairs a pulling decode rank reads, for
// each kind of write (pages over a layer range, a head slice of pages of
// different sizes, the aux item, state items), and the refusal of every
// piece outside either side's regions — a prefill rank's PAGES names its
// own pages, and a read of a page it does not have, or into one the decode
// rank does not have, must never be posted.
func TestReadPairs(t *testing.T) {
	const pageBytes, pages = 64, 8
	mk := func(base uintptr, regions int) Layout {
		l := Layout{Kind: nixl.DRAM, PageBytes: pageBytes, AuxItemBytes: 16, Aux: nixl.Desc{Addr: base + 0x100000, Len: 16 * 4},
			State: []StateRegion{{Desc: nixl.Desc{Addr: base + 0x200000, Len: 32 * 4}, ItemBytes: 32}}}
		for r := range regions {
			l.Regions = append(l.Regions, nixl.Desc{Addr: base + uintptr(r)*0x10000, Len: pages * pageBytes})
		}
		return l
	}
	src, dst := mk(0x10000000, 4), mk(0x20000000, 4)

	// Pages of layer 1 (regions 2 and 3), two runs.
	s, d, err := ReadPairs(&Write{Runs: []Run{{Src: 1, Dst: 6, Len: 2}, {Src: 7, Dst: 0, Len: 1}}, Layers: Layers{Lo: 1, Hi: 2}, AuxSrc: -1, State: -1}, src, dst, nil)
	require.NoError(t, err)
	want := [][2]nixl.Desc{
		{{Addr: 0x10020000 + 64, Len: 128}, {Addr: 0x20020000 + 6*64, Len: 128}},
		{{Addr: 0x10020000 + 7*64, Len: 64}, {Addr: 0x20020000, Len: 64}},
		{{Addr: 0x10030000 + 64, Len: 128}, {Addr: 0x20030000 + 6*64, Len: 128}},
		{{Addr: 0x10030000 + 7*64, Len: 64}, {Addr: 0x20030000, Len: 64}},
	}
	require.Len(t, s, len(want), "source pieces")
	require.Len(t, d, len(want), "destination pieces")
	for i, w := range want {
		require.Equal(t, w[0], s[i], "piece %d: source", i)
		require.Equal(t, w[1], d[i], "piece %d: destination", i)
	}
	// The aux item and state items.
	s, d, err = ReadPairs(&Write{AuxSrc: 3, AuxDst: 1, State: -1}, src, dst, nil)
	require.NoError(t, err, "aux")
	require.EqualValues(t, 0x10100000+48, s[0].Addr, "aux: %+v %+v", s, d)
	require.EqualValues(t, 0x20100000+16, d[0].Addr, "aux: %+v %+v", s, d)
	require.EqualValues(t, 16, s[0].Len, "aux: %+v %+v", s, d)
	s, d, err = ReadPairs(&Write{Runs: []Run{{Src: 2, Dst: 0, Len: 2}}, AuxSrc: -1, State: 0}, src, dst, nil)
	require.NoError(t, err, "state")
	require.Len(t, s, 2, "state: %+v %+v", s, d)
	require.EqualValues(t, 0x10200000+96, s[1].Addr, "state: %+v %+v", s, d)
	require.EqualValues(t, 0x20200000+32, d[1].Addr, "state: %+v %+v", s, d)
	// A head slice of pages of different sizes (prefill 4 tokens, decode
	// 8), HND: checked by the rank mapping's bounds.
	sl := &Slice{Heads: 2, SrcHeads: 2, DstHeads: 2, HeadBytes: 8, PageTokens: 4, DstPageTokens: 8, Layout: HND}
	sl4, dl8 := mk(0x30000000, 2), mk(0x40000000, 2)
	dl8.PageBytes = 128
	for r := range dl8.Regions {
		dl8.Regions[r].Len = pages * 128
	}
	_, _, err = ReadPairs(&Write{Runs: []Run{{Src: 0, Dst: 3, Len: 2}}, AuxSrc: -1, State: -1}, sl4, dl8, sl)
	require.NoError(t, err, "slice")

	// Every piece outside a side's regions is refused.
	for _, tc := range []struct {
		name string
		w    Write
		s    *Slice
		want string
	}{
		{"a source page past the regions", Write{Runs: []Run{{Src: 7, Dst: 0, Len: 2}}, AuxSrc: -1, State: -1}, nil, "outside the regions"},
		{"a destination page past the regions", Write{Runs: []Run{{Src: 0, Dst: 8, Len: 1}}, AuxSrc: -1, State: -1}, nil, "outside the regions"},
		{"an aux item past the source's", Write{AuxSrc: 4, AuxDst: 0, State: -1}, nil, "outside the aux regions"},
		{"an aux item past the destination's", Write{AuxSrc: 0, AuxDst: 4, State: -1}, nil, "outside the aux regions"},
		{"a state item past the region", Write{Runs: []Run{{Src: 3, Dst: 0, Len: 2}}, AuxSrc: -1, State: 0}, nil, "outside state region 0"},
		{"a state region neither side has", Write{Runs: []Run{{Src: 0, Dst: 0, Len: 1}}, AuxSrc: -1, State: 1}, nil, "does not match"},
		{"a unit past the destination's pages", Write{Runs: []Run{{Src: 0, Dst: 16, Len: 1}}, AuxSrc: -1, State: -1}, sl, "outside"},
	} {
		l, r := src, dst
		if tc.s != nil {
			l, r = sl4, dl8
		}
		s, d, err := ReadPairs(&tc.w, l, r, tc.s)
		assert.ErrorContains(t, err, tc.want, "%s", tc.name)
		assert.Nil(t, s, "%s: want nothing to read", tc.name)
		assert.Nil(t, d, "%s: want nothing to read", tc.name)
	}
}
