package core

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/wire"
)

// Restarts on a new endpoint (issue 20): a pod restart leaves the rank's
// discovery record naming the dead process until its lease lapses.

// sends lists "TYPE room → endpoint" for every message among effects.
func sends(effects []Effect) []string {
	var out []string
	for _, e := range effects {
		if e.Kind == EffectSend {
			out = append(out, fmt.Sprintf("%v %d → %s", e.Msg.Type(), e.Room, e.To.Endpoint))
		}
	}
	return out
}

func resolves(effects []Effect) int {
	n := 0
	for _, e := range effects {
		if e.Kind == EffectResolve {
			n++
		}
	}
	return n
}

// Bug 11 (case 1 of issue 20): a decode rank whose first lookup of a rank
// returned a dead process's endpoint retried its REGISTER there forever,
// although the record named the new process soon after. After
// registerLookupAfter unanswered retries it looks the rank up again.
func TestUnansweredRegisterLooksUpAgain(t *testing.T) {
	moved := prefillFrom
	moved.Endpoint, moved.Epoch = "tcp://p:2", 11
	fixedAndMutant(t, "retry-cached-endpoint", func(t *testing.T, fixed bool) {
		c := testCore(t, RoleDecode)
		c.cfg.RegisterRetry = 100 * time.Millisecond // every retry inside the bootstrap deadline
		c.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
		c.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint}) // the dead process's record
		c.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1}})
		c.Effects()
		now, looked := t0, 0
		for now.Before(t0.Add(c.cfg.Registry.BootstrapTimeout)) && looked == 0 {
			now = now.Add(50 * time.Millisecond)
			c.Step(now, Tick{})
			eff := c.Effects()
			looked += resolves(eff)
			if looked > 0 && len(sent[*wire.Register](eff)) != 0 {
				t.Fatal("REGISTER retried at the cached endpoint in the step that looks it up again")
			}
		}
		if (looked == 1) != fixed {
			t.Fatalf("looked up again %d times, want fixed=%v", looked, fixed)
		}
		if !fixed {
			return
		}
		if c.Stats().Relookups != 1 || c.Stats().RegisterRetries != registerLookupAfter {
			t.Fatalf("stats %+v", c.Stats())
		}
		c.Step(now, Resolved{Target: prefillT, Endpoint: moved.Endpoint})
		if got := sends(c.Effects()); len(got) != 1 || got[0] != "REGISTER 0 → tcp://p:2" {
			t.Fatalf("after the new record: %v", got)
		}
		c.Step(now, Received{Msg: &wire.RegisterAck{From: moved, OK: true}})
		if got := sends(c.Effects()); len(got) != 1 || got[0] != "REQUEST 1 → tcp://p:2" {
			t.Fatalf("after the new process's ACK: %v", got)
		}
	})
}

