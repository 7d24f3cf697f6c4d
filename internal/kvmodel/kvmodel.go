// Package kvmodel holds what the example binaries and the benchmark share:
// model layout presets, the deterministic page pattern prefill writes and
// decode verifies, and a page allocator.
package kvmodel

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"

	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/transfer"
)

// Model describes a KV cache layout.
type Model struct {
	Name       string
	Layers     int
	KVHeads    int
	HeadDim    int
	DTypeBytes int
	PageTokens int
	MLA        bool // one latent per token (DeepSeek); split evenly over the K and V regions
}

// Presets are the models the examples know by name.
var Presets = map[string]Model{
	"tiny":        {Name: "tiny", Layers: 2, KVHeads: 2, HeadDim: 64, DTypeBytes: 2, PageTokens: 16},
	"llama3-8b":   {Name: "llama3-8b", Layers: 32, KVHeads: 8, HeadDim: 128, DTypeBytes: 2, PageTokens: 16},
	"llama3-70b":  {Name: "llama3-70b", Layers: 80, KVHeads: 8, HeadDim: 128, DTypeBytes: 2, PageTokens: 16},
	"deepseek-v3": {Name: "deepseek-v3", Layers: 61, KVHeads: 1, HeadDim: 576, DTypeBytes: 2, PageTokens: 16, MLA: true},
	"tiny-mla":    {Name: "tiny-mla", Layers: 2, KVHeads: 1, HeadDim: 128, DTypeBytes: 2, PageTokens: 16, MLA: true},
}

// PresetNames lists the presets, sorted.
func PresetNames() string {
	var n []string
	for k := range Presets {
		n = append(n, k)
	}
	sort.Strings(n)
	return strings.Join(n, ", ")
}

// PageBytes is the bytes of one page in one region (K or V of a layer).
// For MLA the latent (kv_lora_rank + rope dims) is split evenly over the
// two regions of a layer.
func (m Model) PageBytes() uint64 {
	b := uint64(m.PageTokens * m.KVHeads * m.HeadDim * m.DTypeBytes)
	if m.MLA {
		b /= 2
	}
	return b
}

// BytesPerToken is the KV bytes one token occupies over all layers.
func (m Model) BytesPerToken() uint64 {
	return 2 * uint64(m.Layers) * m.PageBytes() / uint64(m.PageTokens)
}

// Compat is the compatibility string both sides must share. Page tokens
// are not in it: the two sides' pages may differ in size (the rank mapping
// pairs them by tokens, and a prefill rank refuses sizes where neither
// divides the other).
func (m Model) Compat() string {
	return fmt.Sprintf("kvb1:%s:L%d:H%d:D%d:B%d:mla=%v", m.Name, m.Layers, m.KVHeads, m.HeadDim, m.DTypeBytes, m.MLA)
}

// AuxItemBytes is the size of a request's aux item in the examples.
const AuxItemBytes = 64

// Layout is an unallocated layout of pages pages per region (the Manager
// allocates it), with auxItems aux items.
func (m Model) Layout(kind nixl.MemKind, pages, auxItems int) transfer.Layout {
	l := transfer.Layout{Kind: kind, PageBytes: m.PageBytes(), AuxItemBytes: AuxItemBytes,
		Aux: nixl.Desc{Len: uint64(auxItems) * AuxItemBytes}}
	for i := 0; i < 2*m.Layers; i++ {
		l.Regions = append(l.Regions, nixl.Desc{Len: uint64(pages) * m.PageBytes()})
	}
	return l
}

// word is the i-th 8-byte word of the pattern for seed: distinct per room,
// position, region and offset, cheap enough to fill gigabytes.
func word(seed uint64, i int) uint64 {
	z := seed + uint64(i)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	return z ^ z>>27
}

func seedOf(room uint64, pos, region int) uint64 {
	return (room*0x100000001b3 ^ uint64(pos)<<20 ^ uint64(region)) * 0xff51afd7ed558ccd
}

// block is the pattern's 256-byte unit: every page is its block repeated,
// which fills and checks at memory speed and still tells every (room,
// position, region) apart, including a page left from another request.
const block = 256

func fillBlock(b []byte, room uint64, pos, region int) {
	seed := seedOf(room, pos, region)
	for i := 0; i < block; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], word(seed, i/8))
	}
}

// Fill writes the pattern of (room, position, region) into a page.
func Fill(page []byte, room uint64, pos, region int) {
	n := min(block, len(page))
	var b [block]byte
	fillBlock(b[:], room, pos, region)
	copy(page, b[:n])
	for filled := n; filled < len(page); filled *= 2 {
		copy(page[filled:], page[:filled])
	}
}

// Check reports whether a page holds the pattern of (room, position, region).
func Check(page []byte, room uint64, pos, region int) bool {
	var b [block]byte
	fillBlock(b[:], room, pos, region)
	for off := 0; off < len(page); off += block {
		end := min(off+block, len(page))
		if string(page[off:end]) != string(b[:end-off]) {
			return false
		}
	}
	return true
}

// Pages hands out distinct pages.
type Pages struct {
	mu   sync.Mutex
	free []uint32
}

// NewPages returns an allocator of pages 0..n−1 in a shuffled order, so
// requests get scattered pages as a serving engine's would.
func NewPages(n int, seed uint64) *Pages {
	p := &Pages{}
	for i := 0; i < n; i++ {
		p.free = append(p.free, uint32(i))
	}
	r := rand.New(rand.NewPCG(seed, 1))
	r.Shuffle(n, func(i, j int) { p.free[i], p.free[j] = p.free[j], p.free[i] })
	return p
}

