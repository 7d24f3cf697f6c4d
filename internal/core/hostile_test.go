package core

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvbridge/kvbridge/internal/wire"
)

// Rules against a hostile peer (issue 49 item 3; docs/PROTOCOL.md "RENEW"
// and "REQUEST"). The simulator's hostile configurations check them over
// every interleaving (simhostile_test.go); these tests show each rule's
// behaviour on one core, so a slip in it fails a test that names it.

// pullRoomPublished returns a prefill core with pull room 7 requested by
// decodeFrom, created, initialised and its first chunk (of two) published
// at t0.
func pullRoomPublished(t *testing.T) *Core {
	t.Helper()
	c := newTestCore(t, RolePrefill, simRegistryConfig())
	c.cfg.Lease = simPullLease
	register(t, c, decodeFrom)
	r := request(7, decodeFrom)
	r.Pull, r.DstPages = true, []uint32{7, 8}
	require.True(t, c.Step(t0, Received{r}).OK, "REQUEST refused: %v", sent[*wire.Status](c.Effects()))
	c.Step(t0, CreateSender{Room: 7})
	c.Step(t0, InitSender{Room: 7})
	require.NoError(t, c.Step(t0, SendChunk{Room: 7, Pages: []uint32{1}, AuxIndex: -1}).Err)
	require.Len(t, sent[*wire.Pages](c.Effects()), 1, "the first chunk's PAGES")
	return c
}

// TestRenewIsNotProgress: a decode process that keeps renewing a pull
// room without reading it does not keep the room alive: the stall
// deadline runs from the last publish, the room fails there, and its
// published pages are released (forced, counted) by the drain deadline
// plus the quarantine, while the RENEWs go on.
func TestRenewIsNotProgress(t *testing.T) {
	c := pullRoomPublished(t)
	stall := c.cfg.Registry.StallTimeout
	step := stall / 5 // well inside the lease: every RENEW is in time for it
	now := t0
	renew := func() {
		c.Step(now, Received{&wire.Renew{From: decodeFrom, Room: 7, At: uint64(now.UnixNano())}})
		c.Step(now, Tick{})
	}
	for now.Sub(t0) < stall-step {
		now = now.Add(step)
		renew()
		st, _ := c.Status(7)
		require.Equal(t, Transferring, st, "room 7 at %v after its last publish", now.Sub(t0))
	}
	assert.Positive(t, c.Stats().LeaseRenewals, "the RENEWs before the bound extend the lease")
	// Past the stall deadline from the last publish the room fails,
	// however many RENEWs came.
	for now.Sub(t0) <= stall {
		now = now.Add(step)
		renew()
	}
	st, _ := c.Status(7)
	require.Equal(t, Failed, st, "room 7 %v after its last publish, renewed every %v", now.Sub(t0), step)
	// The bound, plus the clock's grain twice: the failure and the release
	// each come at the first tick past their deadline.
	bound := 2*stall + c.cfg.QuarantineTimeout + 2*step
	refused, renewed := c.Stats().PullRefused, uint64(0)
	for now.Sub(t0) <= bound {
		held := c.PullHold(7)
		if !held {
			break
		}
		now = now.Add(step)
		renew()
		renewed++
	}
	held := c.PullHold(7)
	require.False(t, held, "room 7's published pages still held %v after its last publish (bound %v)", now.Sub(t0), bound)
	assert.Equal(t, refused+renewed, c.Stats().PullRefused, "each RENEW of the failed room refused and counted")
	assert.Equal(t, uint64(1), c.Stats().ForcedReleases, "the release is forced and counted")
	assert.Zero(t, c.PagesUnderLease(), "the lease gauge falls at release")
}

// TestPublishIsProgress: each publish restarts the stall deadline, so a
// room whose prefill rank publishes its chunks further apart than the
// deadline's length in total, but not between two, lives on.
func TestPublishIsProgress(t *testing.T) {
	c := pullRoomPublished(t)
	later := t0.Add(c.cfg.Registry.StallTimeout * 3 / 4)
	require.NoError(t, c.Step(later, SendChunk{Room: 7, Pages: []uint32{2}, Last: true, AuxIndex: -1}).Err)
	c.Step(later.Add(c.cfg.Registry.StallTimeout/2), Received{&wire.Renew{From: decodeFrom, Room: 7, At: 2}})
	c.Step(later.Add(c.cfg.Registry.StallTimeout/2), Tick{})
	st, _ := c.Status(7)
	assert.Equal(t, Transferring, st, "room 7 after a publish within the stall deadline")
}

