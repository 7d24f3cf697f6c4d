package nixl

import (
	"fmt"
	"runtime"
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

// spin polls a transfer to completion without sleeping.
func spin(b *testing.B, a *Agent, x *Xfer) {
	for {
		st, err := a.Status(x)
		if st == Done {
			return
		}
		if st == Failed {
			b.Fatal(err)
		}
		runtime.Gosched()
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
