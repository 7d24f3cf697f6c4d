package nixl

import (
	"context"
	"fmt"
	"syscall"
	"testing"
)

// Engine write bandwidth. scripts/bench-engine.sh runs these next to
// ucx_perftest at the same sizes and transports and prints the ratios.

var benchEngines = []engineCase{
	{"ucx-shm", func(n string) Config { return Config{Name: n, Engine: EngineUCX, UCX: shmUCX} }, ""},
	{"ucx-tcp", func(n string) Config { return Config{Name: n, Engine: EngineUCX, UCX: tcpUCX} }, ""},
	{"loopback", func(n string) Config { return Config{Name: n, Engine: EngineLoopback} }, ""},
}

var benchSizes = []int{4 << 10, 64 << 10, 1 << 20, 64 << 20}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	default:
		return fmt.Sprintf("%dKiB", n>>10)
	}
}

// spin waits for a transfer to complete.
func spin(b *testing.B, a *Agent, x *Xfer) {
	if st, err := a.Wait(context.Background(), x); st != Done {
		b.Fatal(st, err)
	}
}

func benchWrite(b *testing.B, ec engineCase, pieces, piece int) {
	p := pair{ini: open(b, ec, "bini"), tgt: open(b, ec, "btgt")}
	_, src, err := p.ini.Alloc(uint64(pieces * piece))
	if err != nil {
		b.Fatal(err)
	}
	_, dst, err := p.tgt.Alloc(uint64(pieces * piece))
	if err != nil {
		b.Fatal(err)
	}
	p.remote = exchange(b, p.ini, p.tgt)
	var s, d []Desc
	for i := 0; i < pieces; i++ {
		s = append(s, BytesDesc(src[i*piece:(i+1)*piece]))
		d = append(d, BytesDesc(dst[i*piece:(i+1)*piece]))
	}
	l, _ := p.ini.PrepLocal(DRAM, s)
	r, _ := p.ini.PrepRemote(p.remote, DRAM, d)
	idx := make([]int, pieces)
	for i := range idx {
		idx[i] = i
	}
	x, err := p.ini.NewXfer(Write, l, idx, r, idx, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(pieces * piece))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := p.ini.Post(x); err != nil {
			b.Fatal(err)
		}
		spin(b, p.ini, x)
	}
	b.StopTimer()
	p.ini.Release(x)
}

func BenchmarkWrite(b *testing.B) {
	for _, ec := range benchEngines {
		for _, n := range benchSizes {
			b.Run(ec.name+"/"+sizeName(n), func(b *testing.B) { benchWrite(b, ec, 1, n) })
		}
	}
}

// BenchmarkWriteDescs: one request of 1,024 descriptors of 32 KiB (the
// shape of a paged KV chunk), against the 64 MiB single write.
func BenchmarkWriteDescs(b *testing.B) {
	for _, ec := range benchEngines[:2] {
		b.Run(ec.name+"/1024x32KiB", func(b *testing.B) { benchWrite(b, ec, 1024, 32<<10) })
	}
}

// BenchmarkMemcpy is the physical reference: copy() between two UCX-mapped
// buffers of one process.
func BenchmarkMemcpy(b *testing.B) {
	a := open(b, benchEngines[0], "memcpy")
	for _, n := range benchSizes {
		b.Run(sizeName(n), func(b *testing.B) {
			_, src, _ := a.Alloc(uint64(n))
			_, dst, _ := a.Alloc(uint64(n))
			b.SetBytes(int64(n))
			for i := 0; i < b.N; i++ {
				copy(dst, src)
			}
		})
	}
}

// BenchmarkWriteCrossProcess: the ucx engine between two processes, as
// ucx_perftest runs, on memory UCX allocated ("engine": a shared-memory
// peer maps it and the write is a copy) and on memory the caller allocated
// and registered ("caller", as a serving engine's KV cache: puts), every
// write with its notification and waited for.
func BenchmarkWriteCrossProcess(b *testing.B) {
	for _, tc := range []struct {
		transport string
		ucx       map[string]string
	}{{"shm", shmUCX}, {"tcp", tcpUCX}} {
		for _, mem := range []string{"engine", "caller"} {
			for _, n := range []int{64 << 10, 1 << 20, 64 << 20} {
				b.Run(fmt.Sprintf("%s/%s/%s", tc.transport, mem, sizeName(n)), func(b *testing.B) {
					c := startChild(b, tc.transport, "KVBRIDGE_NIXL_CHILD_MEM="+mem)
					a, err := Open(Config{Name: fmt.Sprintf("bench-parent-%d", agentSeq.Add(1)), Engine: EngineUCX, UCX: tc.ucx})
					if err != nil {
						b.Fatal(err)
					}
					defer a.Close()
					remote, err := a.LoadRemote(c.md)
					if err != nil {
						b.Fatal(err)
					}
					var src []byte
					if mem == "caller" {
						if src, err = syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON); err != nil {
							b.Fatal(err)
						}
						defer syscall.Munmap(src)
						if _, err := a.Register(DRAM, []Desc{BytesDesc(src)}); err != nil {
							b.Fatal(err)
						}
					} else if _, src, err = a.Alloc(uint64(n)); err != nil {
						b.Fatal(err)
					}
					fill(src, 3)
					l, _ := a.PrepLocal(DRAM, []Desc{BytesDesc(src)})
					r, err := a.PrepRemote(remote, DRAM, []Desc{{Addr: c.addr, Len: uint64(n)}})
					if err != nil {
						b.Fatal(err)
					}
					x, err := a.NewXfer(Write, l, []int{0}, r, []int{0}, []byte("bench"))
					if err != nil {
						b.Fatal(err)
					}
					defer a.Release(x)
					b.SetBytes(int64(n))
					for i := -1; i < b.N; i++ { // i = −1 warms up (connection, first touch)
						if i == 0 {
							b.ResetTimer()
						}
						if err := a.Post(x); err != nil {
							b.Fatal(err)
						}
						if st, err := a.Wait(context.Background(), x); st != Done {
							b.Fatal(st, err)
						}
					}
					b.StopTimer()
				})
			}
		}
	}
}
