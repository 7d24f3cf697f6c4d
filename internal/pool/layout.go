package pool

// The layout, topology and write types the pool works with are package
// kvlayout's (internal, cgo-free, shared with the protocol core); the
// public ones are package transfer's.

import "github.com/kvbridge/kvbridge/internal/kvlayout"

type (
	Layers      = kvlayout.Layers
	Layout      = kvlayout.Layout
	Link        = kvlayout.Link
	Model       = kvlayout.Model
	PageLayout  = kvlayout.PageLayout
	Parallel    = kvlayout.Parallel
	Ready       = kvlayout.Ready
	Run         = kvlayout.Run
	Slice       = kvlayout.Slice
	PageMap     = kvlayout.PageMap
	Span        = kvlayout.Span
	StateRegion = kvlayout.StateRegion
	Write       = kvlayout.Write
)

const (
	HND             = kvlayout.HND
	NHD             = kvlayout.NHD
	ProofBytes      = kvlayout.ProofBytes
	RegionsPerLayer = kvlayout.RegionsPerLayer
)
