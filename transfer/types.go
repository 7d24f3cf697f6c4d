package transfer

import (
	"errors"
	"fmt"
	"strings"
)

// ProofBytes is the ownership proof slot after each region (KV, aux and
// state) a rank registers: kvbridge writes its process's proof there, and
// a prefill rank reads it back before it writes into the region
// (PROTOCOL.md "Memory proven to its owner"). Memory a Manager allocates
// has it; a region given with an address must be followed by ProofBytes of
// memory the caller owns and never uses (kvbridge registers them with the
// region).
const ProofBytes = 64

// Layout is one rank's registered KV memory: Regions[i] is layer i/2, K for
// even i and V for odd i, each a run of pages of PageBytes bytes.
type Layout struct {
	Kind      MemKind
	Regions   []Desc // one per layer and K/V, in layer order, K before V
	PageBytes uint64
	// Aux holds per-request auxiliary items (AuxItemBytes each).
	Aux          Desc
	AuxItemBytes uint64
	// State regions hold per-request state items (e.g. a hybrid model's
	// recurrent state), written with the last chunk. Host memory.
	State []StateRegion
}

// StateRegion is one state region of ItemBytes-sized items.
type StateRegion struct {
	Desc
	ItemBytes uint64
}

// PageLayout is the order of tokens and heads inside one page of a region.
type PageLayout uint8

// Page layouts.
const (
	// NHD is token-major: for each token, its heads (SGLang's MHA pool). A
	// head slice is one segment per token per page.
	NHD PageLayout = iota
	// HND is head-major: for each head, its tokens (vLLM's layout for
	// heterogeneous TP). A head slice is one segment per page.
	HND
)

func (l PageLayout) String() string {
	switch l {
	case NHD:
		return "NHD"
	case HND:
		return "HND"
	}
	return fmt.Sprintf("PageLayout(%d)", uint8(l))
}

// ParsePageLayout reads "NHD" or "HND" (any case; "" is NHD).
func ParsePageLayout(s string) (PageLayout, error) {
	switch strings.ToUpper(s) {
	case "", "NHD":
		return NHD, nil
	case "HND":
		return HND, nil
	}
	return 0, fmt.Errorf("transfer: page layout %q is not NHD or HND", s)
}

// RegionsPerLayer is K and V (for MLA, the latent split in two halves).
const RegionsPerLayer = 2

// Model is what the mapping needs to know of the model, the same on every
// rank of both instances.
type Model struct {
	Layers     int // over all PP stages
	KVHeads    int // KV heads of the model; MLA's latent counts as 1, held by every rank
	HeadBytes  int // bytes of one head of one token in one region
	PageTokens int
	MLA        bool
	Layout     PageLayout
}

// Parallel is a rank's place in its instance: TP within its DP group, PP
// stage, DP group. Sizes of 0 are read as 1.
type Parallel struct {
	TPSize, TPRank int
	PPSize, PPRank int
	DPSize, DPRank int
}

// Norm returns p with zero sizes set to 1.
func (p Parallel) Norm() Parallel {
	p.TPSize, p.PPSize, p.DPSize = max(p.TPSize, 1), max(p.PPSize, 1), max(p.DPSize, 1)
	return p
}

// Validate checks ranks against sizes.
func (p Parallel) Validate() error {
	p = p.Norm()
	switch {
	case p.TPRank < 0 || p.TPRank >= p.TPSize:
		return fmt.Errorf("transfer: TP rank %d outside [0, %d)", p.TPRank, p.TPSize)
	case p.PPRank < 0 || p.PPRank >= p.PPSize:
		return fmt.Errorf("transfer: PP rank %d outside [0, %d)", p.PPRank, p.PPSize)
	case p.DPRank < 0 || p.DPRank >= p.DPSize:
		return fmt.Errorf("transfer: DP rank %d outside [0, %d)", p.DPRank, p.DPSize)
	}
	return nil
}

// Global is the rank's index in its instance: ((dp × PP) + pp) × TP + tp.
func (p Parallel) Global() int {
	p = p.Norm()
	return (p.DPRank*p.PPSize+p.PPRank)*p.TPSize + p.TPRank
}

func (p Parallel) String() string {
	p = p.Norm()
	return fmt.Sprintf("tp %d/%d pp %d/%d dp %d/%d", p.TPRank, p.TPSize, p.PPRank, p.PPSize, p.DPRank, p.DPSize)
}

// Heads returns the global KV heads [first, first+n) a TP rank holds. With
// fewer heads than ranks, each head is replicated on TP/KVHeads ranks.
func (m Model) Heads(tpSize, tpRank int) (first, n int, err error) {
	switch {
	case m.KVHeads >= tpSize && m.KVHeads%tpSize == 0:
		n = m.KVHeads / tpSize
		return tpRank * n, n, nil
	case m.KVHeads < tpSize && tpSize%m.KVHeads == 0:
		return tpRank * m.KVHeads / tpSize, 1, nil
	}
	return 0, 0, fmt.Errorf("transfer: %d KV heads do not divide over TP %d (nor TP over the heads)", m.KVHeads, tpSize)
}

// StageLayers returns the layers [first, first+n) of a PP stage: stage s
// holds layers [s·L/PP, (s+1)·L/PP).
func (m Model) StageLayers(ppSize, ppRank int) (first, n int) {
	first = ppRank * m.Layers / ppSize
	return first, (ppRank+1)*m.Layers/ppSize - first
}

// PageBytes is one page of one region on a rank of TP size tpSize.
func (m Model) PageBytes(tpSize int) (uint64, error) {
	_, n, err := m.Heads(tpSize, 0)
	return uint64(m.PageTokens) * uint64(n) * uint64(m.HeadBytes), err
}

// ErrTopology is a pair of shapes the mapping does not support.
var ErrTopology = errors.New("transfer: unsupported topology")

// Ready reports whether the data a write reads is in place (for example a
// CUDA event of the kernel that wrote a layer, queried with cuEventQuery). An error
// fails the write before anything is posted.
type Ready func() (bool, error)
