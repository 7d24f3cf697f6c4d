// Package receiver is the decode-side handle for one room: it resolves the
// prefill rank through the bootstrap server, registers once per peer, sends
// the room's request, counts notifications per prefill rank, and after an
// abort keeps the destination pages quarantined until the prefill rank
// acknowledges that nothing is in flight (or the stall deadline passes).
//
//	r, err := receiver.New(mgr, room)
//	err = r.Init(ctx, kvmanager.RequestSpec{DstPages: pages, AuxIndex: slot})
//	st, err := r.Wait(ctx)          // Success: every page and the aux item are in place
//	r.Clear()
package receiver

import (
	"context"
	"fmt"

	"github.com/kvbridge/kvbridge/kvmanager"
)

// Receiver receives one room's KV cache.
type Receiver struct {
	m    *kvmanager.Manager
	room uint64
}

// New creates the room on this decode rank.
func New(m *kvmanager.Manager, room uint64) (*Receiver, error) {
	res := m.CreateReceiver(room)
	if res.Outcome == kvmanager.Rejected {
		return nil, fmt.Errorf("receiver: %w", res.Err)
	}
	return &Receiver{m: m, room: room}, nil
}

// Room returns the room id.
func (r *Receiver) Room() uint64 { return r.room }

// Init registers with the prefill rank (once per peer) and sends the
// request. A refused registration (incompatible layout) is returned.
func (r *Receiver) Init(ctx context.Context, spec kvmanager.RequestSpec) error {
	if err := r.m.SendRequest(ctx, r.room, spec); err != nil {
		return fmt.Errorf("receiver: %w", err)
	}
	return nil
}

// Poll returns the room's status (0 once cleared).
func (r *Receiver) Poll() kvmanager.Poll {
	st, _ := r.m.Registry().Status(r.room)
	return st
}

// Wait blocks until the room is Success or Failed.
func (r *Receiver) Wait(ctx context.Context) (kvmanager.Poll, error) {
	return r.m.Registry().Wait(ctx, r.room)
}

// Abort fails the room and asks the prefill rank to stop; the pages stay
// quarantined until Released is closed.
func (r *Receiver) Abort(reason string) { r.m.AbortRoom(r.room, reason) }

// Released is closed once the destination pages may be reused after an
// abort or failure (nil if the request was never sent).
func (r *Receiver) Released() <-chan struct{} { return r.m.Released(r.room) }

// Failure returns the first failure reason, naming the peer.
func (r *Receiver) Failure() string {
	s, _ := r.m.Registry().Failure(r.room)
	return s
}

// Clear forgets the room.
func (r *Receiver) Clear() { r.m.ClearRoom(r.room) }