// TestRoomBelongsToTheInstanceThatAskedFirst: a REQUEST from another decode
// instance for a room one instance asked for is refused, naming both
// instances, and counted; so is its ABORT, which is answered drained and
// leaves the room as it was. Ranks of the asking instance are not
// affected.
func TestRoomBelongsToTheInstanceThatAskedFirst(t *testing.T) {
	for _, pending := range []bool{true, false} {
		c := newTestCore(t, RolePrefill, simRegistryConfig())
		other := wire.From{Role: "decode", Instance: "other", Rank: 0, Endpoint: "tcp://o:1", Epoch: 5}
		rank1 := wire.From{Role: "decode", Instance: decodeFrom.Instance, Rank: 1, Endpoint: "tcp://d:2", Epoch: 1}
		register(t, c, decodeFrom)
		register(t, c, other)
		register(t, c, rank1)
		r := request(7, decodeFrom)
		r.Required = 2
		require.True(t, c.Step(t0, Received{r}).OK)
		if !pending {
			c.Step(t0, CreateSender{Room: 7})
		}
		c.Effects()

		forged := request(7, other)
		forged.Required = 2
		assert.False(t, c.Step(t0, Received{forged}).OK, "pending %v: another instance's REQUEST for room 7 accepted", pending)
		st := sent[*wire.Status](c.Effects())
		require.Len(t, st, 1)
		assert.Equal(t, CodeRejected, st[0].Code)
		assert.Contains(t, st[0].Reason, `decode instance "d" asked for it first`)
		assert.Contains(t, st[0].Reason, "decode/other/0")
		assert.Equal(t, uint64(1), c.Stats().ForeignRefused)

		c.Step(t0, Received{&wire.Abort{From: other, Room: 7, Reason: "forged"}})
		acks := sent[*wire.AbortAck](c.Effects())
		require.Len(t, acks, 1, "the foreign ABORT is answered")
		assert.True(t, acks[0].Drained, "nothing of the foreign instance is written under room 7")
		assert.Equal(t, uint64(2), c.Stats().ForeignRefused)
		if !pending {
			st, _ := c.Status(7)
			assert.Equal(t, Bootstrapping, st, "room 7 after a foreign ABORT")
		}
		assert.Len(t, c.prefillCore.roomRequests(7), 1, "room 7's requests after a foreign ABORT")

		// The asking instance's other rank joins the room.
		r1 := request(7, rank1)
		r1.Required, r1.DstPages = 2, []uint32{9}
		assert.True(t, c.Step(t0, Received{r1}).OK, "pending %v: a rank of the asking instance refused: %v", pending, sent[*wire.Status](c.Effects()))
	}
}

// TestForeignAbortOfAnUnaskedRoomStillTombstones: a room nobody asked for
// yet has no instance; an ABORT for it is taken as an early abort (the
// insider's power docs/SECURITY.md states).
func TestForeignAbortOfAnUnaskedRoomStillTombstones(t *testing.T) {
	c := newTestCore(t, RolePrefill, simRegistryConfig())
	register(t, c, decodeFrom)
	c.Step(t0, Received{&wire.Abort{From: decodeFrom, Room: 7, Reason: "early"}})
	c.Effects()
	assert.Zero(t, c.Stats().ForeignRefused)
	_, tomb := c.reg.tombs[7]
	assert.True(t, tomb, "an early ABORT leaves a tombstone")
}

