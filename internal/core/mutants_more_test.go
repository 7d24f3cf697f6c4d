package core

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/stretchr/testify/require"
)

// Unit tests for the core's mutants from quarantine-now on (scripts/srcmutants):
// each asserts the fixed behaviour, and sees the bug as described when its
// mutant is laid over the package (fixedAndMutant).

// decodeAsked is a decode core whose room 1 sent its REQUEST to
// prefillFrom (epoch 10), effects drained.
func decodeAsked(t *testing.T) *Core {
	t.Helper()
	c := testCore(t, RoleDecode)
	c.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
	c.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
	c.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1}})
	c.Step(t0, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true}})
	reqs := sent[*wire.Request](c.Effects())
	require.Len(t, reqs, 1, "room 1's REQUEST: %v", reqs)
	require.EqualValues(t, 1, reqs[0].Room, "room 1's REQUEST: %v", reqs)
	return c
}

// releases lists the EffectReleased among effects as "room forced".
func releases(effects []Effect) []string {
	var out []string
	for _, e := range effects {
		if e.Kind == EffectReleased {
			out = append(out, fmt.Sprintf("%d %v", e.Room, e.Forced))
		}
	}
	return out
}

// A failed decode room whose REQUEST went out keeps its pages until the
// prefill rank acknowledges a drained abort or QuarantineTimeout passes —
// not at the next Tick.
func TestQuarantineLastsItsTimeout(t *testing.T) {
	fixedAndMutant(t, "quarantine-now", func(t *testing.T, fixed bool) {
		c := decodeAsked(t)
		c.Step(t0, AbortReceiver{Room: 1, Reason: "client went away"})
		c.Effects()
		c.Step(t0.Add(time.Second), Tick{})
		held := c.Hold(1)
		got := releases(c.Effects())
		require.Equal(t, fixed, held, "1 s after the abort: held %v, released %v (want held: %v)", held, got, fixed)
		if !fixed {
			return
		}
		require.Empty(t, got, "1 s after the abort: room 1 released")
		q := c.cfg.QuarantineTimeout
		c.Step(t0.Add(q-time.Second), Tick{})
		if !c.Hold(1) { // the message's releases drain the effects: only on failure
			require.Fail(t, "room 1 released before the quarantine deadline", "released %v before the quarantine deadline (%v)", releases(c.Effects()), q)
		}
		c.Effects()
		c.Step(t0.Add(q+time.Second), Tick{})
		got = releases(c.Effects())
		require.Equal(t, []string{"1 true"}, got, "past the quarantine deadline: released, forced %d", c.Stats().ForcedReleases)
		require.EqualValues(t, 1, c.Stats().ForcedReleases, "past the quarantine deadline: released %v, forced", got)
	})
}

// A room's done waiter is woken once, when the room is terminal: data
// arriving (Transferring) wakes nobody.
func TestDoneWokenOnlyWhenTerminal(t *testing.T) {
	fixedAndMutant(t, "wake-early", func(t *testing.T, fixed bool) {
		c := decodeAsked(t)
		done, _, ok := c.pending(1)
		require.True(t, ok, "room 1's done waiters not pending")
		require.True(t, done, "room 1's done waiters not pending")
		woken := func(effects []Effect) (n int) {
			for _, e := range effects {
				if e.Kind == EffectWake && e.Room == 1 && e.Wake == WakeDone {
					n++
				}
			}
			return n
		}
		c.Step(t0, Notified{Room: 1, UID: 0, Chunk: 0, Total: 0, Aux: false}) // chunk 0 of a room of 2
		st, _ := c.Status(1)
		require.Equal(t, Transferring, st, "room 1 after the first chunk")
		n := woken(c.Effects())
		require.Equal(t, fixed, n == 0, "done woken %d times while Transferring (want none: %v)", n, fixed)
		if !fixed {
			return
		}
		c.Step(t0, Notified{Room: 1, UID: 0, Chunk: 1, Total: 2, Aux: false})
		require.Zero(t, woken(c.Effects()), "room 1's done woken before the aux item")
		c.Step(t0, Notified{Room: 1, UID: 0, Chunk: 0, Total: 0, Aux: true})
		st, _ = c.Status(1)
		require.Equal(t, Success, st, "room 1 after every chunk and the aux")
		require.Equal(t, 1, woken(c.Effects()), "room 1's done woken at Success")
	})
}

