package kvmanager

import (
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/stretchr/testify/require"
)

// TestEffectsCarriedOutInStepOrder: a rank's effects are carried out after
// the core's lock is let go, and still in the order of the steps that
// produced them. Step A (an ABORT of room 1 from a decode rank: its answer
// is an ABORT_ACK) lets go of the lock and, before carrying out its
// effects, lets step B (the same for room 2) run its core work; B's
// ABORT_ACK must still be handed to the control loop after A's (here B,
// coming to carry first, carries A's effects and then its own).
func TestEffectsCarriedOutInStepOrder(t *testing.T) {
	p := newTestPrefill(t)
	m := p.Manager
	decode := wire.From{Role: wire.RoleDecode, Instance: "d", Endpoint: "tcp://127.0.0.1:1", Epoch: 1}
	abort := func(room uint64, coreDone chan<- struct{}) {
		m.step(func(c *core.Core, now time.Time) {
			c.Step(now, core.Received{Msg: &wire.Abort{From: decode, Room: room, Reason: "order test"}})
			if coreDone != nil {
				close(coreDone)
			}
		})
	}
	var order []uint64
	onSend := func(msg wire.Message) {
		if a, ok := msg.(*wire.AbortAck); ok {
			order = append(order, a.Room) // in the step's turn (or, without turns, racing: -race reports it)
		}
	}
	m.onSend.Store(&onSend)
	bCore, bDone := make(chan struct{}), make(chan struct{})
	first := true
	afterUnlock := func() {
		if !first {
			return
		}
		first = false
		go func() {
			defer close(bDone)
			abort(2, bCore)
		}()
		<-bCore // B stepped the core while A's effects wait
		// and B's step is over (B carried A's effects first, A's ticket
		// being the earlier) before A comes to carry: a ticket taken after
		// the lock is let go would be B's first, deterministically.
		<-bDone
	}
	m.afterUnlock.Store(&afterUnlock)
	abort(1, nil)
	<-bDone
	m.afterUnlock.Store(nil)
	m.onSend.Store(nil)
	require.Equal(t, []uint64{1, 2}, order, "ABORT_ACKs handed to the loop for rooms, want [1 2] (the steps' order)")
}
