package kvlayout

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/kvbridge/kvbridge/internal/mem"
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
				if err == nil || !errors.Is(err, ErrTopology) && tc.name != "8 heads over TP 3 refused" || !contains(err.Error(), tc.err) {
					t.Fatalf("want an error with %q, got %v (%+v)", tc.err, err, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("links\n got %+v\nwant %+v", got, tc.want)
			}
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
// arrays: every prefill rank fills its heads with a pattern of (global
// layer region, global head, token position); after every link's writes,
// every head of every token of every decode region holds the right pattern,
// and every byte of the decode pages was written exactly once.
func TestSlicesMoveEveryHeadOnce(t *testing.T) {
	mla := Model{Layers: 4, KVHeads: 1, HeadBytes: 32, PageTokens: 4, MLA: true}
	two := Model{Layers: 4, KVHeads: 2, HeadBytes: 16, PageTokens: 4}
	type topo struct{ ptp, ppp, dtp, dpp int }
	cases := map[string]topo{"TP 1→1": {1, 1, 1, 1}, "TP 2→1": {2, 1, 1, 1}, "TP 1→2": {1, 1, 2, 1}, "TP 4→2": {4, 1, 2, 1},
		"TP 2→4": {2, 1, 4, 1}, "TP 8→1": {8, 1, 1, 1}, "PP 2→1": {1, 2, 1, 1}, "PP 2→2": {1, 2, 1, 2}, "PP 2 TP 2→1": {2, 2, 1, 1}}
	for _, model := range []struct {
		name string
		m    Model
	}{{"NHD", llama(NHD)}, {"HND", llama(HND)}, {"2 heads", two}, {"MLA", mla}} {
		for name, tp := range cases {
			t.Run(model.name+"/"+name, func(t *testing.T) {
				m := model.m
				const pages = 6
				src, dst := []uint32{0, 1, 2, 4, 5}, []uint32{3, 4, 5, 0, 1} // two runs each
				for dRank := 0; dRank < tp.dtp*tp.dpp; dRank++ {
					d := Parallel{TPSize: tp.dtp, TPRank: dRank % tp.dtp, PPSize: tp.dpp, PPRank: dRank / tp.dtp}
					dl, dmem := rankMem(m, d, pages, 1<<40)
					written := make([]int, len(dmem.b))
					links, err := Links(m, Parallel{TPSize: tp.ptp, PPSize: tp.ppp}, d)
					if err != nil {
						t.Fatal(err)
					}
					aux := 0
					for _, lk := range links {
						if lk.Aux {
							aux++
						}
						p := Parallel{TPSize: tp.ptp, TPRank: lk.TPRank, PPSize: tp.ppp, PPRank: lk.PPRank}
						pl, pmem := rankMem(m, p, pages, 1<<30)
						pFirst, pN, _ := m.Heads(tp.ptp, lk.TPRank)
						pLayer, _ := m.StageLayers(tp.ppp, lk.PPRank)
						for reg := range pl.Regions {
							for pg := 0; pg < pages; pg++ {
								page := pmem.at(pl.Regions[reg])[uint64(pg)*pl.PageBytes:]
								for h := 0; h < pN; h++ {
									for tok := 0; tok < m.PageTokens; tok++ {
										s := stamp(pLayer*RegionsPerLayer+reg, pFirst+h, pg*m.PageTokens+tok)
										off := headAt(m, pN, h, tok)
										for b := 0; b < m.HeadBytes; b++ {
											page[off+b] = s[b%2]
										}
									}
								}
							}
						}
						sl, err := Plan(m, p, d)
						if err != nil {
							t.Fatal(err)
						}
						if (sl == nil) != lk.Dummy {
							t.Fatalf("link %+v: plan %+v", lk, sl)
						}
						if sl == nil {
							continue
						}
						if err := CheckLayouts(m, p, pl, d, dl); err != nil {
							t.Fatal(err)
						}
						ld, rd := ExpandSlice(Runs(src, dst), pl, dl, sl)
						for i := range ld {
							copy(dmem.at(rd[i]), pmem.at(ld[i]))
							for k := rd[i].Addr - dmem.base; k < rd[i].Addr-dmem.base+uintptr(rd[i].Len); k++ {
								written[k]++
							}
						}
						if sl.Full && len(ld) != len(pl.Regions)*2 {
							t.Fatalf("a full slice of 2 runs over %d regions made %d descriptors, want merged %d", len(pl.Regions), len(ld), len(pl.Regions)*2)
						}
					}
					// Exactly one link writes aux, unless this decode stage
					// pulls only from a prefill stage before the last.
					wantAux := 1
					if tp.dpp == tp.ppp && d.PPRank != tp.ppp-1 {
						wantAux = 0
					}
					if aux != wantAux {
						t.Fatalf("decode %v: %d links write aux, want %d", d, aux, wantAux)
					}
					// Every head of every token of every destination page.
					dFirst, dN, _ := m.Heads(tp.dtp, d.TPRank)
					dLayer, _ := m.StageLayers(tp.dpp, d.PPRank)
					for reg := range dl.Regions {
						for i, pg := range dst {
							page := dmem.at(dl.Regions[reg])[uint64(pg)*dl.PageBytes:]
							for h := 0; h < dN; h++ {
								for tok := 0; tok < m.PageTokens; tok++ {
									s := stamp(dLayer*RegionsPerLayer+reg, dFirst+h, int(src[i])*m.PageTokens+tok)
									off := headAt(m, dN, h, tok)
									for b := 0; b < m.HeadBytes; b++ {
										if page[off+b] != s[b%2] {
											t.Fatalf("decode %v region %d page %d head %d token %d byte %d: %d, want %d", d, reg, pg, dFirst+h, tok, b, page[off+b], s[b%2])
										}
										k := uintptr(uint64(reg*pages)*dl.PageBytes+uint64(pg)*dl.PageBytes) + uintptr(off+b)
										if written[k] != 1 {
											t.Fatalf("decode %v region %d page %d head %d token %d: written %d times", d, reg, pg, dFirst+h, tok, written[k])
										}
									}
								}
							}
						}
					}
				}
			})
		}
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