// An ABORT that finds a write in flight owes its ABORT_ACK until the write
// completes; then the ACK goes out, drained.
func TestAbortAckSentWhenWritesDrain(t *testing.T) {
	fixedAndMutant(t, "no-abort-ack", func(t *testing.T, fixed bool) {
		c, writes := prefillChunkQueued(t)
		require.Len(t, writes, 1, "the chunk's write was not posted: %d writes", len(writes))
		require.True(t, c.Step(t0, Posting{Room: 1, Write: &writes[0]}).OK, "the chunk's write was not posted")
		c.Effects()
		c.Step(t0, Received{Msg: &wire.Abort{From: decodeFrom, Room: 1, Reason: "client went away"}})
		require.Empty(t, sent[*wire.AbortAck](c.Effects()), "ABORT_ACK for room 1 with a write in flight")
		c.Step(t0.Add(time.Second), WriteDone{Room: 1, Write: &writes[0], Err: nil, Quiesced: false})
		var got []string
		for _, e := range c.Effects() {
			if a, ok := e.Msg.(*wire.AbortAck); ok && e.Kind == EffectSend {
				got = append(got, fmt.Sprintf("%d %v → %s", a.Room, a.Drained, e.To.Endpoint))
			}
		}
		want := "1 true → " + decodeFrom.Endpoint
		ok := len(got) == 1 && got[0] == want
		require.Equal(t, fixed, ok, "after the last write drained: ABORT_ACKs %v, want [%s]: %v", got, want, fixed)
	})
}

// A decode rank heard with a new epoch: the prefill room bound to its old
// epoch fails at once, with reason "peer restarted".
func TestPrefillFailsRoomsOfRestartedPeer(t *testing.T) {
	fixedAndMutant(t, "restart-keeps-rooms", func(t *testing.T, fixed bool) {
		c := testCore(t, RolePrefill)
		register(t, c, decodeFrom)
		c.Step(t0, CreateSender{Room: 1})
		c.Step(t0, InitSender{Room: 1})
		c.Step(t0, Received{Msg: request(1, decodeFrom)})
		c.Step(t0, Received{Msg: request(2, decodeFrom)}) // pending: no sender yet
		st, _ := c.Status(1)
		require.Equal(t, WaitingForInput, st, "room 1")
		c.Effects()
		restarted := decodeFrom
		restarted.Epoch = 2
		c.Step(t0, Received{Msg: &wire.Pong{From: restarted, Seq: 1}})
		st, _ = c.Status(1)
		reason, _ := c.Failure(1)
		ok := st == Failed && strings.Contains(reason, wire.ReasonPeerRestarted) && c.Sizes().Pending == 0
		require.Equal(t, fixed, ok, "after the new epoch: room 1 %v (%q), %d pending", st, reason, c.Sizes().Pending)
		if !fixed {
			return
		}
		// The new process holds none of the old one's rooms: it is not told.
		require.Empty(t, sent[*wire.Status](c.Effects()), "the restarted peer was told")
		// And room 2's sender starts Failed: nothing is written for it.
		require.Equal(t, Failed, c.Step(t0, CreateSender{Room: 2}).Result.Status, "room 2's sender after the restart")
	})
}

// otherDecode is a second decode rank of decodeFrom's instance (a room is
// one decode instance's: its ranks share it).
var otherDecode = func() wire.From {
	o := decodeFrom
	o.Rank, o.Endpoint = 1, "tcp://o:1"
	return o
}()

// registerBoth registers decodeFrom and otherDecode at a prefill core.
func registerBoth(t *testing.T, c *Core) {
	t.Helper()
	register(t, c, decodeFrom)
	register(t, c, otherDecode)
}

