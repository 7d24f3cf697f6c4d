package kvlayout

import (
	"math"
	"testing"

	"github.com/kvbridge/kvbridge/internal/mem"
	"github.com/stretchr/testify/assert"
)

func TestOverlap(t *testing.T) {
	host := func(addr, n uint64) Span { return Span{Kind: mem.DRAM, Addr: addr, Len: n} }
	gpu := func(dev, addr, n uint64) Span { return Span{Kind: mem.VRAM, Dev: dev, Addr: addr, Len: n} }
	for _, tc := range []struct {
		name  string
		spans []Span
		i, j  int // -1: none
	}{
		{"disjoint", []Span{host(0, 10), host(20, 10), host(10, 10)}, -1, -1},
		{"one inside another", []Span{host(0, 100), host(200, 10), host(40, 10)}, 0, 2},
		{"the same memory", []Span{host(64, 64), host(64, 64)}, 0, 1},
		{"a partial overlap, listed backwards", []Span{host(150, 100), host(100, 51)}, 0, 1},
		{"a long span over a later one past a short one", []Span{host(0, 100), host(10, 5), host(50, 5)}, 0, 1},
		{"only touching", []Span{host(0, 10), host(10, 10)}, -1, -1},
		{"empty spans share nothing", []Span{host(0, 100), host(50, 0), gpu(0, 50, 0)}, -1, -1},
		{"host memory is one space whatever the device", []Span{{Kind: mem.DRAM, Dev: 0, Addr: 0, Len: 10}, {Kind: mem.DRAM, Dev: 3, Addr: 5, Len: 10}}, 0, 1},
		{"each GPU its own", []Span{gpu(0, 0, 10), gpu(1, 0, 10), host(0, 10)}, -1, -1},
		{"one GPU", []Span{gpu(0, 0, 10), gpu(1, 0, 10), gpu(1, 9, 1)}, 1, 2},
		{"a span past the top of the address space", []Span{host(math.MaxUint64-10, 100), host(math.MaxUint64-1, 1)}, 0, 1},
	} {
		i, j, ok := Overlap(tc.spans)
		if tc.i < 0 {
			assert.False(t, ok, "%s: %d and %d overlap", tc.name, i, j)
			continue
		}
		if assert.True(t, ok, "%s: no overlap", tc.name) {
			assert.Equal(t, tc.i, i, "%s: first", tc.name)
			assert.Equal(t, tc.j, j, "%s: second", tc.name)
		}
	}
	assert.Equal(t, uint64(math.MaxUint64), host(math.MaxUint64-10, 100).End(), "End past the top")
}
