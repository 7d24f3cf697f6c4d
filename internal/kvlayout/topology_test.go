package kvlayout

import (
	"fmt"
	"testing"

	"github.com/kvbridge/kvbridge/internal/mem"
	"github.com/stretchr/testify/require"
)

func llama(layout PageLayout) Model {
	return Model{Layers: 4, KVHeads: 8, HeadBytes: 16, PageTokens: 4, Layout: layout}
}

// TestLinks is the mapping table: every TP/PP/MLA/replication case of
// SGLang's rules, inputs → which prefill ranks, which heads, which one
// writes aux, how many decode ranks each waits for.
func TestLinks(t *testing.T) {
	mla := Model{Layers: 4, KVHeads: 1, HeadBytes: 32, PageTokens: 4, MLA: true}
	two := Model{Layers: 4, KVHeads: 2, HeadBytes: 16, PageTokens: 4}
	L := func(tp, pp int, dummy bool, h0, hn int, aux bool, req int) Link {
		return Link{TPRank: tp, PPRank: pp, Dummy: dummy, FirstHead: h0, Heads: hn, Aux: aux, Required: req}
	}
	for _, tc := range []struct {
		name            string
		m               Model
		prefill, decode Parallel
		want            []Link
		err             string
	}{
		{"TP equal", llama(NHD), Parallel{TPSize: 2}, Parallel{TPSize: 2, TPRank: 1},
			[]Link{L(1, 0, false, 4, 4, true, 1)}, ""},
		{"TP 2 → 1", llama(NHD), Parallel{TPSize: 2}, Parallel{TPSize: 1},
			[]Link{L(0, 0, false, 0, 4, true, 1), L(1, 0, false, 4, 4, false, 1)}, ""},
		{"TP 4 → 2, rank 1", llama(NHD), Parallel{TPSize: 4}, Parallel{TPSize: 2, TPRank: 1},
			[]Link{L(2, 0, false, 4, 2, true, 1), L(3, 0, false, 6, 2, false, 1)}, ""},
		{"TP 1 → 2, rank 1", llama(NHD), Parallel{TPSize: 1}, Parallel{TPSize: 2, TPRank: 1},
			[]Link{L(0, 0, false, 4, 4, true, 2)}, ""},
		{"TP 2 → 4, rank 3", llama(NHD), Parallel{TPSize: 2}, Parallel{TPSize: 4, TPRank: 3},
			[]Link{L(1, 0, false, 6, 2, true, 2)}, ""},
		{"2 KV heads, TP 1 → 4 (replicated at decode), rank 3", two, Parallel{TPSize: 1}, Parallel{TPSize: 4, TPRank: 3},
			[]Link{L(0, 0, false, 1, 1, true, 4)}, ""},
		{"2 KV heads, TP 4 → 1 (replicated at prefill)", two, Parallel{TPSize: 4}, Parallel{TPSize: 1},
			[]Link{L(0, 0, false, 0, 1, true, 1), L(1, 0, true, 0, 0, false, 1), L(2, 0, false, 1, 1, false, 1), L(3, 0, true, 0, 0, false, 1)}, ""},
		{"2 KV heads, TP 4 → 2, rank 1", two, Parallel{TPSize: 4}, Parallel{TPSize: 2, TPRank: 1},
			[]Link{L(2, 0, false, 1, 1, true, 1), L(3, 0, true, 0, 0, false, 1)}, ""},
		{"MLA TP 2 → 1", mla, Parallel{TPSize: 2}, Parallel{TPSize: 1},
			[]Link{L(0, 0, false, 0, 1, true, 1), L(1, 0, true, 0, 0, false, 1)}, ""},
		{"MLA TP 1 → 2, rank 1", mla, Parallel{TPSize: 1}, Parallel{TPSize: 2, TPRank: 1},
			[]Link{L(0, 0, false, 0, 1, true, 2)}, ""},
		{"MLA TP 2 → 2, rank 1", mla, Parallel{TPSize: 2}, Parallel{TPSize: 2, TPRank: 1},
			[]Link{L(1, 0, false, 0, 1, true, 1)}, ""},
		{"PP 2 → 1", llama(NHD), Parallel{PPSize: 2}, Parallel{},
			[]Link{L(0, 0, false, 0, 8, false, 1), L(0, 1, false, 0, 8, true, 1)}, ""},
		{"PP 2 → 2, stage 0 (no aux: the last stage has it)", llama(NHD), Parallel{PPSize: 2}, Parallel{PPSize: 2},
			[]Link{L(0, 0, false, 0, 8, false, 1)}, ""},
		{"PP 2 → 2, stage 1", llama(NHD), Parallel{PPSize: 2}, Parallel{PPSize: 2, PPRank: 1},
			[]Link{L(0, 1, false, 0, 8, true, 1)}, ""},
		{"PP 2 × TP 2 → 1", llama(NHD), Parallel{PPSize: 2, TPSize: 2}, Parallel{},
			[]Link{L(0, 0, false, 0, 4, false, 1), L(1, 0, false, 4, 4, false, 1), L(0, 1, false, 0, 4, true, 1), L(1, 1, false, 4, 4, false, 1)}, ""},
		{"PP 1 → 2 refused", llama(NHD), Parallel{}, Parallel{PPSize: 2}, nil, "decode PP must equal prefill PP, or be 1"},
		{"PP 2 → 4 refused", llama(NHD), Parallel{PPSize: 2}, Parallel{PPSize: 4}, nil, "decode PP must equal prefill PP, or be 1"},
		{"TP 2 → 3 refused", llama(NHD), Parallel{TPSize: 2}, Parallel{TPSize: 3}, nil, "one must divide the other"},
		{"8 heads over TP 3 refused", llama(NHD), Parallel{TPSize: 3}, Parallel{TPSize: 3}, nil, "do not divide"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Links(tc.m, tc.prefill, tc.decode)
			if tc.err != "" {
				require.Error(t, err, "want an error with %q (%+v)", tc.err, got)
				if tc.name != "8 heads over TP 3 refused" {
					require.ErrorIs(t, err, ErrTopology, "want an error with %q (%+v)", tc.err, got)
				}
				require.True(t, contains(err.Error(), tc.err), "want an error with %q, got %v (%+v)", tc.err, err, got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got, "links")
		})
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// memory is one side's registered memory as a byte array at a fake base
// address, so descriptors can be applied without touching real pointers.
type memory struct {
	base uintptr
	b    []byte
}

func (m *memory) at(d mem.Desc) []byte { return m.b[d.Addr-m.base : d.Addr-m.base+uintptr(d.Len)] }

// rankMem builds a rank's layout over pages pages per region.
func rankMem(m Model, p Parallel, pages int, base uintptr) (Layout, *memory) {
	pb, err := m.PageBytes(p.Norm().TPSize)
	if err != nil {
		panic(err)
	}
	_, layers := m.StageLayers(p.Norm().PPSize, p.PPRank)
	rm := &memory{base: base, b: make([]byte, uint64(layers*RegionsPerLayer*pages)*pb)}
	l := Layout{PageBytes: pb}
	for i := 0; i < layers*RegionsPerLayer; i++ {
		l.Regions = append(l.Regions, mem.Desc{Addr: base + uintptr(uint64(i*pages)*pb), Len: uint64(pages) * pb})
	}
	return l, rm
}

// stamp is the 2-byte pattern of one head of one token: global region,
// global head, token position (mod 256 each, plenty to tell them apart).
func stamp(region, head, pos int) [2]byte {
	return [2]byte{byte(region*31 + head), byte(pos*7 + head*3 + region)}
}

// headAt is where local head h of token t sits in a page.
func headAt(m Model, heads, h, t int) int {
	if m.Layout == HND {
		return (h*m.PageTokens + t) * m.HeadBytes
	}
	return (t*heads + h) * m.HeadBytes
}

// TestSlicesMoveEveryHeadOnce runs each topology's writes over byte
// arrays, for pages of the same size and of different sizes on the two
// sides (both ways), with and without a prefix decode holds and a room
// whose last page is partly filled: every prefill rank fills its heads
// with a pattern of (global layer region, global head, room token); after
// every link's writes — the room sent in two chunks, mapped by PageMap —
// every head of every token of the room in every decode region holds the
// right pattern, written exactly once, and no byte outside the room's
// decode pages was written.
func TestSlicesMoveEveryHeadOnce(t *testing.T) {
	mla := Model{Layers: 4, KVHeads: 1, HeadBytes: 32, PageTokens: 4, MLA: true}
	two := Model{Layers: 4, KVHeads: 2, HeadBytes: 16, PageTokens: 4}
	type topo struct{ ptp, ppp, dtp, dpp int }
	cases := map[string]topo{"TP 1→1": {1, 1, 1, 1}, "TP 2→1": {2, 1, 1, 1}, "TP 1→2": {1, 1, 2, 1}, "TP 4→2": {4, 1, 2, 1},
		"TP 2→4": {2, 1, 4, 1}, "TP 8→1": {8, 1, 1, 1}, "PP 2→1": {1, 2, 1, 1}, "PP 2→2": {1, 2, 1, 2}, "PP 2 TP 2→1": {2, 2, 1, 1}}
	type room struct {
		name           string
		srcTok, dstTok int
		tokens, prefix int // the room's tokens; decode pages it holds
		src, dst       []uint32
		split          int // the first chunk's prefill pages
	}
	rooms := []room{
		// 20 tokens of 4-token pages on both sides, two runs each.
		{"same pages", 4, 4, 20, 0, []uint32{0, 1, 2, 4, 5}, []uint32{3, 4, 5, 0, 1}, 2},
		{"same pages, prefix 2", 4, 4, 20, 2, []uint32{0, 1, 2, 4, 5}, []uint32{5, 0, 1}, 3},
		// Prefill pages of 2 tokens, decode's of 8: 4 prefill pages a decode page.
		{"prefill 2, decode 8", 2, 8, 22, 0, []uint32{11, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, []uint32{2, 0, 1}, 8},
		{"prefill 2, decode 8, prefix 1", 2, 8, 22, 1, []uint32{11, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, []uint32{0, 2}, 4},
		// A decode page more than the room needs: the last chunk's last
		// page is the partial one, not dst's last.
		{"prefill 2, decode 8, a page more than needed", 2, 8, 22, 0, []uint32{11, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, []uint32{2, 0, 1, 3}, 8},
		// Prefill pages of 8 tokens, decode's of 2: the last prefill page overhangs.
		{"prefill 8, decode 2", 8, 2, 21, 0, []uint32{2, 0, 1}, []uint32{1, 2, 3, 4, 0, 5, 6, 7, 8, 9, 10}, 1},
		{"prefill 8, decode 4, prefix 1", 8, 4, 21, 1, []uint32{1, 2, 0}, []uint32{4, 0, 1, 2, 3}, 2},
	}
	for _, model := range []struct {
		name string
		m    Model
	}{{"NHD", llama(NHD)}, {"HND", llama(HND)}, {"2 heads", two}, {"MLA", mla}} {
		for name, tp := range cases {
			for _, rm := range rooms {
				t.Run(model.name+"/"+name+"/"+rm.name, func(t *testing.T) {
					ms, md := model.m, model.m
					ms.PageTokens, md.PageTokens = rm.srcTok, rm.dstTok
					checkSlices(t, ms, md, tp.ptp, tp.ppp, tp.dtp, tp.dpp, rm.tokens, rm.prefix, rm.src, rm.dst, rm.split)
				})
			}
		}
	}
}

// checkSlices is one case of TestSlicesMoveEveryHeadOnce.
func checkSlices(t *testing.T, ms, md Model, ptp, ppp, dtp, dpp, tokens, prefix int, src, dst []uint32, split int) {
	t.Helper()
	const pages = 12
	pm := PageMap{Src: ms.PageTokens, Dst: md.PageTokens}
	require.True(t, pm.Aligned(split), "test case: the first chunk of %d pages does not end on a decode page", split)
	for dRank := 0; dRank < dtp*dpp; dRank++ {
		d := Parallel{TPSize: dtp, TPRank: dRank % dtp, PPSize: dpp, PPRank: dRank / dtp}
		dl, dmem := rankMem(md, d, pages, 1<<40)
		written := make([]int, len(dmem.b))
		links, err := Links(md, Parallel{TPSize: ptp, PPSize: ppp}, d)
		require.NoError(t, err)
		aux := 0
		for _, lk := range links {
			if lk.Aux {
				aux++
			}
			p := Parallel{TPSize: ptp, TPRank: lk.TPRank, PPSize: ppp, PPRank: lk.PPRank}
			pl, pmem := rankMem(ms, p, pages, 1<<30)
			pFirst, pN, _ := ms.Heads(ptp, lk.TPRank)
			pLayer, _ := ms.StageLayers(ppp, lk.PPRank)
			for reg := range pl.Regions {
				for q, pg := range src {
					page := pmem.at(pl.Regions[reg])[uint64(pg)*pl.PageBytes:]
					for h := 0; h < pN; h++ {
						for tok := 0; tok < ms.PageTokens; tok++ {
							s := stamp(pLayer*RegionsPerLayer+reg, pFirst+h, q*ms.PageTokens+tok)
							off := headAt(ms, pN, h, tok)
							for b := 0; b < ms.HeadBytes; b++ {
								page[off+b] = s[b%2]
							}
						}
					}
				}
			}
			sl, err := Plan(ms, md, p, d)
			require.NoError(t, err)
			require.Equal(t, lk.Dummy, sl == nil, "link %+v: plan %+v", lk, sl)
			if sl == nil {
				continue
			}
			require.NoError(t, CheckLayouts(ms, p, pl, md, d, dl))
			var descs int
			for _, c := range [][2]int{{0, split}, {split, len(src)}} {
				s, dd, off, n, err := pm.Pair(c[0], src[c[0]:c[1]], prefix, dst)
				require.NoError(t, err)
				ld, rd := ExpandSlice(Runs(s, dd), pl, dl, sl)
				descs += len(ld)
				// The last page the room's last chunk names, when it
				// holds several units: only its first is checked
				// (WrittenUnits): a tail in a token slot past the first
				// unit of that page is exempt, no other.
				last := c[1] == len(src)
				_, dHeads, _ := md.Heads(dtp, d.TPRank)
				partial := func(a uint64) bool {
					if !last || n == 0 || pm.Dst <= pm.Unit() {
						return false
					}
					for _, r := range dl.Regions {
						if a < uint64(r.Addr) || a >= uint64(r.Addr)+r.Len || (a-uint64(r.Addr))/dl.PageBytes != uint64(dst[off+n-1]) {
							continue
						}
						slot := (a - uint64(r.Addr)) % dl.PageBytes / uint64(md.HeadBytes) // the head-sized slot of the page
						tok := slot / uint64(dHeads)                                       // NHD: token-major
						if md.Layout == HND {
							tok = slot % uint64(md.PageTokens)
						}
						return tok >= uint64(pm.Unit())
					}
					return false
				}
				checkTails(t, rd, Tails(dl, sl, sl.RegionOffset, sl.RegionOffset+len(pl.Regions), WrittenUnits(pm, dst, off, n, last, nil), nil), partial)
				checkDigest(t, pl, pmem, dl, dmem, sl, pm, Runs(s, dd), dst, off, n, ld, rd)
				for i := range ld {
					require.Equal(t, ld[i].Len, rd[i].Len, "descriptor %d: bytes", i)
					copy(dmem.at(rd[i]), pmem.at(ld[i]))
					for k := rd[i].Addr - dmem.base; k < rd[i].Addr-dmem.base+uintptr(rd[i].Len); k++ {
						written[k]++
					}
				}
			}
			if sl.Full && pm.Same() && prefix == 0 {
				require.Equal(t, len(pl.Regions)*3, descs, "a full slice of 2 chunks of 3 runs over %d regions: descriptors, want merged", len(pl.Regions))
			}
		}
		// Exactly one link writes aux, unless this decode stage pulls only
		// from a prefill stage before the last.
		wantAux := 1
		if dpp == ppp && d.PPRank != ppp-1 {
			wantAux = 0
		}
		require.Equal(t, wantAux, aux, "decode %v: links that write aux", d)
		// Every head of every token of the room in every destination page;
		// nothing else written.
		dFirst, dN, _ := md.Heads(dtp, d.TPRank)
		dLayer, _ := md.StageLayers(dpp, d.PPRank)
		room := make([]bool, len(written))
		for reg := range dl.Regions {
			for i, pg := range dst {
				page := dmem.at(dl.Regions[reg])[uint64(pg)*dl.PageBytes:]
				for h := 0; h < dN; h++ {
					for tok := 0; tok < md.PageTokens; tok++ {
						v := (prefix+i)*md.PageTokens + tok // the room's token
						off := headAt(md, dN, h, tok)
						s := stamp(dLayer*RegionsPerLayer+reg, dFirst+h, v)
						for b := 0; b < md.HeadBytes; b++ {
							k := uintptr(uint64(reg*pages)*dl.PageBytes+uint64(pg)*dl.PageBytes) + uintptr(off+b)
							room[k] = true
							if v >= tokens && written[k] <= 1 {
								continue // past the room's end: written once at most
							}
							// (Per byte: hand-written checks, as require.Equal here made the test 30× slower.)
							if page[off+b] != s[b%2] {
								t.Fatalf("decode %v region %d page %d head %d token %d (room token %d) byte %d: %d, want %d", d, reg, pg, dFirst+h, tok, v, b, page[off+b], s[b%2])
							}
							if written[k] != 1 {
								t.Fatalf("decode %v region %d page %d head %d token %d: written %d times", d, reg, pg, dFirst+h, tok, written[k])
							}
						}
					}
				}
			}
		}
		for k, n := range written {
			if n != 0 && !room[k] {
				t.Fatalf("decode %v: byte %d outside the room's pages written %d times", d, k, n)
			}
		}
	}
}

// checkTails: the decode rank's write check (Tails of WrittenUnits, as
// the chunk's notification names them) checks the end of every
// descriptor the chunk's write posts (but in the last page the room's
// last chunk names, where partial says so), and only bytes the write
// fills (a tail outside them would fail a room whose every byte landed).
func checkTails(t *testing.T, rd []mem.Desc, tails []uint64, partial func(uint64) bool) {
	t.Helper()
	set := make(map[uint64]bool, len(tails))
	for _, a := range tails {
		set[a] = true
	}
	for i, d := range rd {
		if d.Len >= TailBytes && !partial(uint64(d.Addr)+d.Len-TailBytes) {
			require.True(t, set[uint64(d.Addr)+d.Len-TailBytes], "descriptor %d (%d bytes at %#x): its end is not checked", i, d.Len, d.Addr)
		}
	}
	for _, a := range tails {
		in := false
		for _, d := range rd {
			in = in || a >= uint64(d.Addr) && a+TailBytes <= uint64(d.Addr)+d.Len
		}
		require.True(t, in, "tail at %#x: no descriptor of the write fills it", a)
	}
}

func ExampleLinks() {
	m := Model{Layers: 32, KVHeads: 8, HeadBytes: 256, PageTokens: 16, Layout: HND}
	links, _ := Links(m, Parallel{TPSize: 2}, Parallel{TPSize: 1})
	for _, l := range links {
		fmt.Printf("prefill tp %d: heads %d..%d aux %v\n", l.TPRank, l.FirstHead, l.FirstHead+l.Heads-1, l.Aux)
	}
	// Output:
	// prefill tp 0: heads 0..3 aux true
	// prefill tp 1: heads 4..7 aux false
}