// twoDecodePeers is a prefill core with decodeFrom and otherDecode
// registered; it returns the core and the other rank.
func twoDecodePeers(t *testing.T) (*Core, wire.From) {
	t.Helper()
	c := testCore(t, RolePrefill)
	registerBoth(t, c)
	return c, otherDecode
}

// A room that holds its Required requests refuses one more (live or
// pending), telling the extra peer.
func TestExtraRequestRefused(t *testing.T) {
	fixedAndMutant(t, "extra-request-accepted", func(t *testing.T, fixed bool) {
		c, other := twoDecodePeers(t)
		c.Step(t0, CreateSender{Room: 1})
		c.Step(t0, InitSender{Room: 1})
		require.True(t, c.Step(t0, Received{Msg: request(1, decodeFrom)}).OK, "a first request was refused: room 1")
		require.True(t, c.Step(t0, Received{Msg: request(2, decodeFrom)}).OK, "a first request was refused: room 2")
		c.Effects()
		for _, room := range []uint64{1, 2} { // live, pending
			accepted := c.Step(t0, Received{Msg: request(room, other)}).OK
			st := sent[*wire.Status](c.Effects())
			require.Equal(t, !fixed, accepted, "room %d: a second request with required 1 accepted: %v (statuses %+v)", room, accepted, st)
			if fixed {
				require.Len(t, st, 1, "room %d: refusal %+v", room, st)
				require.Equal(t, room, st[0].Room, "room %d: refusal %+v", room, st)
				require.Equal(t, CodeRejected, st[0].Code, "room %d: refusal %+v", room, st)
				require.Contains(t, st[0].Reason, "request 2 of 1", "room %d: refusal %+v", room, st)
			}
		}
		n := len(c.reg.Requests(1))
		if fixed {
			require.Equal(t, 1, n, "room 1 holds requests, required 1")
		}
	})
}

// MaxTombstones bounds the remembered room ids: past it the oldest are
// forgotten early, the newest still refuse their id.
func TestTombstonesBounded(t *testing.T) {
	fixedAndMutant(t, "tombstone-bound-ignored", func(t *testing.T, fixed bool) {
		reg := simRegistryConfig()
		reg.MaxTombstones = 8
		c := newTestCore(t, RolePrefill, reg)
		for room := uint64(1); room <= 50; room++ {
			c.Step(t0, CreateSender{Room: room})
			c.Step(t0, ClearSender{Room: room})
		}
		n := c.Sizes().Tombstones
		require.Equal(t, fixed, n <= 8, "%d tombstones after 50 clears, bound 8 (want within: %v)", n, fixed)
		if !fixed {
			return
		}
		require.Equal(t, Rejected, c.Step(t0, CreateSender{Room: 50}).Result.Outcome, "the newest cleared id, room 50, reused at once")
		res := c.Step(t0, CreateSender{Room: 1}).Result
		require.Equal(t, Applied, res.Outcome, "the oldest id, room 1, forgotten early, is still refused: %v", res.Err)
	})
}

// An ABORT_ACK with drained false (writes may still land) does not end the
// quarantine; a drained one from the same process does.
func TestNotDrainedAckKeepsPages(t *testing.T) {
	fixedAndMutant(t, "not-drained-releases", func(t *testing.T, fixed bool) {
		c := decodeAsked(t)
		c.Step(t0, AbortReceiver{Room: 1, Reason: "client went away"})
		c.Effects()
		c.Step(t0, Received{Msg: &wire.AbortAck{From: prefillFrom, Room: 1, Drained: false}})
		if held := c.Hold(1); held != fixed { // the message's releases drain the effects: only on failure
			require.Fail(t, "room 1 held or released against the fixed core", "after drained=false: held %v, released %v", held, releases(c.Effects()))
		}
		if !fixed {
			return
		}
		c.Step(t0.Add(time.Second), Received{Msg: &wire.AbortAck{From: prefillFrom, Room: 1, Drained: true}})
		require.Equal(t, []string{"1 false"}, releases(c.Effects()), "after drained=true: released")
	})
}