// Bug 13 (case 2 of issue 20): a decode room aborted while its prefill rank
// restarts elsewhere sent its ABORT to the old endpoint only, and the new
// process's room waited for its own deadline. An ABORT stays owed until the
// rank acknowledges it and goes to every process the rank is found at.
func TestOwedAbortFollowsTheRank(t *testing.T) {
	moved := prefillFrom
	moved.Endpoint, moved.Epoch = "tcp://p:2", 11
	fixedAndMutant(t, "abort-sent-once", func(t *testing.T, fixed bool) {
		c := testCore(t, RoleDecode)
		c.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
		c.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
		c.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1}})
		c.Step(t0, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true}})
		c.Effects()
		c.Step(t0, AbortReceiver{Room: 1, Reason: "client went away"}) // the prefill process is being killed
		if got := sends(c.Effects()); len(got) != 1 || got[0] != "ABORT 1 → tcp://p:1" {
			t.Fatalf("abort: %v", got)
		}
		c.Step(t0, ClearReceiver{Room: 1})
		// Heartbeats report the old process dead; its record still names
		// it (lease), then names the new process.
		c.Step(t0.Add(time.Second), PeerUnreachable{Endpoint: prefillFrom.Endpoint, Reason: wire.ReasonPeerUnreachable})
		if n := resolves(c.Effects()); n != 1 && fixed {
			t.Fatalf("%d lookups after the dead report, want 1", n)
		}
		c.Step(t0.Add(time.Second), Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
		got := sends(c.Effects())
		if fixed && (len(got) != 1 || got[0] != "ABORT 1 → tcp://p:1") {
			t.Fatalf("the same record again: %v", got)
		}
		c.Step(t0.Add(2*time.Second), PeerUnreachable{Endpoint: prefillFrom.Endpoint, Reason: wire.ReasonPeerUnreachable})
		c.Effects()
		c.Step(t0.Add(2*time.Second), Resolved{Target: prefillT, Endpoint: moved.Endpoint})
		got = sends(c.Effects())
		if reached := len(got) == 1 && got[0] == "ABORT 1 → tcp://p:2"; reached != fixed {
			t.Fatalf("the new process got %v, want reached=%v", got, fixed)
		}
		if !fixed {
			return
		}
		if s := c.Sizes(); s.OwedAborts != 1 {
			t.Fatalf("owed %d, want 1 until acknowledged", s.OwedAborts)
		}
		// The ACK is the first message heard from the new epoch: the
		// epoch check handles the restart (re-sending what is owed)
		// before the ACK clears the debt.
		c.Step(t0.Add(2*time.Second), Received{Msg: &wire.AbortAck{From: moved, Room: 1, Drained: true}})
		if s := c.Sizes(); s.OwedAborts != 0 {
			t.Fatalf("owed %d after the ACK", s.OwedAborts)
		}
		c.Effects()
		c.Step(t0.Add(3*time.Second), Received{Msg: &wire.RegisterAck{From: moved, OK: true}})
		if got := sends(c.Effects()); len(got) != 0 {
			t.Fatalf("an acknowledged ABORT was sent again: %v", got)
		}
	})
}

// An owed ABORT to a rank that cannot be looked up (its record gone) is
// looked up again with backoff, and forgotten at the tombstone TTL: the
// table empties.
func TestOwedAbortLookupBackoffAndTTL(t *testing.T) {
	c := testCore(t, RoleDecode)
	c.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
	c.Step(t0, AbortReceiver{Room: 1, Reason: "gone"})
	c.Step(t0, ClearReceiver{Room: 1})
	c.Step(t0, ResolveFailed{Target: prefillT, Err: wire.ErrRankUnknown})
	c.Effects()
	c.Step(t0.Add(c.cfg.RegisterRetry/2), Tick{})
	if n := resolves(c.Effects()); n != 0 {
		t.Fatalf("looked up again before the backoff: %d", n)
	}
	c.Step(t0.Add(c.cfg.RegisterRetry), Tick{})
	if n := resolves(c.Effects()); n != 1 {
		t.Fatalf("%d lookups after the backoff, want 1", n)
	}
	at := t0.Add(c.cfg.RegisterRetry)
	c.Step(at, ResolveFailed{Target: prefillT, Err: wire.ErrRankUnknown})
	if tg := c.targets[prefillT.key()]; tg.lookupRetry != 2*c.cfg.RegisterRetry {
		t.Fatalf("backoff %v, want doubled", tg.lookupRetry)
	}
	c.Step(t0.Add(c.cfg.Registry.TombstoneTTL+time.Second), Tick{})
	if s := c.Sizes(); s.OwedAborts != 0 || s.Total() != 0 {
		t.Fatalf("sizes %+v after the TTL", s)
	}
}

// Bug 12 (case 4 of issue 20): a prefill rank that declared a decode rank
// dead failed their rooms but told every peer except that one; a decode
// paused longer than the heartbeat bound then kept its rooms Transferring
// until their deadlines. It is told too (code peer_unreachable).
func TestDeadPeerIsToldItsRoomsFailed(t *testing.T) {
	fixedAndMutant(t, "dead-peer-not-told", func(t *testing.T, fixed bool) {
		c := testCore(t, RolePrefill)
		register(t, c, decodeFrom)
		c.Step(t0, Received{Msg: request(1, decodeFrom)}) // pending: no sender yet
		c.Step(t0, CreateSender{Room: 2})
		c.Step(t0, Received{Msg: request(2, decodeFrom)})
		c.Effects()
		c.Step(t0, PeerUnreachable{Endpoint: decodeFrom.Endpoint, Reason: wire.ReasonPeerUnreachable})
		var told []string
		for _, st := range sent[*wire.Status](c.Effects()) {
			told = append(told, fmt.Sprintf("%d %s", st.Room, st.Code))
		}
		slices.Sort(told)
		want := "1 peer_unreachable,2 peer_unreachable"
		if got := strings.Join(told, ","); (got == want) != fixed {
			t.Fatalf("STATUS sent: %q, want %q: %v", got, want, fixed)
		}
	})
}

