package nixl

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCoalesceRuns(t *testing.T) {
	type pr struct{ s, d, l uint64 }
	cases := []struct {
		name  string
		pairs []pr
		split map[int]bool // join(k) false
		want  []PieceRun
	}{
		{"one run", []pr{{0, 100, 10}, {10, 110, 10}, {20, 120, 5}}, nil, []PieceRun{{0, 3, 25}}},
		{"source gap", []pr{{0, 100, 10}, {11, 110, 10}}, nil, []PieceRun{{0, 1, 10}, {1, 1, 10}}},
		{"destination gap", []pr{{0, 100, 10}, {10, 111, 10}}, nil, []PieceRun{{0, 1, 10}, {1, 1, 10}}},
		{"destination backwards", []pr{{0, 110, 10}, {10, 100, 10}}, nil, []PieceRun{{0, 1, 10}, {1, 1, 10}}},
		{"adjacent but not joined", []pr{{0, 100, 10}, {10, 110, 10}, {20, 120, 10}}, map[int]bool{2: true}, []PieceRun{{0, 2, 20}, {2, 1, 10}}},
		{"runs after a break", []pr{{0, 0, 4}, {4, 4, 4}, {100, 8, 4}, {104, 12, 4}}, nil, []PieceRun{{0, 2, 8}, {2, 2, 8}}},
	}
	for _, c := range cases {
		var got []PieceRun
		n := Coalesce(len(c.pairs),
			func(k int) uint64 { return c.pairs[k].s },
			func(k int) uint64 { return c.pairs[k].d },
			func(k int) uint64 { return c.pairs[k].l },
			func(k int) bool { return !c.split[k] },
			func(r PieceRun) { got = append(got, r) })
		assert.Len(t, got, n, "%s: runs counted, given", c.name)
		assert.Equal(t, c.want, got, "%s: runs", c.name)
	}
}

// TestWritesCoalesce: on every engine, a write of pages prepared one by
// one moves each run of pages adjacent on both sides as one operation
// (Pieces), and the bytes land where the pairs say. The ucx engine's three
// paths: a copy into peer memory UCX allocated (direct), puts into the
// caller's memory (shared memory) and its own active messages (tcp). The
// caller's memory is two registrations on each side, adjacent: no engine
// joins pages across them (the ucx engine's operations name one
// registration's handle and key, a direct copy's slices stay inside one
// mapping, and a loopback or CUDA copy must not span two allocations).
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
						for _, h := range [][]byte{b[:pages/2*page], b[pages/2*page:]} {
							_, err := a.RegisterBytes(h)
							require.NoError(t, err)
						}
						return b
					}
					_, b, err := a.Alloc(pages * page)
					require.NoError(t, err)
					return b
				}
				src, dst := buf(p.ini, mc.ini), buf(p.tgt, mc.tgt)
				p.remote = exchange(t, p.ini, p.tgt)
				l, err := p.ini.PrepLocal(DRAM, pageDescs(src, page))
				require.NoError(t, err)
				r, err := p.ini.PrepRemote(p.remote, DRAM, pageDescs(dst, page))
				require.NoError(t, err)
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
					{"across the target's middle", seq(8, 8), seq(pages/2-4, 8), 1},
				} {
					fill(src, uint64(len(wc.li)+wc.runs))
					for i := range dst {
						dst[i] = 0
					}
					x, err := p.ini.NewXfer(Write, l, wc.li, r, wc.ri, []byte(wc.name))
					require.NoError(t, err)
					require.NoError(t, p.ini.Post(x))
					st, err := wait(t, p.ini, x, time.Minute)
					require.Equal(t, Done, st, "%s: state: %v", wc.name, err)
					waitNotif(t, p.tgt, time.Minute)
					want := wc.runs
					switch {
					case ec.name == "libnixl-double" || ec.name == "libnixl-real":
						want = len(wc.li) // NIXL merges them itself
					case wc.name == "across the middle" && mc.ini, wc.name == "across the target's middle" && mc.tgt:
						want = 2 // two registrations: a run each
					case wc.name == "three runs" && mc.tgt:
						want = 4 // the first run's destination crosses the target's middle
					}
					assert.Equal(t, want, x.Pieces(), "%s: %d pairs moved as operations", wc.name, len(wc.li))
					for k := range wc.li {
						s, d := src[wc.li[k]*page:(wc.li[k]+1)*page], dst[wc.ri[k]*page:(wc.ri[k]+1)*page]
						require.True(t, bytes.Equal(s, d), "%s: page %d → %d corrupted", wc.name, wc.li[k], wc.ri[k])
					}
					require.NoError(t, p.ini.Release(x))
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

// writePieces writes pairs li → ri from p's initiator, waits for it to be
// done, and returns how many operations the engine made of it.
func writePieces(t *testing.T, p pair, l *Prepped, li []int, r *Prepped, ri []int) int {
	t.Helper()
	x, err := p.ini.NewXfer(Write, l, li, r, ri, nil)
	require.NoError(t, err)
	require.NoError(t, p.ini.Post(x))
	st, err := wait(t, p.ini, x, time.Minute)
	require.Equal(t, Done, st, err)
	return x.Pieces()
}

// TestVRAMRunsStayInOneRegistration: the two halves of one device
// allocation registered separately are two regions; a CUDA copy never
// spans them (on the CUDA double: a copy per registration).
func TestVRAMRunsStayInOneRegistration(t *testing.T) {
	vramCases(t, func(t *testing.T) {
		const pages, page = 16, 4096
		for _, ec := range engines()[:2] { // loopback, ucx-shm
			t.Run(ec.name, func(t *testing.T) {
				p := newPair(t, ec)
				src, _ := devAlloc(t, pages*page)
				dst, _ := devAlloc(t, pages*page)
				half := uintptr(pages / 2 * page)
				for _, d := range []Desc{{Addr: uintptr(src), Len: uint64(half)}, {Addr: uintptr(src) + half, Len: uint64(half)}} {
					_, err := p.ini.Register(VRAM, []Desc{d})
					require.NoError(t, err)
				}
				_, err := p.tgt.Register(VRAM, []Desc{{Addr: uintptr(dst), Len: pages * page}})
				require.NoError(t, err)
				p.remote = exchange(t, p.ini, p.tgt)
				var s, d []Desc
				for i := 0; i < pages; i++ {
					s = append(s, Desc{Addr: uintptr(src) + uintptr(i*page), Len: page})
					d = append(d, Desc{Addr: uintptr(dst) + uintptr(i*page), Len: page})
				}
				ls, err := p.ini.PrepLocal(VRAM, s)
				require.NoError(t, err)
				rs, err := p.ini.PrepRemote(p.remote, VRAM, d)
				require.NoError(t, err)
				assert.Equal(t, 2, writePieces(t, p, ls, seq(4, 8), rs, seq(0, 8)), "a VRAM run across two registrations: operations")
			})
		}
	})
}
