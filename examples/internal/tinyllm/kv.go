package tinyllm

import (
	"fmt"
	"unsafe"

	"github.com/kvbridge/kvbridge/transfer"
)

// Dense is an unpaged KV cache of a whole model: K and V as
// [layer][position][head][dim].
type Dense struct {
	Layers, Heads, HeadDim, Cap int
	K, V                        []float32
}

// NewDense is a Dense cache for cap positions.
func NewDense(layers, heads, headDim, cap int) *Dense {
	n := layers * cap * heads * headDim
	return &Dense{Layers: layers, Heads: heads, HeadDim: headDim, Cap: cap, K: make([]float32, n), V: make([]float32, n)}
}

// Slot implements KV.
func (d *Dense) Slot(layer, pos, head int) (k, v []float32) {
	o := ((layer*d.Cap+pos)*d.Heads + head) * d.HeadDim
	return d.K[o : o+d.HeadDim : o+d.HeadDim], d.V[o : o+d.HeadDim : o+d.HeadDim]
}

// Cache is one rank's paged KV memory in kvbridge's layout: Regions[i] is
// local layer i/2 (global layer Layer0 + i/2), K for even i and V for odd
// i, each a run of pages of PageTokens × Heads × HeadDim float32; a page
// holds the global KV heads [FirstHead, FirstHead+Heads) of its tokens,
// token-major (NHD: token, head, dim) or head-major (HND: head, token,
// dim).
type Cache struct {
	Regions          [][]float32
	Layer0, Layers   int
	FirstHead, Heads int
	HeadDim          int
	PageTokens       int
	Layout           transfer.PageLayout
}

// Floats views registered memory (kvbridge's []byte regions) as float32s,
// in place: what the engine computes is what kvbridge moves.
func Floats(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	if uintptr(unsafe.Pointer(&b[0]))%4 != 0 || len(b)%4 != 0 {
		panic("tinyllm: KV memory is not 4-byte aligned")
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// NewCache lays a Cache over a rank's regions (its PP stage's layers × K/V,
// as kvbridge's Manager allocated them) for its TP rank's heads.
func NewCache(regions [][]byte, layer0, firstHead, heads, headDim, pageTokens int, layout transfer.PageLayout) (*Cache, error) {
	if len(regions) == 0 || len(regions)%transfer.RegionsPerLayer != 0 {
		return nil, fmt.Errorf("tinyllm: %d regions: want K and V per layer", len(regions))
	}
	c := &Cache{Layer0: layer0, Layers: len(regions) / transfer.RegionsPerLayer, FirstHead: firstHead, Heads: heads,
		HeadDim: headDim, PageTokens: pageTokens, Layout: layout}
	for _, r := range regions {
		c.Regions = append(c.Regions, Floats(r))
	}
	if len(c.Regions[0])%c.pageFloats() != 0 {
		return nil, fmt.Errorf("tinyllm: a region of %d floats is not a whole number of %d-float pages", len(c.Regions[0]), c.pageFloats())
	}
	return c, nil
}

func (c *Cache) pageFloats() int { return c.PageTokens * c.Heads * c.HeadDim }

// Pages is how many pages a region holds.
func (c *Cache) Pages() int { return len(c.Regions[0]) / c.pageFloats() }

// HasLayer reports whether the cache holds global layer l.
func (c *Cache) HasLayer(l int) bool { return l >= c.Layer0 && l < c.Layer0+c.Layers }

// HasHead reports whether the cache holds global KV head h.
func (c *Cache) HasHead(h int) bool { return h >= c.FirstHead && h < c.FirstHead+c.Heads }

// offset is where (token slot t, local head h) of page pg starts in a region.
func (c *Cache) offset(pg uint32, t, h int) int {
	o := int(pg) * c.pageFloats()
	if c.Layout == transfer.HND {
		return o + (h*c.PageTokens+t)*c.HeadDim
	}
	return o + (t*c.Heads+h)*c.HeadDim
}

// Seq is one sequence's view of a Cache: position p lives in page
// Pages[p/PageTokens], slot p%PageTokens. It implements KV for the layers
// and heads the cache holds (others panic: a rank computes only what it
// holds, or computes in a Dense cache and copies its share).
type Seq struct {
	C     *Cache
	Pages []uint32
	// Swap is a deliberate fault for tests: each page's heads are read
	// and written in reverse order (a wrong head mapping).
	Swap bool
}

// Slot implements KV.
func (s *Seq) Slot(layer, pos, head int) (k, v []float32) {
	c := s.C
	if !c.HasLayer(layer) || !c.HasHead(head) {
		panic(fmt.Sprintf("tinyllm: layer %d head %d not in this cache (layers [%d,%d), heads [%d,%d))",
			layer, head, c.Layer0, c.Layer0+c.Layers, c.FirstHead, c.FirstHead+c.Heads))
	}
	h := head - c.FirstHead
	if s.Swap {
		h = c.Heads - 1 - h
	}
	o := c.offset(s.Pages[pos/c.PageTokens], pos%c.PageTokens, h)
	r := (layer - c.Layer0) * transfer.RegionsPerLayer
	d := c.HeadDim
	return c.Regions[r][o : o+d : o+d], c.Regions[r+1][o : o+d : o+d]
}

// CopyShare copies what dst holds of layers [lo, hi) — its heads, its
// layers — for positions [0, n) from src (a whole model's cache): how a
// rank that computed everything keeps only its TP rank's heads and its PP
// stage's layers.
func CopyShare(dst *Seq, src KV, lo, hi, n int) {
	c := dst.C
	for l := max(lo, c.Layer0); l < min(hi, c.Layer0+c.Layers); l++ {
		for p := 0; p < n; p++ {
			for h := c.FirstHead; h < c.FirstHead+c.Heads; h++ {
				dk, dv := dst.Slot(l, p, h)
				sk, sv := src.Slot(l, p, h)
				copy(dk, sk)
				copy(dv, sv)
			}
		}
	}
}
