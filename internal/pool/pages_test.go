package pool

import (
	"testing"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/stretchr/testify/require"
)

// TestPoolPagesOfDifferentSizes: the pool writes a room between pages of
// different sizes (both ways, HND and NHD, all heads and a head slice) in
// units of the smaller page, as PageMap pairs them — through the prepared
// per-unit lists, and through lists made for the write (a shape with more
// pieces than the prepared lists hold): every token's heads land in the
// decode page and slot the room's token maps to, and nothing else in the
// decode regions changes. A unit past the peer's pages is refused before
// anything is posted.
func TestPoolPagesOfDifferentSizes(t *testing.T) {
	for _, lists := range []string{"prepared", "own"} {
		t.Run(lists, func(t *testing.T) {
			if lists == "own" {
				maxSlicePieces = 0
				defer func() { maxSlicePieces = MaxPreparedDescs }()
			}
			poolPagesOfDifferentSizes(t)
		})
	}
}

func poolPagesOfDifferentSizes(t *testing.T) {
	const layers, pages, headBytes = 2, 16, 8
	for _, tc := range []struct {
		name           string
		srcTok, dstTok int
		layout         PageLayout
		srcHeads       int // the prefill rank's heads (2: all; 4: decode gets its last two)
		dstHeads       int // the decode rank's heads (2: all; 4: the two written are its last two)
	}{
		{"prefill 4, decode 16, HND", 4, 16, HND, 2, 2},
		{"prefill 4, decode 16, NHD", 4, 16, NHD, 2, 2},
		{"prefill 16, decode 4, HND", 16, 4, HND, 2, 2},
		{"prefill 16, decode 4, NHD, head slice", 16, 4, NHD, 4, 2},
		{"prefill 2, decode 8, HND, head slice", 2, 8, HND, 4, 2},
		{"prefill 4, decode 8, NHD, into a head slice", 4, 8, NHD, 2, 4},
		{"prefill 8, decode 2, HND, into a head slice", 8, 2, HND, 2, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const heads = 2 // written
			srcHead, dstHead := tc.srcHeads-heads, tc.dstHeads-heads
			dstHeads := tc.dstHeads
			sl := &Slice{SrcHead: srcHead, DstHead: dstHead, Heads: heads, SrcHeads: tc.srcHeads, DstHeads: dstHeads, HeadBytes: headBytes,
				PageTokens: tc.srcTok, DstPageTokens: tc.dstTok, Layout: tc.layout}
			p := newRank(t, "tpg-prefill", layers, pages, uint64(tc.srcTok*tc.srcHeads*headBytes))
			d := newRank(t, "tpg-decode", layers, pages, uint64(tc.dstTok*dstHeads*headBytes))
			remote := connect(t, p, d)
			// at is where head h of slot tok of a page sits.
			at := func(tok, heads, h, pageTok int) int {
				if tc.layout == HND {
					return (h*pageTok + tok) * headBytes
				}
				return (tok*heads + h) * headBytes
			}
			// A room of 30 tokens: prefill pages in a shuffled order,
			// decode's likewise; every byte of prefill tells its region,
			// head and room token.
			const tokens = 30
			src := []uint32{15, 3, 4, 9, 0, 1, 2, 7, 8, 10, 5, 6, 11, 12, 13, 14}[:(tokens+tc.srcTok-1)/tc.srcTok]
			dst := []uint32{6, 2, 3, 11, 12, 0, 1, 8, 9, 10, 4, 5, 7, 13, 14, 15}[:(tokens+tc.dstTok-1)/tc.dstTok]
			pb := p.layout.PageBytes
			for r := range p.kv {
				for q, pg := range src {
					for tok := 0; tok < tc.srcTok; tok++ {
						for h := 0; h < tc.srcHeads; h++ {
							o := uint64(pg)*pb + uint64(at(tok, tc.srcHeads, h, tc.srcTok))
							for b := 0; b < headBytes; b++ {
								p.kv[r][o+uint64(b)] = byte(r*61 + h*17 + (q*tc.srcTok+tok)*3 + b)
							}
						}
					}
				}
			}
			for r := range d.kv {
				for k := range d.kv[r] {
					d.kv[r][k] = 0xEE
				}
			}
			pool, err := NewPool(p.agent, p.layout, Config{Workers: 1})
			require.NoError(t, err)
			defer pool.Close()
			s, dd, _, _, err := sl.Pages().Pair(0, src, 0, dst)
			require.NoError(t, err)
			done := make(chan error, 1)
			submit := func(runs []Run) error {
				if err := pool.Submit(Job{Room: 1, Writes: []Write{{Remote: remote, Peer: d.layout, Runs: runs, AuxSrc: -1, State: -1, Slice: sl}},
					Gate: func(*Write) bool { return true },
					Done: func(_ *Write, err error, _ bool) { done <- err }}); err != nil {
					return err
				}
				return <-done
			}
			require.NoError(t, submit(kvlayout.Runs(s, dd)))
			dpb := d.layout.PageBytes
			covered := make([][]bool, len(d.kv))
			for r := range d.kv {
				covered[r] = make([]bool, len(d.kv[r]))
				for i, pg := range dst {
					for tok := 0; tok < tc.dstTok; tok++ {
						v := i*tc.dstTok + tok // the room's token
						for h := 0; h < heads; h++ {
							o := uint64(pg)*dpb + uint64(at(tok, dstHeads, dstHead+h, tc.dstTok))
							for b := 0; b < headBytes; b++ {
								covered[r][o+uint64(b)] = true
								if want := byte(r*61 + (srcHead+h)*17 + v*3 + b); v < tokens && d.kv[r][o+uint64(b)] != want {
									t.Fatalf("region %d decode page %d slot %d head %d byte %d (room token %d): %#x, want %#x", r, pg, tok, h, b, v, d.kv[r][o+uint64(b)], want)
								}
							}
						}
					}
				}
				for k, c := range covered[r] {
					if !c && d.kv[r][k] != 0xEE {
						t.Fatalf("region %d byte %d outside the room's pages written", r, k)
					}
				}
			}
			// One unit past the decode regions' pages.
			units := uint32(pages * max(tc.dstTok/tc.srcTok, 1))
			require.ErrorContains(t, submit([]Run{{Src: 0, Dst: units, Len: 1}}), "outside the regions", "a unit past the peer's pages")
		})
	}
}