// TestKeepProgressIsTheCores (issue 49 item 1): the choice to keep the
// agent progressing is an effect of the core, not a shell's look at the
// messages: one for every PAGES published (the lease), one for a
// REGISTER_ACK that carries this rank's pull offer (OfferProgress), none
// for a REGISTER_ACK without one. The offer is sent whole by the core.
// AgentClosed (an input, not a second door) releases the published pages.
func TestKeepProgressIsTheCores(t *testing.T) {
	keeps := func(effects []Effect) []time.Duration {
		var out []time.Duration
		for _, e := range effects {
			if e.Kind == EffectKeepProgress {
				out = append(out, e.Keep)
			}
		}
		return out
	}
	c := newTestCore(t, RolePrefill, simRegistryConfig())
	c.cfg.Lease, c.cfg.OfferProgress = simPullLease, 5*time.Second
	c.cfg.Offer = &wire.PullOffer{Agent: "prefill-agent", LeaseMillis: int(simPullLease / time.Millisecond)}
	for _, pull := range []bool{false, true} {
		from := decodeFrom
		if !pull {
			from.Rank, from.Endpoint = 1, "tcp://d:2"
		}
		kv, aux, state := RegionsOf(simLayout())
		msg := &wire.Register{From: from, Compat: "sim", Agent: agentOf(from), KV: kv, Aux: aux, State: state, Pull: pull}
		plan, err := c.CheckRegister(msg)
		require.NoError(t, err)
		plan.Pull = pull // as the core's check does (EffectLoadMetadata's plan)
		echoChallenge(t, c, msg, t0)
		c.Step(t0, Registered{From: from, Remote: agentOf(from), Plan: plan})
		effects := c.Effects()
		acks := sent[*wire.RegisterAck](effects)
		require.Len(t, acks, 1)
		if !pull {
			assert.Nil(t, acks[0].Pull, "no offer to a decode rank that pushes")
			assert.Empty(t, keeps(effects))
			continue
		}
		assert.Same(t, c.cfg.Offer, acks[0].Pull, "the rank's offer, sent whole")
		assert.Equal(t, []time.Duration{5 * time.Second}, keeps(effects), "the agent progresses while the proof slots are read back")
	}
	r := request(7, decodeFrom)
	r.Pull = true
	require.True(t, c.Step(t0, Received{r}).OK)
	c.Step(t0, CreateSender{Room: 7})
	c.Step(t0, InitSender{Room: 7})
	require.NoError(t, c.Step(t0, SendChunk{Room: 7, Pages: []uint32{1}, Last: true, AuxIndex: -1}).Err)
	effects := c.Effects()
	require.Len(t, sent[*wire.Pages](effects), 1)
	assert.Equal(t, []time.Duration{simPullLease}, keeps(effects), "the agent progresses for the lease after a PAGES")

	require.True(t, c.PullHold(7))
	c.Step(t0, AgentClosed{})
	assert.False(t, c.PullHold(7), "room 7's pages after the agent closed")
	woken := false
	for _, e := range c.Effects() {
		woken = woken || (e.Kind == EffectWake && e.Room == 7 && e.Wake == WakePull)
	}
	assert.True(t, woken, "room 7's hold waiter woken when the agent closed")
	assert.Equal(t, uint64(1), c.Stats().ForcedReleases)
}

// TestReadDoneIsNotProgress: a READ_DONE ok that leaves the room unsettled
// (not drained) does not push the stall deadline out: the room fails at
// its last publish's deadline, so k decode processes cannot stretch the
// hold by k stall timeouts between them.
func TestReadDoneIsNotProgress(t *testing.T) {
	c := pullRoomPublished(t)
	stall := c.cfg.Registry.StallTimeout
	require.NoError(t, c.Step(t0, SendChunk{Room: 7, Pages: []uint32{2}, Last: true, AuxIndex: -1}).Err)
	c.Step(t0.Add(stall*9/10), Received{&wire.ReadDone{From: decodeFrom, Room: 7, OK: true, Drained: false}})
	c.Step(t0.Add(stall*11/10), Tick{})
	st, _ := c.Status(7)
	assert.Equal(t, Failed, st, "room 7 past its last publish's stall deadline, after a READ_DONE not drained")
}

