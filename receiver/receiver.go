// Package receiver is the decode-side handle for one room: the room is
// created with its prefill target (so an abort before Init reaches it), the
// rank registers once per prefill peer, sends the room's request, counts
// notifications per prefill rank, and after an abort or failure keeps the
// destination pages quarantined until every prefill rank that got the
// request acknowledges that nothing can land (or the quarantine deadline
// passes) — also after Clear.
//
//	r, err := receiver.NewFor(decode, room, url, kvmanager.AutoDP) // or New, NewFrom
//	err = r.Init(ctx, kvmanager.RequestSpec{DstPages: pages, AuxIndex: slot})
//	st, err := r.Wait(ctx)              // Success: every page and the aux item are in place
//	r.Clear()
//	<-r.Released()                      // before reusing the pages of a failed room
package receiver

import (
	"context"
	"fmt"

	"github.com/kvbridge/kvbridge/kvmanager"
)

// Receiver receives one room's KV cache.
type Receiver struct {
	d    *kvmanager.Decode
	room uint64
}

// New creates the room on this decode rank, receiving from the rank's
// default prefill instance (Config.BootstrapURL; with a Model, the DP group
// room % dp_size and the prefill ranks the rank mapping gives; without,
// Config.PrefillRank).
func New(d *kvmanager.Decode, room uint64) (*Receiver, error) {
	return NewFor(d, room, "", kvmanager.AutoDP)
}

// NewFor creates the room receiving from a prefill instance the router chose
// for it: its bootstrap address ("": Config.BootstrapURL) and, with DP
// attention, its DP group (kvmanager.AutoDP: room % dp_size;
// kvmanager.LookupDP: as the prefill rank published it). The instance's topology is looked up
// once and cached; an unsupported pair of shapes is refused here.
func NewFor(d *kvmanager.Decode, room uint64, bootstrap string, dp int) (*Receiver, error) {
	if err := d.CreateReceiverFor(room, bootstrap, dp); err != nil {
		return nil, fmt.Errorf("receiver: %w", err)
	}
	return &Receiver{d: d, room: room}, nil
}

// NewFrom creates the room receiving from the given prefill ranks.
func NewFrom(d *kvmanager.Decode, room uint64, targets ...kvmanager.Target) (*Receiver, error) {
	if err := d.CreateReceiver(room, targets...); err != nil {
		return nil, fmt.Errorf("receiver: %w", err)
	}
	return &Receiver{d: d, room: room}, nil
}

// Room returns the room id.
func (r *Receiver) Room() uint64 { return r.room }

// Init registers with the prefill ranks (once per peer, retried until
// acknowledged) and sends the request. A refused registration
// (incompatible layout) is returned; a room that failed before or while
// its request went out (aborted, or a prefill rank declared dead) returns
// an error wrapping kvmanager.ErrRoomFailed with the reason. After any
// error a REQUEST may already be with some prefill ranks: Abort (or
// Clear), and reuse the destination pages only once Released is closed.
func (r *Receiver) Init(ctx context.Context, spec kvmanager.RequestSpec) error {
	if err := r.d.InitReceiver(ctx, r.room, spec); err != nil {
		return fmt.Errorf("receiver: %w", err)
	}
	return nil
}

// Poll returns the room's status (0 once cleared).
func (r *Receiver) Poll() kvmanager.Poll {
	st, _ := r.d.Status(r.room)
	return st
}

// Wait blocks until the room is Success or Failed.
func (r *Receiver) Wait(ctx context.Context) (kvmanager.Poll, error) {
	return r.d.Wait(ctx, r.room)
}

// Abort fails the room and asks the prefill ranks to stop (also before
// Init); the pages stay quarantined until Released is closed.
func (r *Receiver) Abort(reason string) { r.d.Abort(r.room, reason) }

// Released is closed once the destination pages may be reused: after
// Success, or after an abort or failure once nothing can land. It stays
// valid after Clear.
func (r *Receiver) Released() <-chan struct{} { return r.d.Released(r.room) }

// Report says what of the room landed (positions of the spec's DstPages ×
// layers, per prefill rank, and Whole across them) and the failure's code,
// so an engine can recompute only what is missing. ok is false until
// nothing more can land: wait for Released after a failure, and read it
// before Clear.
func (r *Receiver) Report() (kvmanager.LoadReport, bool) { return r.d.Report(r.room) }

// Failure returns the first failure reason, naming the peer.
func (r *Receiver) Failure() string { return r.d.Failure(r.room) }

// Clear forgets the room. An unfinished room is aborted first.
func (r *Receiver) Clear() { r.d.Clear(r.room) }