// RefuseRoom (issue 27): a room refused before it was created is aborted
// on every rank named (code refused), owed until acknowledged; a room this
// rank holds under that id is left alone.
func TestRefuseRoomTellsTheRanks(t *testing.T) {
	c := testCore(t, RoleDecode)
	other := Target{Bootstrap: "http://boot", Rank: 1}
	c.Step(t0, RefuseRoom{Room: 5, Targets: []Target{prefillT, other}, Reason: "prefill PP 1 → decode PP 2"})
	if n := resolves(c.Effects()); n != 2 {
		t.Fatalf("%d lookups, want both ranks looked up", n)
	}
	c.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
	ab := sent[*wire.Abort](c.Effects())
	if len(ab) != 1 || ab[0].Room != 5 || ab[0].Code != CodeRefused || !strings.Contains(ab[0].Reason, "PP 1") {
		t.Fatalf("ABORTs: %+v", ab)
	}
	c.Step(t0, Received{Msg: &wire.AbortAck{From: prefillFrom, Room: 5, Drained: true}})
	if s := c.Sizes(); s.OwedAborts != 1 || s.Live != 0 {
		t.Fatalf("sizes %+v: want the unresolved rank's ABORT still owed, no room", s)
	}
	c.Step(t0, CreateReceiver{Room: 6, Targets: []Target{prefillT}})
	c.Effects()
	c.Step(t0, RefuseRoom{Room: 6, Targets: []Target{prefillT}, Reason: "refused"})
	if st, _ := c.Status(6); st != Bootstrapping || len(sent[*wire.Abort](c.Effects())) != 0 {
		t.Fatalf("a live room of that id was aborted: %v", st)
	}
}

// TestEpochCheck: the core's one epoch check (Receive, Registered) — a
// message from a new epoch of a peer it has heard fails what was bound to
// the old epoch before the message applies; a PING never counts; the table
// stays within MaxEpochs; a malformed REQUEST is answered by a prefill rank
// only.
func TestEpochCheck(t *testing.T) {
	fixedAndMutant(t, "no-epoch-check", func(t *testing.T, fixed bool) {
		c := testCore(t, RolePrefill)
		register(t, c, decodeFrom)
		c.Step(t0, Received{Msg: request(1, decodeFrom)}) // pending: no sender yet
		c.Effects()
		restarted := decodeFrom
		restarted.Epoch = 2
		c.Step(t0, Received{Msg: &wire.Ping{From: restarted, Seq: 1}})
		if c.Stats().PeersRestarted != 0 || c.Sizes().Pending != 1 {
			t.Fatal("a PING counted as a restart")
		}
		c.Step(t0, Received{Msg: &wire.Abort{From: restarted, Room: 9, Reason: "x"}})
		_, registered := c.peers[decodeFrom.Peer()]
		if got := c.Sizes().Pending == 0 && !registered && c.Stats().PeersRestarted == 1; got != fixed {
			t.Fatalf("after a message from a new epoch: pending %d, registered %v, restarts %d",
				c.Sizes().Pending, registered, c.Stats().PeersRestarted)
		}
	})
	c := testCore(t, RolePrefill)
	c.cfg.MaxEpochs = 8
	for i := 0; i < 100; i++ {
		from := decodeFrom
		from.Rank = i
		c.Step(t0, Received{Msg: &wire.Abort{From: from, Room: uint64(i)}})
	}
	if n := c.Sizes().Epochs; n != 8 {
		t.Fatalf("%d epochs remembered, bound 8", n)
	}
	c.Effects()
	c.Step(t0, MalformedRequest{Room: 7, Endpoint: decodeFrom.Endpoint, Reason: "required 0"})
	if st := sent[*wire.Status](c.Effects()); len(st) != 1 || st[0].Room != 7 || st[0].Code != CodeRejected {
		t.Fatalf("prefill's answer to a malformed REQUEST: %+v", st)
	}
	d := testCore(t, RoleDecode)
	d.Step(t0, MalformedRequest{Room: 7, Endpoint: decodeFrom.Endpoint, Reason: "required 0"})
	if len(d.Effects()) != 0 {
		t.Fatal("a decode rank answered a malformed REQUEST")
	}
}

