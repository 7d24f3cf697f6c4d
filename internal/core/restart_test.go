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
	"github.com/stretchr/testify/require"
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
			if looked > 0 {
				require.Empty(t, sent[*wire.Register](eff), "REGISTER retried at the cached endpoint in the step that looks it up again")
			}
		}
		require.Equal(t, fixed, looked == 1, "looked up again %d times, want fixed=%v", looked, fixed)
		if !fixed {
			return
		}
		require.EqualValues(t, 1, c.Stats().Relookups, "stats %+v", c.Stats())
		require.EqualValues(t, registerLookupAfter, c.Stats().RegisterRetries, "stats %+v", c.Stats())
		c.Step(now, Resolved{Target: prefillT, Endpoint: moved.Endpoint})
		require.Equal(t, []string{"REGISTER 0 → tcp://p:2"}, sends(c.Effects()), "after the new record")
		c.Step(now, Received{Msg: &wire.RegisterAck{From: moved, OK: true}})
		require.Equal(t, []string{"REQUEST 1 → tcp://p:2"}, sends(c.Effects()), "after the new process's ACK")
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
		require.Equal(t, []string{"ABORT 1 → tcp://p:1"}, sends(c.Effects()), "room 1's abort")
		c.Step(t0, ClearReceiver{Room: 1})
		// Heartbeats report the old process dead; its record still names
		// it (lease), then names the new process.
		c.Step(t0.Add(time.Second), PeerUnreachable{Endpoint: prefillFrom.Endpoint, Reason: wire.ReasonPeerUnreachable})
		n := resolves(c.Effects())
		if fixed {
			require.Equal(t, 1, n, "lookups after the dead report")
		}
		c.Step(t0.Add(time.Second), Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
		got := sends(c.Effects())
		if fixed {
			require.Equal(t, []string{"ABORT 1 → tcp://p:1"}, got, "the same record again")
		}
		c.Step(t0.Add(2*time.Second), PeerUnreachable{Endpoint: prefillFrom.Endpoint, Reason: wire.ReasonPeerUnreachable})
		c.Effects()
		c.Step(t0.Add(2*time.Second), Resolved{Target: prefillT, Endpoint: moved.Endpoint})
		got = sends(c.Effects())
		reached := len(got) == 1 && got[0] == "ABORT 1 → tcp://p:2"
		require.Equal(t, fixed, reached, "the new process got %v, want reached=%v", got, fixed)
		if !fixed {
			return
		}
		require.Equal(t, 1, c.Sizes().OwedAborts, "owed ABORTs, want 1 until acknowledged")
		// The ACK is the first message heard from the new epoch: the
		// epoch check handles the restart (re-sending what is owed)
		// before the ACK clears the debt.
		c.Step(t0.Add(2*time.Second), Received{Msg: &wire.AbortAck{From: moved, Room: 1, Drained: true}})
		require.Zero(t, c.Sizes().OwedAborts, "owed ABORTs after the ACK")
		c.Effects()
		c.Step(t0.Add(3*time.Second), Received{Msg: &wire.RegisterAck{From: moved, OK: true}})
		require.Empty(t, sends(c.Effects()), "an acknowledged ABORT was sent again")
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
	require.Zero(t, resolves(c.Effects()), "looked up again before the backoff")
	c.Step(t0.Add(c.cfg.RegisterRetry), Tick{})
	require.Equal(t, 1, resolves(c.Effects()), "lookups after the backoff")
	at := t0.Add(c.cfg.RegisterRetry)
	c.Step(at, ResolveFailed{Target: prefillT, Err: wire.ErrRankUnknown})
	require.Equal(t, 2*c.cfg.RegisterRetry, c.targets[prefillT.key()].lookupRetry, "backoff, want doubled")
	c.Step(t0.Add(c.cfg.Registry.TombstoneTTL+time.Second), Tick{})
	s := c.Sizes()
	require.Zero(t, s.OwedAborts, "sizes %+v after the TTL", s)
	require.Zero(t, s.Total(), "sizes %+v after the TTL", s)
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
		got := strings.Join(told, ",")
		require.Equal(t, fixed, got == want, "STATUS sent: %q, want %q: %v", got, want, fixed)
	})
}

