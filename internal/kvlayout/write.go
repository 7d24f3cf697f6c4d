package kvlayout

import "github.com/kvbridge/kvbridge/transfer"

// Write is one WRITE to one peer: page runs over every KV region (or the
// aux item), with a notification.
type Write struct {
	Remote string // the peer's nixl agent name
	Peer   Layout // the peer's registered memory
	Runs   []Run  // KV pages; empty with AuxSrc ≥ 0 for the aux write
	// AuxSrc/AuxDst copy one aux item instead of pages (−1: not an aux write).
	AuxSrc, AuxDst int
	// State ≥ 0 makes Runs item runs of that state region instead of pages.
	State int
	// Slice (optional) writes a head slice into the peer's pages (the rank
	// mapping): heads and a region offset instead of whole pages.
	Slice *Slice
	// Layers [Lo, Hi) restricts a page write to those layers of this
	// rank (regions 2·Lo … 2·Hi−1); the zero value writes every layer.
	Layers Layers
	// Ready (optional) is asked before the write is posted: the worker
	// posts other rooms' writes until it answers true (a layer's kernel
	// finished), and fails the write, unposted, on its error or when it
	// has not answered true within the stall timeout.
	Ready Ready
	Notif string // "" for a write without a notification
	// Digest: the pool appends the CRC-32C of each destination page the
	// write fills to Notif, summed from the source right before the post
	// (docs/PROTOCOL.md "Digest"; a VRAM source on the device, by the
	// digest kernel).
	Digest bool
	Last   bool // the room's final write to this peer
	// PeerKey and Epoch name the decode process whose REQUEST gave the
	// destination; the pool carries them for the gate, never reads them.
	PeerKey string
	Epoch   uint64
}

// Layers is a range [Lo, Hi) of a rank's layers; Hi 0 means every layer.
type Layers struct{ Lo, Hi int }

// Regions returns the KV region range [lo, hi) the layers cover out of n
// regions (two per layer, K before V), clipped to them.
func (l Layers) Regions(n int) (lo, hi int) {
	if l.Hi == 0 {
		return 0, n
	}
	return min(max(2*l.Lo, 0), n), min(max(2*l.Hi, 0), n)
}

// Ready: transfer.Ready.
type Ready = transfer.Ready

// Bytes is how many bytes the write moves out of a source of layout l:
// the aux item, its state items, or its pages in the layers it writes
// (every head of them: a head slice moves no more).
func (w *Write) Bytes(l Layout) uint64 {
	if w.AuxSrc >= 0 {
		return l.AuxItemBytes
	}
	if w.State >= 0 {
		var n uint64
		for _, r := range w.Runs {
			n += uint64(r.Len) * l.State[w.State].ItemBytes
		}
		return n
	}
	lo, hi := w.Layers.Lo, w.Layers.Hi
	if hi == 0 {
		lo, hi = 0, len(l.Regions)/2
	}
	regions := uint64(2 * max(min(hi, len(l.Regions)/2)-max(lo, 0), 0))
	var n uint64
	for _, r := range w.Runs {
		n += uint64(r.Len) * l.PageBytes * regions
	}
	return n
}