// Watches end (issue 20: Loop.Unwatch had no caller, so a rank heartbeated
// every peer it ever shared a room with, forever): once a decode rank
// shares no live room or owed ABORT with a prefill rank, and a prefill rank
// no live room or pending request with a decode rank, the next Tick
// unwatches it.
func TestIdlePeersAreUnwatched(t *testing.T) {
	unwatched := func(effects []Effect) (eps []string) {
		for _, e := range effects {
			if e.Kind == EffectUnwatch {
				eps = append(eps, e.To.Endpoint)
			}
		}
		return eps
	}
	fixedAndMutant(t, "never-unwatch", func(t *testing.T, fixed bool) {
		d := testCore(t, RoleDecode)
		d.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
		d.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
		d.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1}})
		d.Step(t0, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true}})
		d.Step(t0, Tick{})
		if got := unwatched(d.Effects()); len(got) != 0 {
			t.Fatalf("unwatched %v while a room is live", got)
		}
		d.Step(t0, Notified{Room: 1, UID: 0, Chunk: 0, Total: 1, Aux: false})
		d.Step(t0, Notified{Room: 1, UID: 0, Chunk: 0, Total: 0, Aux: true}) // aux: Success
		d.Step(t0, ClearReceiver{Room: 1})
		d.Step(t0, Tick{})
		if got := unwatched(d.Effects()); (len(got) == 1 && got[0] == prefillFrom.Endpoint) != fixed {
			t.Fatalf("decode unwatched %v after its last room, want fixed=%v", got, fixed)
		}

		p := testCore(t, RolePrefill)
		register(t, p, decodeFrom)
		p.Step(t0, Received{Msg: request(1, decodeFrom)})
		p.Step(t0, Tick{})
		if got := unwatched(p.Effects()); len(got) != 0 {
			t.Fatalf("prefill unwatched %v with a request pending", got)
		}
		p.Step(t0, CreateSender{Room: 1})
		p.Step(t0, AbortSender{Room: 1, Reason: "done"})
		p.Step(t0, Tick{})
		if got := unwatched(p.Effects()); (len(got) == 1 && got[0] == decodeFrom.Endpoint) != fixed {
			t.Fatalf("prefill unwatched %v after its last room, want fixed=%v", got, fixed)
		}
	})
}

// Case 3 of issue 20: once a decode rank shares no room with a prefill
// rank, nothing heartbeats it; if it died and came back elsewhere, the
// next room's REQUEST went to the dead process and the room failed when
// heartbeats caught up. A registration not heard from for longer than
// RecheckIdle is looked up and registered with again first.
func TestIdleRegistrationRechecked(t *testing.T) {
	moved := prefillFrom
	moved.Endpoint, moved.Epoch = "tcp://p:2", 11
	fixedAndMutant(t, "no-idle-recheck", func(t *testing.T, fixed bool) {
		c := testCore(t, RoleDecode)
		c.cfg.RecheckIdle = 3 * time.Second
		c.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
		c.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
		c.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1}})
		c.Step(t0, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true}})
		c.Step(t0, ClearReceiver{Room: 1})
		c.Step(t0, Received{Msg: &wire.AbortAck{From: prefillFrom, Room: 1, Drained: true}})
		c.Effects()
		// Soon after: the registration is used as it is.
		at := t0.Add(time.Second)
		c.Step(at, CreateReceiver{Room: 2, Targets: []Target{prefillT}})
		c.Step(at, InitReceiver{Room: 2, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1}})
		if got := sends(c.Effects()); len(got) != 1 || got[0] != "REQUEST 2 → tcp://p:1" {
			t.Fatalf("a fresh registration: %v", got)
		}
		c.Step(at, ClearReceiver{Room: 2})
		c.Step(at, Received{Msg: &wire.AbortAck{From: prefillFrom, Room: 2, Drained: true}})
		c.Step(at, Tick{}) // the shell's sweep: nothing is shared with the rank any more, so nothing heartbeats it
		c.Effects()
		// Long idle: looked up again first; the record now names the
		// new process.
		at = t0.Add(10 * time.Second)
		c.Step(at, CreateReceiver{Room: 3, Targets: []Target{prefillT}})
		c.Step(at, InitReceiver{Room: 3, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1}})
		eff := c.Effects()
		if (resolves(eff) == 1 && len(sent[*wire.Request](eff)) == 0) != fixed {
			t.Fatalf("after 10 s idle: %d lookups, sent %v (want fixed=%v)", resolves(eff), sends(eff), fixed)
		}
		if !fixed {
			return
		}
		c.Step(at, Resolved{Target: prefillT, Endpoint: moved.Endpoint})
		if got := sends(c.Effects()); !slices.Contains(got, "REGISTER 0 → tcp://p:2") || slices.Contains(got, "REQUEST 3 → tcp://p:2") {
			t.Fatalf("after the lookup: %v", got)
		}
		c.Step(at, Received{Msg: &wire.RegisterAck{From: moved, OK: true}})
		if got := sends(c.Effects()); !slices.Contains(got, "REQUEST 3 → tcp://p:2") {
			t.Fatalf("after the new process's ACK: %v", got)
		}
		if c.Stats().Rechecks != 1 {
			t.Fatalf("rechecks %d", c.Stats().Rechecks)
		}
	})
}