// TestHeldBackPagesCountFromTheirSend: a PAGES held back for its data
// (SendChunk.Ready) goes when the shell steps PagesReady: the core stamps
// it with the latest stamp its decode process sent (a RENEW's, heard
// meanwhile), sends it, keeps the agent progressing for the lease, and
// counts the send as its progress — the stall deadline and the hold's
// bound run from it, not from the SendChunk.
func TestHeldBackPagesCountFromTheirSend(t *testing.T) {
	c := pullRoomPublished(t)
	stall := c.cfg.Registry.StallTimeout
	ready := func() (bool, error) { return true, nil }
	require.NoError(t, c.Step(t0, SendChunk{Room: 7, Pages: []uint32{2}, Last: true, AuxIndex: -1, Ready: ready}).Err)
	var held *wire.Pages
	for _, e := range c.Effects() {
		assert.NotEqual(t, EffectKeepProgress, e.Kind, "no progress kept for a PAGES not sent yet")
		if p, ok := e.Msg.(*wire.Pages); ok && e.Ready != nil {
			held = p
		}
	}
	require.NotNil(t, held, "the last chunk's PAGES, held back for its data")
	c.Step(t0.Add(stall/2), Received{&wire.Renew{From: decodeFrom, Room: 7, At: 99}})
	sentAt := t0.Add(stall * 9 / 10)
	c.Step(sentAt, PagesReady{To: wire.Peer{Endpoint: decodeFrom.Endpoint}, Msg: held})
	effects := c.Effects()
	pages := sent[*wire.Pages](effects)
	require.Len(t, pages, 1)
	assert.Equal(t, uint64(99), pages[0].At, "stamped with the latest RENEW's stamp")
	assert.Equal(t, EffectKeepProgress, effects[0].Kind, "the agent keeps progressing, before the send")
	c.Step(t0.Add(stall*6/5), Received{&wire.Renew{From: decodeFrom, Room: 7, At: 100}}) // its lease goes on
	c.Step(t0.Add(stall*3/2), Tick{})
	st, _ := c.Status(7)
	assert.Equal(t, Transferring, st, "room 7 within the stall deadline of its last PAGES' send")
	c.Step(sentAt.Add(stall*11/10), Tick{})
	st, _ = c.Status(7)
	assert.Equal(t, Failed, st, "room 7 past the stall deadline of its last PAGES' send")
}

// echoChallenge passes msg's agent challenge at c as its decode rank
// would: the REGISTER, the challenge it draws (EffectChallenge), and the
// REGISTER echoing the challenge's nonce, whose EffectLoadMetadata is
// dropped (the caller steps Registered).
func echoChallenge(tb testing.TB, c *Core, msg *wire.Register, now time.Time) {
	tb.Helper()
	if c.Step(now, Received{Msg: msg}).OK {
		c.Effects() // passed already (a repeat of the same process and blob)
		return
	}
	var nonce []byte
	for _, e := range c.Effects() {
		if e.Kind == EffectChallenge {
			ch, ok := ParseChallenge(e.Notif)
			require.True(tb, ok, "challenge %q", e.Notif)
			require.Equal(tb, msg.From.Peer(), ch.For)
			nonce = ch.Nonce
		}
	}
	require.NotNil(tb, nonce, "no challenge for %s's REGISTER", msg.From.Peer())
	cp := *msg
	cp.Echo = nonce
	require.True(tb, c.Step(now, Received{Msg: &cp}).OK, "the echoing REGISTER was not passed on to be loaded")
	c.Effects()
}

