package core

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/wire"
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
	if reqs := sent[*wire.Request](c.Effects()); len(reqs) != 1 || reqs[0].Room != 1 {
		t.Fatalf("room 1's REQUEST: %v", reqs)
	}
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
		if got := releases(c.Effects()); held != fixed || (fixed && len(got) != 0) {
			t.Fatalf("1 s after the abort: held %v, released %v (want held: %v)", held, got, fixed)
		}
		if !fixed {
			return
		}
		q := c.cfg.QuarantineTimeout
		c.Step(t0.Add(q-time.Second), Tick{})
		if held := c.Hold(1); !held {
			t.Fatalf("released %v before the quarantine deadline (%v)", releases(c.Effects()), q)
		}
		c.Effects()
		c.Step(t0.Add(q+time.Second), Tick{})
		if got := releases(c.Effects()); len(got) != 1 || got[0] != "1 true" || c.Stats().ForcedReleases != 1 {
			t.Fatalf("past the quarantine deadline: released %v, forced %d", got, c.Stats().ForcedReleases)
		}
	})
}

// A room's done waiter is woken once, when the room is terminal: data
// arriving (Transferring) wakes nobody.
func TestDoneWokenOnlyWhenTerminal(t *testing.T) {
	fixedAndMutant(t, "wake-early", func(t *testing.T, fixed bool) {
		c := decodeAsked(t)
		if done, _, ok := c.pending(1); !ok || !done {
			t.Fatal("room 1's done waiters not pending")
		}
		woken := func(effects []Effect) (n int) {
			for _, e := range effects {
				if e.Kind == EffectWake && e.Room == 1 && e.Wake == WakeDone {
					n++
				}
			}
			return n
		}
		c.Step(t0, Notified{Room: 1, UID: 0, Chunk: 0, Total: 0, Aux: false}) // chunk 0 of a room of 2
		if st, _ := c.Status(1); st != Transferring {
			t.Fatalf("after the first chunk: %v", st)
		}
		if n := woken(c.Effects()); (n == 0) != fixed {
			t.Fatalf("done woken %d times while Transferring (want none: %v)", n, fixed)
		}
		if !fixed {
			return
		}
		c.Step(t0, Notified{Room: 1, UID: 0, Chunk: 1, Total: 2, Aux: false})
		if n := woken(c.Effects()); n != 0 {
			t.Fatalf("done woken %d times before the aux item", n)
		}
		c.Step(t0, Notified{Room: 1, UID: 0, Chunk: 0, Total: 0, Aux: true})
		if st, _ := c.Status(1); st != Success {
			t.Fatalf("after every chunk and the aux: %v", st)
		}
		if n := woken(c.Effects()); n != 1 {
			t.Fatalf("done woken %d times at Success, want 1", n)
		}
	})
}