// Get returns n pages, or nil if fewer are free.
func (p *Pages) Get(n int) []uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n < 0 || n > len(p.free) {
		return nil
	}
	out := append([]uint32(nil), p.free[len(p.free)-n:]...)
	p.free = p.free[:len(p.free)-n]
	return out
}

// Put returns pages.
func (p *Pages) Put(pg []uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free = append(p.free, pg...)
}

// Free counts free pages.
func (p *Pages) Free() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free)
}

// Mapping is the model as the rank mapping sees it: per region, one head
// of one token is HeadDim × DTypeBytes bytes (for MLA, half the latent).
func (m Model) Mapping(layout transfer.PageLayout) transfer.Model {
	hb := m.HeadDim * m.DTypeBytes
	if m.MLA {
		hb /= 2
	}
	return transfer.Model{Layers: m.Layers, KVHeads: m.KVHeads, HeadBytes: hb, PageTokens: m.PageTokens, MLA: m.MLA, Layout: layout}
}

// RankLayout is the unallocated layout of one rank: its PP stage's layers
// × K/V, pages of its TP share of the heads.
func (m Model) RankLayout(kind nixl.MemKind, layout transfer.PageLayout, par transfer.Parallel, pages, auxItems int) (transfer.Layout, error) {
	tm := m.Mapping(layout)
	par = par.Norm()
	pb, err := tm.PageBytes(par.TPSize)
	if err != nil {
		return transfer.Layout{}, err
	}
	_, layers := tm.StageLayers(par.PPSize, par.PPRank)
	l := transfer.Layout{Kind: kind, PageBytes: pb, AuxItemBytes: AuxItemBytes, Aux: nixl.Desc{Len: uint64(auxItems) * AuxItemBytes}}
	for i := 0; i < layers*transfer.RegionsPerLayer; i++ {
		l.Regions = append(l.Regions, nixl.Desc{Len: uint64(pages) * pb})
	}
	return l, nil
}

// InstanceSeed is the pattern seed of a prefill instance (so a page that
// came from another instance is told apart).
func InstanceSeed(instance string) uint64 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(instance); i++ {
		h = (h ^ uint64(instance[i])) * 0x100000001b3
	}
	return h
}

// headSegments calls f with the offset of every (local head, token) of a
// page holding n heads, in the model's page layout.
func headSegments(tm transfer.Model, n int, f func(h, t, off int)) {
	for h := 0; h < n; h++ {
		for t := 0; t < tm.PageTokens; t++ {
			off := (t*n + h) * tm.HeadBytes
			if tm.Layout == transfer.HND {
				off = (h*tm.PageTokens + t) * tm.HeadBytes
			}
			f(h, t, off)
		}
	}
}

// stampSegment marks one head of one token: global head, the room's token
// index, instance.
func stampSegment(seg []byte, seed uint64, head, token int) {
	var st [8]byte
	binary.LittleEndian.PutUint64(st[:], uint64(head)<<48|uint64(token&0xffffff)<<24|seed&0xffffff)
	copy(seg, st[:])
}

// FillHeads writes the pattern of (instance seed, room, token, global
// region, global head) into the page at the room's page position pos,
// holding the global heads [first, first+n): each head of each token is a
// template of the room and region, stamped with its global head, its
// token's index in the room (pos × page tokens + slot) and the instance —
// so the decode side can tell that every head of every token landed, from
// the right source, at the right offset, whatever the page sizes of the
// two sides.
func FillHeads(page []byte, tm transfer.Model, first, n int, seed, room uint64, pos, region int) {
	// One template per room and region: it does not depend on where a head
	// or token sits, so the same head-token segment is equal on every TP
	// size, page size and layout.
	var buf [1024]byte
	var tmpl []byte
	if tm.HeadBytes <= len(buf) {
		tmpl = buf[:tm.HeadBytes]
	} else {
		tmpl = make([]byte, tm.HeadBytes)
	}
	Fill(tmpl, room^seed, 0, region)
	headSegments(tm, n, func(h, t, off int) {
		seg := page[off : off+tm.HeadBytes]
		copy(seg, tmpl)
		stampSegment(seg, seed, first+h, pos*tm.PageTokens+t)
	})
}

// CheckHeads reports whether the page at the room's page position pos
// holds FillHeads' pattern for its heads, in its slots of the room's first
// tokens tokens (a room's last page may be partly filled).
func CheckHeads(page []byte, tm transfer.Model, first, n int, seed, room uint64, pos, region, tokens int) bool {
	bp := pagePool.Get().(*[]byte)
	defer pagePool.Put(bp)
	if cap(*bp) < len(page) {
		*bp = make([]byte, len(page))
	}
	want := (*bp)[:len(page)]
	FillHeads(want, tm, first, n, seed, room, pos, region)
	if (pos+1)*tm.PageTokens <= tokens {
		return string(want) == string(page)
	}
	ok := true
	headSegments(tm, n, func(h, t, off int) {
		if pos*tm.PageTokens+t < tokens && string(want[off:off+tm.HeadBytes]) != string(page[off:off+tm.HeadBytes]) {
			ok = false
		}
	})
	return ok
}

var pagePool = sync.Pool{New: func() any { b := []byte(nil); return &b }}
