package nixl

import (
	"bytes"
	"testing"
	"time"
)

func TestCoalesceRuns(t *testing.T) {
	type pr struct{ s, d, l uint64 }
	cases := []struct {
		name  string
		pairs []pr
		split map[int]bool // join(k) false
		want  []pieceRun
	}{
		{"one run", []pr{{0, 100, 10}, {10, 110, 10}, {20, 120, 5}}, nil, []pieceRun{{0, 3, 25}}},
		{"source gap", []pr{{0, 100, 10}, {11, 110, 10}}, nil, []pieceRun{{0, 1, 10}, {1, 1, 10}}},
		{"destination gap", []pr{{0, 100, 10}, {10, 111, 10}}, nil, []pieceRun{{0, 1, 10}, {1, 1, 10}}},
		{"destination backwards", []pr{{0, 110, 10}, {10, 100, 10}}, nil, []pieceRun{{0, 1, 10}, {1, 1, 10}}},
		{"adjacent but not joined", []pr{{0, 100, 10}, {10, 110, 10}, {20, 120, 10}}, map[int]bool{2: true}, []pieceRun{{0, 2, 20}, {2, 1, 10}}},
		{"runs after a break", []pr{{0, 0, 4}, {4, 4, 4}, {100, 8, 4}, {104, 12, 4}}, nil, []pieceRun{{0, 2, 8}, {2, 2, 8}}},
	}
	for _, c := range cases {
		var got []pieceRun
		n := coalesce(len(c.pairs),
			func(k int) uint64 { return c.pairs[k].s },
			func(k int) uint64 { return c.pairs[k].d },
			func(k int) uint64 { return c.pairs[k].l },
			func(k int) bool { return !c.split[k] },
			func(r pieceRun) { got = append(got, r) })
		if n != len(got) {
			t.Errorf("%s: %d runs counted, %d given", c.name, n, len(got))
		}
		if len(got) != len(c.want) {
			t.Errorf("%s: runs %v, want %v", c.name, got, c.want)
			continue
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("%s: runs %v, want %v", c.name, got, c.want)
				break
			}
		}
	}
}

// TestWritesCoalesce: on every engine, a write of pages prepared one by
// one moves each run of pages adjacent on both sides as one operation
// (Pieces), and the bytes land where the pairs say. The ucx engine's three
// paths: a copy into peer memory UCX allocated (direct), puts into the
// caller's memory (shared memory) and its own active messages (tcp). The
// caller's memory on the initiator is two registrations, adjacent: the
// ucx engine never joins pages across them (its operations name one
// registration's handle, and a direct copy's slices stay inside one).
func TestWritesCoalesce(t *testing.T) {
	const page, pages = 4096, 64
	type memCase struct {
		name     string
		ini, tgt bool // the caller's memory (RegisterBytes), not the agent's Alloc
	}
	for _, ec := range engines() {
		for _, mc := range []memCase{{"engine", false, false}, {"caller", true, true}, {"caller-to-engine", true, false}} {
			t.Run(ec.name+"/"+mc.name, func(t *testing.T) {
				if ec.skip != "" {
					t.Skip(ec.skip)
				}
				p := newPair(t, ec)
				buf := func(a *Agent, caller bool) []byte {
					if caller {
						b := make([]byte, pages*page)
						halves := [][]byte{b}
						if a == p.ini {
							halves = [][]byte{b[:pages/2*page], b[pages/2*page:]}
						}
						for _, h := range halves {
							if _, err := a.RegisterBytes(h); err != nil {
								t.Fatal(err)
							}
						}
						return b
					}
					_, b, err := a.Alloc(pages * page)
					if err != nil {
						t.Fatal(err)
					}
					return b
				}
				src, dst := buf(p.ini, mc.ini), buf(p.tgt, mc.tgt)
				p.remote = exchange(t, p.ini, p.tgt)
				l, err := p.ini.PrepLocal(DRAM, pageDescs(src, page))
				if err != nil {
					t.Fatal(err)
				}
				r, err := p.ini.PrepRemote(p.remote, DRAM, pageDescs(dst, page))
				if err != nil {
					t.Fatal(err)
				}
				for _, wc := range []struct {
					name   string
					li, ri []int
					runs   int // after coalescing
				}{
					{"three runs", append(seq(0, 32), append(seq(40, 8), seq(50, 14)...)...),
						append(seq(10, 32), append(seq(0, 8), seq(50, 14)...)...), 3},
					{"destination backwards", seq(0, 16), rev(seq(0, 16)), 16},
					{"source backwards", rev(seq(16, 16)), seq(16, 16), 16},
					{"across the middle", seq(pages/2-4, 8), seq(8, 8), 1},
				} {
					fill(src, uint64(len(wc.li)+wc.runs))
					for i := range dst {
						dst[i] = 0
					}
					x, err := p.ini.NewXfer(Write, l, wc.li, r, wc.ri, []byte(wc.name))
					if err != nil {
						t.Fatal(err)
					}
					if err := p.ini.Post(x); err != nil {
						t.Fatal(err)
					}
					if st, err := wait(t, p.ini, x, time.Minute); st != Done {
						t.Fatalf("%s: state %v: %v", wc.name, st, err)
					}
					waitNotif(t, p.tgt, time.Minute)
					want := wc.runs
					switch {
					case ec.name == "libnixl-double" || ec.name == "libnixl-real":
						want = len(wc.li) // NIXL merges them itself
					case wc.name == "across the middle" && mc.ini && ec.name != "loopback":
						want = 2 // two registrations: a run each
					}
					if got := x.Pieces(); got != want {
						t.Errorf("%s: %d pairs moved as %d operations, want %d", wc.name, len(wc.li), got, want)
					}
					for k := range wc.li {
						s, d := src[wc.li[k]*page:(wc.li[k]+1)*page], dst[wc.ri[k]*page:(wc.ri[k]+1)*page]
						if !bytes.Equal(s, d) {
							t.Fatalf("%s: page %d → %d corrupted", wc.name, wc.li[k], wc.ri[k])
						}
					}
					if err := p.ini.Release(x); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

func pageDescs(b []byte, page int) []Desc {
	var d []Desc
	for off := 0; off < len(b); off += page {
		d = append(d, BytesDesc(b[off:off+page]))
	}
	return d
}

func seq(from, n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = from + i
	}
	return s
}

func rev(s []int) []int {
	for i, j := 0, len(s)-1; i < j; i, j = i+1, j-1 {
		s[i], s[j] = s[j], s[i]
	}
	return s
}
