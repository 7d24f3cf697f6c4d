package transfer

// The layout, topology and write types are package kvlayout's (internal,
// cgo-free, shared with the protocol core); transfer exports them.

import (
	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/nixl"
)

// Layers is a range [Lo, Hi) of a rank's layers; Hi 0 means every layer.
type Layers = kvlayout.Layers

// Layout is one rank's registered KV memory: Regions[i] is layer i/2, K for
// even i and V for odd i, each a run of pages of PageBytes bytes.
type Layout = kvlayout.Layout

// Link is one prefill rank (of the room's DP group) a decode rank pulls a
// room from.
type Link = kvlayout.Link

// Model is what the mapping needs to know of the model, the same on every
// rank of both instances.
type Model = kvlayout.Model

// PageLayout is the order of tokens and heads inside one page of a region.
type PageLayout = kvlayout.PageLayout

// Parallel is a rank's place in its instance: TP within its DP group, PP
// stage, DP group. Sizes of 0 are read as 1.
type Parallel = kvlayout.Parallel

// Ready reports whether the data a write reads is in place (for example a
// CUDA event of the kernel that wrote a layer: gpu.Event.Ready). An error
// fails the write before anything is posted.
type Ready = kvlayout.Ready

// Run is a contiguous stretch of pages: Len pages from Src on the prefill
// side to Dst on the decode side.
type Run = kvlayout.Run

// Slice is what one prefill rank writes into one decode rank's pages: a
// range of heads (local offsets on each side) over the prefill rank's
// regions, into the decode rank's regions shifted by RegionOffset. With
// pages of different sizes its runs count units of the smaller page.
type Slice = kvlayout.Slice

// PageMap maps a room's pages between two page sizes (tokens per page):
// Pair pairs a chunk's prefill pages with the decode pages a REQUEST
// named, in units of the smaller page.
type PageMap = kvlayout.PageMap

// Span is a byte range [Addr, Addr+Len) of registered memory: host memory
// (DRAM) or device Dev's memory (VRAM).
type Span = kvlayout.Span

// StateRegion is one state region of ItemBytes-sized items.
type StateRegion = kvlayout.StateRegion

// Write is one WRITE to one peer: page runs over every KV region (or the
// aux item), with a notification.
type Write = kvlayout.Write

// HND is head-major: for each head, its tokens (vLLM's layout for
// heterogeneous TP). A head slice is one segment per page.
const HND = kvlayout.HND

// NHD is token-major: for each token, its heads (SGLang's MHA pool). A
// head slice is one segment per token per page.
const NHD = kvlayout.NHD

// ProofBytes is the ownership proof slot after each region (KV, aux and
// state) a rank registers: kvbridge writes its process's proof there, and
// a prefill rank reads it back before it writes into the region
// (PROTOCOL.md "Memory proven to its owner"). Memory a Manager allocates
// has it; a region given with an address must be followed by ProofBytes of
// memory the caller owns and never uses (kvbridge registers them with the
// region).
const ProofBytes = kvlayout.ProofBytes

// RegionsPerLayer is K and V (for MLA, the latent split in two halves).
const RegionsPerLayer = kvlayout.RegionsPerLayer

// ErrTopology is a pair of shapes the mapping does not support.
var ErrTopology = kvlayout.ErrTopology

// ExpandSlice turns runs into descriptor pairs for a head slice: for each
// local region, for each page (or unit, when the page sizes differ), one
// segment per head (HND) or per token (NHD); segments contiguous on both
// sides are merged, so a Full slice of contiguous pages is one descriptor
// per run per region, as Expand makes.
func ExpandSlice(runs []Run, local, remote Layout, s *Slice) (l, r []nixl.Desc) {
	return kvlayout.ExpandSlice(runs, local, remote, s)
}

// Plan is what prefill rank p (model src) writes into decode rank d
// (model dst, which may differ only in page tokens): the head slice and
// region offset (nil when it writes nothing there).
func Plan(src, dst Model, p, d Parallel) (*Slice, error) { return kvlayout.Plan(src, dst, p, d) }

// Links maps a decode rank onto a prefill instance (only its sizes are
// read) for one room.
func Links(m Model, prefill, decode Parallel) ([]Link, error) {
	return kvlayout.Links(m, prefill, decode)
}

// Overlap finds two spans that share a byte — the same address space and
// intersecting ranges — and returns their indices (i < j); ok is false
// when no two do. An empty span shares no byte. It sorts a copy of the
// indices: O(n log n) for n spans.
func Overlap(spans []Span) (i, j int, ok bool) { return kvlayout.Overlap(spans) }

// PageRatio checks that two page sizes (tokens per page) can be mapped
// onto each other: one divides the other.
func PageRatio(prefill, decode int) error { return kvlayout.PageRatio(prefill, decode) }

// ParsePageLayout reads "NHD" or "HND" (any case; "" is NHD).
func ParsePageLayout(s string) (PageLayout, error) { return kvlayout.ParsePageLayout(s) }

// Runs groups page pairs (src[i] → dst[i]) into maximal runs where both
// sides are consecutive, so a contiguous chunk becomes one descriptor per
// region instead of one per page.
func Runs(src, dst []uint32) []Run { return kvlayout.Runs(src, dst) }