// prefillChunkQueued is a prefill core with decodeFrom registered, room 1
// requested and one chunk sent: it returns the chunk's writes, not yet
// posted.
func prefillChunkQueued(t *testing.T) (*Core, []kvlayout.Write) {
	t.Helper()
	c := testCore(t, RolePrefill)
	register(t, c, decodeFrom)
	c.Step(t0, CreateSender{Room: 1})
	c.Step(t0, InitSender{Room: 1})
	c.Step(t0, Received{Msg: request(1, decodeFrom)})
	c.Effects()
	if err := c.Step(t0, SendChunk{Room: 1, Pages: []uint32{0}, Last: false, AuxIndex: -1}).Err; err != nil {
		t.Fatal(err)
	}
	var writes []kvlayout.Write
	for _, e := range c.Effects() {
		writes = append(writes, e.Writes...)
	}
	if len(writes) == 0 {
		t.Fatal("no write to gate")
	}
	return c, writes
}

// A restarted decode rank's REGISTER (same identity and agent name, new
// epoch): its epoch check runs as a step of its own before the shell loads
// the new metadata, so the old process's registration and rooms are gone —
// no write of theirs passes the gate — before the new metadata replaces the
// peer's prepared lists. (The loop's check ran before the handler; moving
// it into Registered opened a window as long as the metadata load.)
func TestRegisterEpochCheckedBeforeMetadataLoad(t *testing.T) {
	fixedAndMutant(t, "register-epoch-late", func(t *testing.T, fixed bool) {
		c, writes := prefillChunkQueued(t)
		restarted := decodeFrom
		restarted.Epoch = 2
		kv, aux, state := RegionsOf(simLayout())
		c.Step(t0, Received{&wire.Register{From: restarted, Compat: "sim", KV: kv, Aux: aux, State: state}})
		challenged := false
		for _, e := range c.Effects() {
			challenged = challenged || e.Kind == EffectChallenge
		}
		if !challenged {
			t.Fatal("the new epoch's REGISTER was not passed on to be challenged (then loaded)")
		}
		// Meanwhile the shell challenges and loads the new metadata; the pool gates the
		// old room's next write.
		if posted := c.Step(t0, Posting{Room: 1, Write: &writes[0]}).OK; posted == fixed {
			t.Fatalf("the old process's write passed the gate during the new one's metadata load: %v", posted)
		}
	})
}

// A late message from a peer's earlier epoch (still queued from the old
// process) is dropped, not taken as a restart back: the new process keeps
// its registration and rooms.
func TestStaleEpochDropped(t *testing.T) {
	fixedAndMutant(t, "no-retired-epochs", func(t *testing.T, fixed bool) {
		c := testCore(t, RolePrefill)
		register(t, c, decodeFrom)
		restarted := decodeFrom
		restarted.Epoch, restarted.Endpoint = 2, "tcp://d:2"
		c.Step(t0, Received{&wire.Register{From: restarted}}) // the epoch check (its empty layout is refused)
		c.Effects()
		register(t, c, restarted)
		c.Step(t0, Received{Msg: request(5, restarted)}) // pending: no sender yet
		c.Effects()
		c.Step(t0, Received{Msg: &wire.Abort{From: decodeFrom, Room: 9, Reason: "late"}})
		_, registered := c.peers[restarted.Peer()]
		if ok := registered && c.Sizes().Pending == 1 && c.Stats().StaleEpoch == 1; ok != fixed {
			t.Fatalf("after a late message of the old epoch: registered %v, pending %d, stale %d",
				registered, c.Sizes().Pending, c.Stats().StaleEpoch)
		}
	})
}