// An ABORT that finds a write in flight owes its ABORT_ACK until the write
// completes; then the ACK goes out, drained.
func TestAbortAckSentWhenWritesDrain(t *testing.T) {
	fixedAndMutant(t, "no-abort-ack", func(t *testing.T, fixed bool) {
		c, writes := prefillChunkQueued(t)
		if len(writes) != 1 || !c.Step(t0, Posting{Room: 1, Write: &writes[0]}).OK {
			t.Fatalf("the chunk's write was not posted: %d writes", len(writes))
		}
		c.Effects()
		c.Step(t0, Received{Msg: &wire.Abort{From: decodeFrom, Room: 1, Reason: "client went away"}})
		if acks := sent[*wire.AbortAck](c.Effects()); len(acks) != 0 {
			t.Fatalf("ABORT_ACK %+v with a write in flight", acks)
		}
		c.Step(t0.Add(time.Second), WriteDone{Room: 1, Write: &writes[0], Err: nil, Quiesced: false})
		var got []string
		for _, e := range c.Effects() {
			if a, ok := e.Msg.(*wire.AbortAck); ok && e.Kind == EffectSend {
				got = append(got, fmt.Sprintf("%d %v → %s", a.Room, a.Drained, e.To.Endpoint))
			}
		}
		want := "1 true → " + decodeFrom.Endpoint
		if ok := len(got) == 1 && got[0] == want; ok != fixed {
			t.Fatalf("after the last write drained: ABORT_ACKs %v, want [%s]: %v", got, want, fixed)
		}
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
		if st, _ := c.Status(1); st != WaitingForInput {
			t.Fatalf("room 1 %v", st)
		}
		c.Effects()
		restarted := decodeFrom
		restarted.Epoch = 2
		c.Step(t0, Received{Msg: &wire.Pong{From: restarted, Seq: 1}})
		st, _ := c.Status(1)
		reason, _ := c.Failure(1)
		ok := st == Failed && strings.Contains(reason, wire.ReasonPeerRestarted) && c.Sizes().Pending == 0
		if ok != fixed {
			t.Fatalf("after the new epoch: room 1 %v (%q), %d pending", st, reason, c.Sizes().Pending)
		}
		if !fixed {
			return
		}
		// The new process holds none of the old one's rooms: it is not told.
		if st := sent[*wire.Status](c.Effects()); len(st) != 0 {
			t.Fatalf("the restarted peer was told: %+v", st)
		}
		// And room 2's sender starts Failed: nothing is written for it.
		if res := c.Step(t0, CreateSender{Room: 2}).Result; res.Status != Failed {
			t.Fatalf("room 2's sender after the restart: %v", res.Status)
		}
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
		if !c.Step(t0, Received{Msg: request(1, decodeFrom)}).OK || !c.Step(t0, Received{Msg: request(2, decodeFrom)}).OK {
			t.Fatal("a first request was refused")
		}
		c.Effects()
		for _, room := range []uint64{1, 2} { // live, pending
			accepted := c.Step(t0, Received{Msg: request(room, other)}).OK
			st := sent[*wire.Status](c.Effects())
			if accepted == fixed {
				t.Fatalf("room %d: a second request with required 1 accepted: %v (statuses %+v)", room, accepted, st)
			}
			if fixed && (len(st) != 1 || st[0].Room != room || st[0].Code != CodeRejected || !strings.Contains(st[0].Reason, "request 2 of 1")) {
				t.Fatalf("room %d: refusal %+v", room, st)
			}
		}
		if n := len(c.reg.Requests(1)); fixed && n != 1 {
			t.Fatalf("room 1 holds %d requests, required 1", n)
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
		if n := c.Sizes().Tombstones; (n <= 8) != fixed {
			t.Fatalf("%d tombstones after 50 clears, bound 8 (want within: %v)", n, fixed)
		}
		if !fixed {
			return
		}
		if res := c.Step(t0, CreateSender{Room: 50}).Result; res.Outcome != Rejected {
			t.Fatalf("the newest cleared id reused at once: %v", res.Outcome)
		}
		if res := c.Step(t0, CreateSender{Room: 1}).Result; res.Outcome != Applied {
			t.Fatalf("the oldest id, forgotten early, is still refused: %v", res.Err)
		}
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
		if held := c.Hold(1); held != fixed {
			t.Fatalf("after drained=false: held %v, released %v", held, releases(c.Effects()))
		}
		if !fixed {
			return
		}
		c.Step(t0.Add(time.Second), Received{Msg: &wire.AbortAck{From: prefillFrom, Room: 1, Drained: true}})
		if got := releases(c.Effects()); len(got) != 1 || got[0] != "1 false" {
			t.Fatalf("after drained=true: released %v, want [1 false]", got)
		}
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
		if st, _ := c.Status(1); st != Failed {
			t.Fatalf("room 1 bound to the old epoch: %v", st)
		}
		c.Step(t0, CreateReceiver{Room: 2, Targets: []Target{prefillT}})
		c.Step(t0, InitReceiver{Room: 2, Spec: RequestSpec{DstPages: []uint32{2}, AuxIndex: -1}})
		if got := sends(c.Effects()); !slices.Contains(got, "REQUEST 2 → tcp://p:1") {
			t.Fatalf("room 2 not asked of the new process: %v", got)
		}
		c.Step(t0, Received{Msg: &wire.Status{From: prefillFrom, Room: 2, Status: wire.StatusFailed, Code: CodeFailed, Reason: "late"}})
		if st, _ := c.Status(2); (st == WaitingForInput) != fixed {
			t.Fatalf("room 2 after the old process's STATUS: %v (want untouched: %v)", st, fixed)
		}
		if !fixed {
			return
		}
		c.Step(t0, Received{Msg: &wire.Status{From: restarted, Room: 2, Status: wire.StatusFailed, Code: CodeFailed, Reason: "write failed"}})
		if r, _ := c.Failure(2); !strings.Contains(r, "write failed") {
			t.Fatalf("room 2 after the new process's STATUS: %q", r)
		}
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
		if ok := accepted == 4 && c.Sizes().Pending == 4 && len(refused) == 3; ok != fixed {
			t.Fatalf("%d of 7 accepted, %d pending, %d refused; bound 4 (want kept: %v)", accepted, c.Sizes().Pending, len(refused), fixed)
		}
		if fixed && !c.Step(t0, Received{Msg: request(100, other)}).OK {
			t.Fatal("another peer was locked out")
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
			if len(told) != rooms {
				t.Fatalf("run %d: %d rooms told, want %d", run, len(told), rooms)
			}
			ordered = ordered && slices.IsSorted(told)
			if !ordered && fixed {
				t.Fatalf("run %d: rooms told in the order %v", run, told)
			}
		}
		if ordered != fixed {
			t.Fatalf("effects in room order over 5 runs: %v, want %v", ordered, fixed)
		}
	})
}