// TestAbortFloodForgetsItsOwn: one decode rank floods a prefill rank with
// ABORTs for room ids no one asked for (early aborts: each a tombstone)
// after an honest decode rank aborted its room 7 early. The flooder keeps
// at most its share of the tombstone bound (MaxTombstones/8): past it its
// own oldest are forgotten (counted), never the honest rank's, so room
// 7's sender, created after the flood, starts Failed at once instead of
// waiting out its bootstrap deadline; the flooder's ABORTs are each still
// answered drained.
func TestAbortFloodForgetsItsOwn(t *testing.T) {
	reg := simRegistryConfig()
	reg.MaxTombstones = 16
	share := reg.MaxTombstones / 8
	c := newTestCore(t, RolePrefill, reg)
	flooder := wire.From{Role: "decode", Instance: "flood", Rank: 0, Endpoint: "tcp://f:1", Epoch: 3}
	c.Step(t0, Received{&wire.Abort{From: decodeFrom, Room: 7, Reason: "cancelled"}})
	require.Len(t, sent[*wire.AbortAck](c.Effects()), 1, "the honest early abort's ABORT_ACK")
	const flood = 100
	for i := range flood {
		c.Step(t0, Received{&wire.Abort{From: flooder, Room: 1<<40 + uint64(i), Reason: "flood"}})
		acks := sent[*wire.AbortAck](c.Effects())
		require.Len(t, acks, 1, "flooded ABORT %d's ABORT_ACK", i)
		require.True(t, acks[0].Drained, "flooded ABORT %d's ABORT_ACK", i)
	}
	st := c.Stats()
	assert.Equal(t, uint64(flood-share), st.EarlyAbortsForgotten, "the flooder's early aborts past its share of %d", share)
	assert.Zero(t, st.TombstonesEvicted, "no tombstone forgotten past MaxTombstones: the flood forgot its own")
	assert.Equal(t, share+1, c.Sizes().Tombstones, "the flooder's share and room 7's")
	for i := flood - share; i < flood; i++ {
		_, kept := c.reg.tombs[1<<40+uint64(i)]
		assert.True(t, kept, "the flooder's newest early aborts are the ones kept (room %d)", 1<<40+i)
	}
	c.Step(t0.Add(time.Second), CreateSender{Room: 7})
	st7, _ := c.Status(7)
	assert.Equal(t, Failed, st7, "room 7's sender, created after its early abort and the flood, starts Failed")
}

// TestAbortFloodKeepsARoomAnotherRankAborted: a flooding rank aborts room
// 7 first (an id it learned), then the honest rank that asked for it
// aborts it early too, then the flood goes on past the flooder's share.
// Room 7's tombstone is no longer the flooder's alone: it is not among
// the flooder's oldest to forget, and the sender created later starts
// Failed.
func TestAbortFloodKeepsARoomAnotherRankAborted(t *testing.T) {
	reg := simRegistryConfig()
	reg.MaxTombstones = 16
	c := newTestCore(t, RolePrefill, reg)
	flooder := wire.From{Role: "decode", Instance: "d", Rank: 1, Endpoint: "tcp://f:1", Epoch: 3}
	c.Step(t0, Received{&wire.Abort{From: flooder, Room: 7, Reason: "flood"}})
	c.Step(t0, Received{&wire.Abort{From: decodeFrom, Room: 7, Reason: "cancelled"}})
	require.Len(t, sent[*wire.AbortAck](c.Effects()), 2, "both ABORTs of room 7 answered")
	for i := range 100 {
		c.Step(t0, Received{&wire.Abort{From: flooder, Room: 1<<40 + uint64(i), Reason: "flood"}})
	}
	assert.Positive(t, c.Stats().EarlyAbortsForgotten, "the flooder's own early aborts forgotten past its share")
	_, kept := c.reg.tombs[7]
	require.True(t, kept, "room 7's tombstone, aborted by %s too, forgotten by %s's flood", decodeFrom.Peer(), flooder.Peer())
	c.Step(t0.Add(time.Second), CreateSender{Room: 7})
	st, _ := c.Status(7)
	assert.Equal(t, Failed, st, "room 7's sender starts Failed")
}

