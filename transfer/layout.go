package transfer

// The layout and topology types an engine describes its ranks with. They
// are package kvlayout's (internal, cgo-free, shared with the protocol
// core and the prefill rank's worker pool, internal/pool).

import (
	"github.com/kvbridge/kvbridge/internal/kvlayout"
)

// Layout is one rank's registered KV memory: Regions[i] is layer i/2, K for
// even i and V for odd i, each a run of pages of PageBytes bytes.
type Layout = kvlayout.Layout

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

// StateRegion is one state region of ItemBytes-sized items.
type StateRegion = kvlayout.StateRegion

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

// ParsePageLayout reads "NHD" or "HND" (any case; "" is NHD).
func ParsePageLayout(s string) (PageLayout, error) { return kvlayout.ParsePageLayout(s) }