// While a prefill rank is looked up again (an idle re-check), the endpoint
// it had stays known: a live room that asked it is still heartbeated, a
// dead report or its STATUS still fails that room, and a lookup the
// bootstrap service does not answer falls back to that endpoint.
func TestRelookupKeepsTheEndpoint(t *testing.T) {
	fixedAndMutant(t, "relookup-forgets-endpoint", func(t *testing.T, fixed bool) {
		c := testCore(t, RoleDecode)
		c.cfg.RecheckIdle = 3 * time.Second
		c.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
		c.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
		c.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1}})
		c.Step(t0, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true}}) // room 1's REQUEST out, watched
		c.Effects()
		// The rank is looked up again (an idle re-check for another room,
		// or unanswered REGISTERs) while room 1 waits for its data.
		at := t0.Add(10 * time.Second)
		c.relookup(c.targets[prefillT.key()])
		c.Effects()
		c.Step(at, Tick{})
		for _, e := range c.Effects() {
			if e.Kind == EffectUnwatch && fixed {
				t.Fatalf("unwatched %s while room 1 waits for its data", e.To.Endpoint)
			}
		}
		c.Step(at, PeerUnreachable{Endpoint: prefillFrom.Endpoint, Reason: wire.ReasonPeerUnreachable})
		if st, _ := c.Status(1); (st == Failed) != fixed {
			t.Fatalf("room 1 after the dead report during the lookup: %v", st)
		}
		if !fixed {
			return
		}
		// A lookup the bootstrap service does not answer: register at the
		// endpoint it had.
		c.Effects()
		c.Step(at, CreateReceiver{Room: 3, Targets: []Target{prefillT}})
		c.Step(at, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
		c.Step(at, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true}})
		c.Effects()
		c.relookup(c.targets[prefillT.key()])
		c.Step(at, InitReceiver{Room: 3, Spec: RequestSpec{DstPages: []uint32{3}, AuxIndex: -1}})
		c.Step(at, ResolveFailed{Target: prefillT, Err: errors.New("bootstrap server unreachable")})
		if st, _ := c.Status(3); st == Failed {
			t.Fatal("a failed lookup failed a room whose rank's endpoint is known")
		}
		if got := sends(c.Effects()); !slices.Contains(got, "REGISTER 0 → tcp://p:1") {
			t.Fatalf("after the failed lookup: %v", got)
		}
	})
}

// A late message from an epoch the receiver never heard, older than the
// one it hears now, is stale too: the simulator's swarm seed 43 had a
// decode rank restart twice, the prefill rank hear the newest process
// through a PONG, then a message the middle process sent before it died
// arrive — with unordered epochs that retired the live process, and every
// ABORT and REQUEST it sent afterwards was dropped as stale (the pair
// wedged for good). Epochs now grow with each start (wire.NewEpoch).
func TestOlderUnheardEpochDropped(t *testing.T) {
	fixedAndMutant(t, "no-retired-epochs", func(t *testing.T, fixed bool) {
		c := testCore(t, RolePrefill)
		register(t, c, decodeFrom) // epoch 1
		newest := decodeFrom
		newest.Epoch = 3
		c.Step(t0, Received{&wire.Pong{From: newest}}) // a restart: 1 → 3
		register(t, c, newest)
		c.Step(t0, Received{Msg: request(5, newest)}) // pending
		c.Effects()
		middle := decodeFrom
		middle.Epoch = 2 // sent by a process that died before we heard of it
		c.Step(t0, Received{Msg: &wire.Abort{From: middle, Room: 9, Reason: "late"}})
		_, registered := c.peers[newest.Peer()]
		if ok := registered && c.Sizes().Pending == 1 && c.epochs[newest.Peer()].epoch == 3; ok != fixed {
			t.Fatalf("after a late message of an older, unheard epoch: registered %v, pending %d, current epoch %d",
				registered, c.Sizes().Pending, c.epochs[newest.Peer()].epoch)
		}
	})
}
