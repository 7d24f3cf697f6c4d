// Package sender is the prefill-side handle for one room. It holds no state
// of its own: the room lives in the rank's protocol core, so an ABORT that
// arrived before New makes the handle start Failed.
//
//	s, err := sender.New(prefill, room) // ErrRoomInUse / ErrRoomCleared on a duplicate id
//	s.Init()
//	s.WaitReady(ctx)                    // every decode rank's REQUEST is in
//	s.Send(pages[:64], false, -1)
//	s.Send(pages[64:], true, auxSlot)
//	st, err := s.Wait(ctx)              // Success or Failed
//	s.Clear()
package sender

import (
	"context"
	"fmt"

	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/transfer"
)

// Sender sends one room's KV cache.
type Sender struct {
	p    *kvmanager.Prefill
	room uint64
}

// New creates the room on this prefill rank. A room aborted before New
// starts Failed (Poll says so, Failure says why); a live or recently cleared
// duplicate id is an error.
func New(p *kvmanager.Prefill, room uint64) (*Sender, error) {
	if err := p.CreateSender(room); err != nil {
		return nil, fmt.Errorf("sender: %w", err)
	}
	return &Sender{p: p, room: room}, nil
}

// Room returns the room id.
func (s *Sender) Room() uint64 { return s.room }

// Init marks the sender ready: once every required decode rank has sent
// its request, the room is WaitingForInput.
func (s *Sender) Init() error {
	if err := s.p.InitSender(s.room); err != nil {
		return fmt.Errorf("sender: %w", err)
	}
	return nil
}

// Send queues a chunk of prefill pages; their destinations continue where
// the previous chunk's ended. It may come before WaitReady (after Init):
// the chunks are then kept and planned when the last decode rank's
// REQUEST arrives, on the control loop, which posts the room's first
// write at once (docs/PROTOCOL.md "Chunks handed over early"); a kept
// chunk the REQUESTs cannot take (one ending inside a larger decode
// page) then fails the room, as Failure says, instead of an error here. The last chunk also writes the state items
// (state[i]: this rank's items of state region i, where the decode rank
// asked for them) and then aux item auxIndex (−1 for none). When a decode
// rank's pages hold more tokens than this rank's, every chunk but the last
// must end on one of its page boundaries (kvmanager.ErrBadChunk
// otherwise, and the room is left as it was).
func (s *Sender) Send(pages []uint32, last bool, auxIndex int, state ...[]uint32) error {
	return s.p.SendChunk(s.room, pages, last, auxIndex, state)
}

// SendLayers queues layers [lo, hi) of a chunk (this rank's layers, 0 …
// Layers()−1) as soon as ready says the data is in place (nil: now), so
// a chunk's transfer overlaps its forward pass. A chunk is sent by calls
// with consecutive ranges from 0 to Layers(), each naming the same pages,
// last and auxIndex (the state items given with the final range are the
// ones written); each call is one layer group (one write and
// one notification per decode rank). Send is SendLayers over every layer.
//
//	for l := 0; l < s.Layers(); l++ {
//		forward(l)                      // your kernel writes layer l's KV into pages
//		ev := engine.RecordEvent(l)     // your CUDA event, after that kernel
//		s.SendLayers(pages, l, l+1, last, aux, ev.Query) // transfer.Ready: cuEventQuery
//	}
//	// destroy your events once the room is over (Wait returned)
func (s *Sender) SendLayers(pages []uint32, lo, hi int, last bool, auxIndex int, ready transfer.Ready, state ...[]uint32) error {
	return s.p.SendLayers(s.room, pages, lo, hi, last, auxIndex, ready, state)
}

// Layers is how many layers this prefill rank holds (SendLayers' range).
func (s *Sender) Layers() int { return s.p.Layers() }

// WaitReady blocks until every required decode rank has requested the room
// (WaitingForInput) or the room is over, and returns the status.
func (s *Sender) WaitReady(ctx context.Context) (kvmanager.Poll, error) {
	return s.p.WaitReady(ctx, s.room)
}

// Poll returns the room's status (0 once cleared).
func (s *Sender) Poll() kvmanager.Poll {
	st, _ := s.p.Status(s.room)
	return st
}

// Wait blocks until the room is Success or Failed.
func (s *Sender) Wait(ctx context.Context) (kvmanager.Poll, error) {
	return s.p.Wait(ctx, s.room)
}

// Abort fails the room; decode ranks are told.
func (s *Sender) Abort(reason string) { s.p.Abort(s.room, reason) }

// Failure returns the first failure reason ("" unless Failed).
func (s *Sender) Failure() string { return s.p.Failure(s.room) }

// Released is closed once the room's pages may be reused. A room that
// decode ranks pull (docs/PROTOCOL.md "Pull") holds its published pages
// until every decode rank said its reads are over and drained, or until
// the quarantine past its lease: a failed pull room's pages may still be
// read until then, whatever Wait returned. A pushed room holds nothing
// here (closed at once): its pages are free once Wait returns Success.
func (s *Sender) Released() <-chan struct{} { return s.p.Released(s.room) }

// Clear forgets the room; its id stays refused for the tombstone TTL.
// Writes still in flight keep being counted, so an ABORT_ACK for the room
// is only sent once none of them can land.
func (s *Sender) Clear() { s.p.Clear(s.room) }