// RefuseRoom (issue 27): a room refused before it was created is aborted
// on every rank named (code refused), owed until acknowledged; a room this
// rank holds under that id is left alone.
func TestRefuseRoomTellsTheRanks(t *testing.T) {
	c := testCore(t, RoleDecode)
	other := Target{Bootstrap: "http://boot", Rank: 1}
	c.Step(t0, RefuseRoom{Room: 5, Targets: []Target{prefillT, other}, Reason: "prefill PP 1 → decode PP 2"})
	require.Equal(t, 2, resolves(c.Effects()), "lookups, want both ranks looked up")
	c.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
	ab := sent[*wire.Abort](c.Effects())
	require.Len(t, ab, 1, "ABORTs: %+v", ab)
	require.EqualValues(t, 5, ab[0].Room, "ABORTs: %+v", ab)
	require.Equal(t, CodeRefused, ab[0].Code, "ABORTs: %+v", ab)
	require.Contains(t, ab[0].Reason, "PP 1", "ABORTs: %+v", ab)
	c.Step(t0, Received{Msg: &wire.AbortAck{From: prefillFrom, Room: 5, Drained: true}})
	s := c.Sizes()
	require.Equal(t, 1, s.OwedAborts, "sizes %+v: want the unresolved rank's ABORT still owed, no room", s)
	require.Zero(t, s.Live, "sizes %+v: want the unresolved rank's ABORT still owed, no room", s)
	c.Step(t0, CreateReceiver{Room: 6, Targets: []Target{prefillT}})
	c.Effects()
	c.Step(t0, RefuseRoom{Room: 6, Targets: []Target{prefillT}, Reason: "refused"})
	st, _ := c.Status(6)
	require.Equal(t, Bootstrapping, st, "a live room of that id was aborted: room 6")
	require.Empty(t, sent[*wire.Abort](c.Effects()), "a live room of that id was aborted: room 6 %v", st)
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
		require.Zero(t, c.Stats().PeersRestarted, "a PING counted as a restart")
		require.Equal(t, 1, c.Sizes().Pending, "a PING counted as a restart")
		c.Step(t0, Received{Msg: &wire.Abort{From: restarted, Room: 9, Reason: "x"}})
		_, registered := c.peers[decodeFrom.Peer()]
		got := c.Sizes().Pending == 0 && !registered && c.Stats().PeersRestarted == 1
		require.Equal(t, fixed, got, "after a message from a new epoch: pending %d, registered %v, restarts %d",
			c.Sizes().Pending, registered, c.Stats().PeersRestarted)
	})
	c := testCore(t, RolePrefill)
	c.cfg.MaxEpochs = 8
	for i := 0; i < 100; i++ {
		from := decodeFrom
		from.Rank = i
		c.Step(t0, Received{Msg: &wire.Abort{From: from, Room: uint64(i)}})
	}
	require.Equal(t, 8, c.Sizes().Epochs, "epochs remembered, bound 8")
	c.Effects()
	c.Step(t0, MalformedRequest{Room: 7, Endpoint: decodeFrom.Endpoint, Reason: "required 0"})
	st := sent[*wire.Status](c.Effects())
	require.Len(t, st, 1, "prefill's answer to a malformed REQUEST: %+v", st)
	require.EqualValues(t, 7, st[0].Room, "prefill's answer to a malformed REQUEST: %+v", st)
	require.Equal(t, CodeRejected, st[0].Code, "prefill's answer to a malformed REQUEST: %+v", st)
	d := testCore(t, RoleDecode)
	d.Step(t0, MalformedRequest{Room: 7, Endpoint: decodeFrom.Endpoint, Reason: "required 0"})
	require.Empty(t, d.Effects(), "a decode rank answered a malformed REQUEST")
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
		require.Empty(t, unwatched(d.Effects()), "unwatched while room 1 is live")
		d.Step(t0, Notified{Room: 1, UID: 0, Chunk: 0, Total: 1, Aux: false})
		d.Step(t0, Notified{Room: 1, UID: 0, Chunk: 0, Total: 0, Aux: true}) // aux: Success
		d.Step(t0, ClearReceiver{Room: 1})
		d.Step(t0, Tick{})
		got := unwatched(d.Effects())
		require.Equal(t, fixed, len(got) == 1 && got[0] == prefillFrom.Endpoint, "decode unwatched %v after its last room, want fixed=%v", got, fixed)

		p := testCore(t, RolePrefill)
		register(t, p, decodeFrom)
		p.Step(t0, Received{Msg: request(1, decodeFrom)})
		p.Step(t0, Tick{})
		require.Empty(t, unwatched(p.Effects()), "prefill unwatched with a request pending")
		p.Step(t0, CreateSender{Room: 1})
		p.Step(t0, AbortSender{Room: 1, Reason: "done"})
		p.Step(t0, Tick{})
		got = unwatched(p.Effects())
		require.Equal(t, fixed, len(got) == 1 && got[0] == decodeFrom.Endpoint, "prefill unwatched %v after its last room, want fixed=%v", got, fixed)
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
		require.Equal(t, []string{"REQUEST 2 → tcp://p:1"}, sends(c.Effects()), "a fresh registration")
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
		require.Equal(t, fixed, resolves(eff) == 1 && len(sent[*wire.Request](eff)) == 0,
			"after 10 s idle: %d lookups, sent %v (want fixed=%v)", resolves(eff), sends(eff), fixed)
		if !fixed {
			return
		}
		c.Step(at, Resolved{Target: prefillT, Endpoint: moved.Endpoint})
		got := sends(c.Effects())
		require.Contains(t, got, "REGISTER 0 → tcp://p:2", "after the lookup")
		require.NotContains(t, got, "REQUEST 3 → tcp://p:2", "after the lookup")
		c.Step(at, Received{Msg: &wire.RegisterAck{From: moved, OK: true}})
		require.Contains(t, sends(c.Effects()), "REQUEST 3 → tcp://p:2", "after the new process's ACK")
		require.EqualValues(t, 1, c.Stats().Rechecks, "rechecks")
	})
}

