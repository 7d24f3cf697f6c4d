// Package sender is the prefill-side handle for one room. It holds no state
// of its own: the room lives in the rank's kvmanager registry, so an ABORT
// that arrived before New makes the handle start Failed.
//
//	s, err := sender.New(mgr, room)   // ErrRoomInUse / ErrRoomCleared on a duplicate id
//	s.Init()
//	for s.Poll() == kvmanager.Bootstrapping { ... }   // or Wait for WaitingForInput
//	s.Send(pages[:64], false, -1)
//	s.Send(pages[64:], true, auxSlot)
//	st, err := s.Wait(ctx)            // Success or Failed
//	s.Clear()
package sender

import (
	"context"
	"fmt"

	"github.com/kvbridge/kvbridge/kvmanager"
)

// Sender sends one room's KV cache.
type Sender struct {
	m    *kvmanager.Manager
	room uint64
}

// New creates the room on this prefill rank. A room aborted before New
// starts Failed (Poll says so, Failure says why); a live or recently cleared
// duplicate id is an error.
func New(m *kvmanager.Manager, room uint64) (*Sender, error) {
	res := m.CreateSender(room)
	if res.Outcome == kvmanager.Rejected {
		return nil, fmt.Errorf("sender: %w", res.Err)
	}
	return &Sender{m: m, room: room}, nil
}

// Room returns the room id.
func (s *Sender) Room() uint64 { return s.room }

// Init marks the sender ready: once every required decode rank has sent
// its request, the room is WaitingForInput.
func (s *Sender) Init() error {
	if res := s.m.InitSender(s.room); res.Outcome == kvmanager.Rejected {
		return fmt.Errorf("sender: %w", res.Err)
	}
	return nil
}

// Send queues a chunk of prefill pages; their destinations continue where
// the previous chunk's ended. The last chunk also writes the state items
// (state[i]: this rank's items of state region i, where the decode rank
// asked for them) and then aux item auxIndex (−1 for none).
func (s *Sender) Send(pages []uint32, last bool, auxIndex int, state ...[]uint32) error {
	return s.m.SendChunk(s.room, pages, last, auxIndex, state)
}

// WaitReady blocks until every required decode rank has requested the room
// (WaitingForInput) or the room is over, and returns the status.
func (s *Sender) WaitReady(ctx context.Context) (kvmanager.Poll, error) {
	return s.m.Registry().WaitReady(ctx, s.room)
}

// Poll returns the room's status (0 once cleared).
func (s *Sender) Poll() kvmanager.Poll {
	st, _ := s.m.Registry().Status(s.room)
	return st
}

// Wait blocks until the room is Success or Failed.
func (s *Sender) Wait(ctx context.Context) (kvmanager.Poll, error) {
	return s.m.Registry().Wait(ctx, s.room)
}

// Abort fails the room; decode ranks are told.
func (s *Sender) Abort(reason string) { s.m.AbortRoom(s.room, reason) }

// Failure returns the first failure reason ("" unless Failed).
func (s *Sender) Failure() string {
	r, _ := s.m.Registry().Failure(s.room)
	return r
}

// Clear forgets the room; its id stays refused for the tombstone TTL.
func (s *Sender) Clear() { s.m.ClearRoom(s.room) }