// TestExpiredTombstoneAnswersWhatItOwes: a room cleared while its write
// was in flight keeps, in its tombstone, the ABORT_ACK owed to the decode
// rank that aborted it (until the write drains, or its drain deadline).
// When the first event to find the tombstone past its TTL is not a tick
// (here another decode rank's ABORT of the id, the first step after a
// long stall), the tombstone is forgotten there: it still answers the
// ABORT it owes (not drained: its write never completed), as the tick
// that enforces the drain deadline would have, instead of dropping the
// ABORT_ACK with it (the aborting rank would never hear it).
func TestExpiredTombstoneAnswersWhatItOwes(t *testing.T) {
	reg := simRegistryConfig()
	c := newTestCore(t, RolePrefill, reg)
	register(t, c, decodeFrom)
	require.True(t, c.Step(t0, Received{request(7, decodeFrom)}).OK, "REQUEST refused: %v", sent[*wire.Status](c.Effects()))
	c.Step(t0, CreateSender{Room: 7})
	c.Step(t0, InitSender{Room: 7})
	require.NoError(t, c.Step(t0, SendChunk{Room: 7, Pages: []uint32{1}, AuxIndex: -1, Last: true}).Err)
	var posts []Effect
	for _, e := range c.Effects() {
		if e.Kind == EffectPost {
			posts = append(posts, e)
		}
	}
	require.Len(t, posts, 1, "the chunk's post")
	require.True(t, c.Step(t0, Posting{Room: 7, Write: &posts[0].Writes[0]}).OK, "the write may be posted")
	c.Step(t0, Received{&wire.Abort{From: decodeFrom, Room: 7, Reason: "cancelled"}})
	require.Empty(t, sent[*wire.AbortAck](c.Effects()), "the write is in flight: the ABORT_ACK is owed, not sent")
	c.Step(t0, ClearSender{Room: 7})
	c.Effects()
	require.NotNil(t, c.reg.tombs[7], "room 7's tombstone")
	require.Len(t, c.reg.tombs[7].acks, 1, "the tombstone owes decode rank 0's ABORT_ACK")

	// No tick until past the TTL: the next step is rank 1's ABORT.
	other := decodeFrom
	other.Rank, other.Endpoint = 1, "tcp://d:2"
	late := t0.Add(reg.TombstoneTTL + time.Second)
	c.Step(late, Received{&wire.Abort{From: other, Room: 7, Reason: "cancelled"}})
	c.Step(late, Tick{})
	owed := map[string][]bool{}
	for _, e := range c.Effects() {
		if a, ok := e.Msg.(*wire.AbortAck); ok && e.Kind == EffectSend && a.Room == 7 {
			owed[e.To.Endpoint] = append(owed[e.To.Endpoint], a.Drained)
		}
	}
	assert.Equal(t, []bool{false}, owed[decodeFrom.Endpoint], "decode rank 0's ABORT answered once, not drained (its write never completed)")
	assert.Len(t, owed[other.Endpoint], 1, "decode rank 1's ABORT answered")
}

// TestRepeatedAbortKeepsTombQBounded: a rank repeating one early ABORT
// renews its tombstone's TTL each time, and each renewal queues an entry
// for the expiry order. Between two ticks the queue stays within its
// bound (stale entries compacted past 2×tombstones+64), however many
// repeats come.
func TestRepeatedAbortKeepsTombQBounded(t *testing.T) {
	c := newTestCore(t, RolePrefill, simRegistryConfig())
	now := t0
	for range 10000 {
		now = now.Add(time.Microsecond)
		c.Step(now, Received{&wire.Abort{From: decodeFrom, Room: 7, Reason: "again"}})
		require.LessOrEqual(t, len(c.reg.tombQ), 2*len(c.reg.tombs)+65, "the tombstones' expiry queue grew past its bound between ticks")
	}
	assert.Len(t, sent[*wire.AbortAck](c.Effects()), 10000, "every ABORT answered")
}