// prefillChunkQueued is a prefill core with decodeFrom registered, room 1
// requested and one chunk sent: it returns the chunk's writes, not yet
// posted.
func prefillChunkQueued(t *testing.T) (*Core, []kvlayout.Write) {
	t.Helper()
	c := prefillRequested(t)
	require.NoError(t, c.Step(t0, SendChunk{Room: 1, Pages: []uint32{0}, Last: false, AuxIndex: -1}).Err)
	var writes []kvlayout.Write
	for _, e := range c.Effects() {
		writes = append(writes, e.Writes...)
	}
	require.NotEmpty(t, writes, "no write to gate")
	return c, writes
}

// prefillRequested is a prefill core whose room 1 has decodeFrom's
// REQUEST, nothing sent yet.
func prefillRequested(t *testing.T) *Core {
	t.Helper()
	c := testCore(t, RolePrefill)
	register(t, c, decodeFrom)
	c.Step(t0, CreateSender{Room: 1})
	c.Step(t0, InitSender{Room: 1})
	c.Step(t0, Received{Msg: request(1, decodeFrom)})
	c.Effects()
	return c
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
		require.True(t, challenged, "the new epoch's REGISTER was not passed on to be challenged (then loaded)")
		// Meanwhile the shell challenges and loads the new metadata; the pool gates the
		// old room's next write.
		posted := c.Step(t0, Posting{Room: 1, Write: &writes[0]}).OK
		require.Equal(t, !fixed, posted, "the old process's write passed the gate during the new one's metadata load: %v", posted)
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
		ok := registered && c.Sizes().Pending == 1 && c.Stats().StaleEpoch == 1
		require.Equal(t, fixed, ok, "after a late message of the old epoch: registered %v, pending %d, stale %d",
			registered, c.Sizes().Pending, c.Stats().StaleEpoch)
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
			if fixed {
				require.NotEqual(t, EffectUnwatch, e.Kind, "unwatched %s while room 1 waits for its data", e.To.Endpoint)
			}
		}
		c.Step(at, PeerUnreachable{Endpoint: prefillFrom.Endpoint, Reason: wire.ReasonPeerUnreachable})
		st, _ := c.Status(1)
		require.Equal(t, fixed, st == Failed, "room 1 after the dead report during the lookup: %v", st)
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
		st, _ = c.Status(3)
		require.NotEqual(t, Failed, st, "a failed lookup failed room 3, whose rank's endpoint is known")
		require.Contains(t, sends(c.Effects()), "REGISTER 0 → tcp://p:1", "after the failed lookup")
	})
}

// A late message from an epoch the receiver never heard, older than the
// one it hears now, is stale too: the simulator's swarm seed 43 had a
// decode rank restart twice, the prefill rank hear the newest process
// through a PONG, then a message the middle process sent before it died
// arrive — with unordered epochs that retired the live process, and every
// ABORT and REQUEST it sent afterwards was dropped as stale (the pair
// wedged for good). Epochs now grow with each start (control.NewEpoch).
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
		ok := registered && c.Sizes().Pending == 1 && c.epochs[newest.Peer()].epoch == 3
		require.Equal(t, fixed, ok, "after a late message of an older, unheard epoch: registered %v, pending %d, current epoch %d",
			registered, c.Sizes().Pending, c.epochs[newest.Peer()].epoch)
	})
}