// A late STATUS failed from the prefill rank's old process (epoch 10) does
// not fail a room whose REQUEST went to the new one (epoch 11); the new
// process's STATUS does.
func TestStaleStatusIgnored(t *testing.T) {
	fixedAndMutant(t, "stale-status-fails", func(t *testing.T, fixed bool) {
		c := decodeAsked(t)
		restarted := prefillFrom
		restarted.Epoch = 11
		c.Step(t0, Received{Msg: &wire.RegisterAck{From: restarted, OK: true}}) // restart in place: room 1 fails
		st, _ := c.Status(1)
		require.Equal(t, Failed, st, "room 1 bound to the old epoch")
		c.Step(t0, CreateReceiver{Room: 2, Targets: []Target{prefillT}})
		c.Step(t0, InitReceiver{Room: 2, Spec: RequestSpec{DstPages: []uint32{2}, AuxIndex: -1}})
		require.Contains(t, sends(c.Effects()), "REQUEST 2 → tcp://p:1", "room 2 not asked of the new process")
		c.Step(t0, Received{Msg: &wire.Status{From: prefillFrom, Room: 2, Status: wire.StatusFailed, Code: CodeFailed, Reason: "late"}})
		st, _ = c.Status(2)
		require.Equal(t, fixed, st == WaitingForInput, "room 2 after the old process's STATUS: %v (want untouched: %v)", st, fixed)
		if !fixed {
			return
		}
		c.Step(t0, Received{Msg: &wire.Status{From: restarted, Room: 2, Status: wire.StatusFailed, Code: CodeFailed, Reason: "write failed"}})
		r, _ := c.Failure(2)
		require.Contains(t, r, "write failed", "room 2 after the new process's STATUS")
	})
}

// MaxPendingPerPeer: one decode rank cannot hold more rooms pending; the
// others still can.
func TestPendingPerPeerBounded(t *testing.T) {
	fixedAndMutant(t, "pending-bound-ignored", func(t *testing.T, fixed bool) {
		reg := simRegistryConfig()
		reg.MaxPendingPerPeer = 4
		c := newTestCore(t, RolePrefill, reg)
		registerBoth(t, c)
		other := otherDecode
		accepted := 0
		for room := uint64(1); room <= 7; room++ {
			if c.Step(t0, Received{Msg: request(room, decodeFrom)}).OK {
				accepted++
			}
		}
		refused := sent[*wire.Status](c.Effects())
		ok := accepted == 4 && c.Sizes().Pending == 4 && len(refused) == 3
		require.Equal(t, fixed, ok, "%d of 7 accepted, %d pending, %d refused; bound 4 (want kept: %v)", accepted, c.Sizes().Pending, len(refused), fixed)
		if fixed {
			require.True(t, c.Step(t0, Received{Msg: request(100, other)}).OK, "another peer was locked out (room 100 of %s)", other.Peer())
		}
	})
}

// One Sweep that fails many rooms tells their peers in room order, every
// time (the same inputs give the same effects).
func TestSweepInRoomOrder(t *testing.T) {
	fixedAndMutant(t, "sweep-map-order", func(t *testing.T, fixed bool) {
		const rooms = 20
		ordered := true
		for run := 0; run < 5; run++ {
			c := testCore(t, RolePrefill)
			register(t, c, decodeFrom)
			for room := uint64(1); room <= rooms; room++ {
				c.Step(t0, CreateSender{Room: room})
				c.Step(t0, Received{Msg: request(room, decodeFrom)})
			}
			c.Effects()
			c.Step(t0.Add(c.cfg.Registry.BootstrapTimeout+time.Second), Tick{})
			var told []uint64
			for _, st := range sent[*wire.Status](c.Effects()) {
				told = append(told, st.Room)
			}
			require.Len(t, told, rooms, "run %d: rooms told", run)
			ordered = ordered && slices.IsSorted(told)
			if fixed {
				require.True(t, ordered, "run %d: rooms told in the order %v", run, told)
			}
		}
		require.Equal(t, fixed, ordered, "effects in room order over 5 runs: %v, want %v", ordered, fixed)
	})
}