// TestRequestFloodForgetsItsOwn: a registered decode rank floods a prefill
// rank with REQUESTs for rooms that never get a sender; past the pending
// deadline each becomes an early-abort tombstone — the flooding rank's
// own share, so the honest rank's early abort of room 7 is not forgotten
// for them (before, those tombstones were no rank's: 40 of them over a
// bound of 16 made the prefill rank forget room 7's).
func TestRequestFloodForgetsItsOwn(t *testing.T) {
	reg := simRegistryConfig()
	reg.MaxTombstones, reg.MaxPendingPerPeer, reg.MaxPendingRooms = 16, 64, 64
	c := newTestCore(t, RolePrefill, reg)
	flooder := wire.From{Role: "decode", Instance: "d", Rank: 1, Endpoint: "tcp://f:1", Epoch: 3}
	register(t, c, flooder)
	c.Step(t0, Received{&wire.Abort{From: decodeFrom, Room: 7, Reason: "cancelled"}})
	for i := range 40 {
		require.True(t, c.Step(t0, Received{request(100+uint64(i), flooder)}).OK, "flooded REQUEST %d", i)
	}
	c.Effects()
	c.Step(t0.Add(reg.PendingTimeout+time.Second), Tick{})
	st := c.Stats()
	assert.Zero(t, st.TombstonesEvicted, "a tombstone forgotten past the bound: the expired REQUESTs' were not their rank's share")
	assert.GreaterOrEqual(t, st.EarlyAbortsForgotten, uint64(40-reg.MaxTombstones/8), "the flooder's expired rooms past its share, forgotten")
	_, kept := c.reg.tombs[7]
	require.True(t, kept, "room 7's early abort forgotten for another rank's expired REQUESTs")
	c.Step(t0.Add(reg.PendingTimeout+2*time.Second), CreateSender{Room: 7})
	s7, _ := c.Status(7)
	assert.Equal(t, Failed, s7, "room 7's sender starts Failed")
}

// TestEarlyAbortsForgottenOldestFirst: a rank's early aborts past its share
// are forgotten in the order of their last ABORT — one renewed, or made
// again after it expired, counts from then (its earlier entry is stale).
func TestEarlyAbortsForgottenOldestFirst(t *testing.T) {
	reg := simRegistryConfig()
	reg.MaxTombstones = 16 // a share of 2
	c := newTestCore(t, RolePrefill, reg)
	abort := func(at time.Time, room uint64) {
		c.Step(at, Received{&wire.Abort{From: decodeFrom, Room: room, Reason: "x"}})
	}
	abort(t0, 1)
	abort(t0.Add(time.Second), 2)
	abort(t0.Add(2*time.Second), 1) // renewed: now the newer of the two
	abort(t0.Add(3*time.Second), 3) // over the share: 2 goes, not 1
	_, has1 := c.reg.tombs[1]
	_, has2 := c.reg.tombs[2]
	assert.True(t, has1, "room 1, renewed last, forgotten before room 2")
	assert.False(t, has2, "room 2, the oldest by its last ABORT, kept")
	// Room 1 expires and is aborted again: its old entry must not make it
	// the oldest.
	later := t0.Add(2*time.Second + reg.TombstoneTTL + time.Second)
	c.Step(later, Tick{}) // 1 and 3 expire
	abort(later, 4)
	abort(later.Add(time.Second), 1)
	abort(later.Add(2*time.Second), 5) // over the share: 4 goes
	_, has1 = c.reg.tombs[1]
	_, has4 := c.reg.tombs[4]
	assert.True(t, has1, "room 1, aborted again after it expired, forgotten by its stale entry")
	assert.False(t, has4, "room 4, the oldest, kept")
}

// TestRenewedEarlyAbortsStayInTheShare: a flooding rank that sends each of
// its ABORTs twice (the second renews the tombstone's TTL) still keeps no
// more than its share, and never makes the prefill rank forget another
// rank's early abort.
func TestRenewedEarlyAbortsStayInTheShare(t *testing.T) {
	reg := simRegistryConfig()
	reg.MaxTombstones = 16
	c := newTestCore(t, RolePrefill, reg)
	flooder := wire.From{Role: "decode", Instance: "flood", Rank: 0, Endpoint: "tcp://f:1", Epoch: 3}
	c.Step(t0, Received{&wire.Abort{From: decodeFrom, Room: 7, Reason: "cancelled"}})
	now := t0
	for i := range 100 {
		for range 2 {
			now = now.Add(time.Millisecond)
			c.Step(now, Received{&wire.Abort{From: flooder, Room: 1<<40 + uint64(i), Reason: "flood"}})
		}
		require.LessOrEqual(t, c.reg.earlyBy[flooder.Peer()], reg.MaxTombstones/8, "after %d renewed ABORTs the flooder keeps more than its share", i+1)
	}
	assert.Zero(t, c.Stats().TombstonesEvicted, "a tombstone forgotten past the bound")
	_, kept := c.reg.tombs[7]
	assert.True(t, kept, "room 7's early abort forgotten for a flood of renewed ABORTs")
}
