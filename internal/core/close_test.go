package core

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"

	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ackSends lists the ABORT_ACKs among effects as "room drained → endpoint".
func ackSends(effects []Effect) []string {
	var out []string
	for _, e := range effects {
		if a, ok := e.Msg.(*wire.AbortAck); ok && e.Kind == EffectSend {
			out = append(out, fmt.Sprintf("%d %v → %s", a.Room, a.Drained, e.To.Endpoint))
		}
	}
	return out
}

// codes lists the STATUS messages among effects as "room code".
func codes(effects []Effect) map[uint64]string {
	out := map[uint64]string{}
	for _, s := range sent[*wire.Status](effects) {
		out[s.Room] = s.Code
	}
	return out
}

// TestClosedRankRefusesRooms: Close fails the live rooms (their decode
// ranks told), answers the REQUESTs waiting for a sender (aborted, the id
// tombstoned), and from then on the rank creates no room and takes no
// REQUEST, naming the room; a decode rank's refusal of a room it could
// not create owes no ABORT once it is closed (it exits: nothing would
// acknowledge them).
func TestClosedRankRefusesRooms(t *testing.T) {
	c := registeredCore(t, 2)
	req := func(room uint64) {
		c.Step(t0, Received{Msg: &wire.Request{From: decodeFrom, Room: room, DstPages: []uint32{uint32(room)}, AuxIndex: -1, Required: 1, StateIndices: [][]uint32{}}})
	}
	req(1) // waits for its sender
	c.Step(t0, CreateSender{Room: 2})
	c.Step(t0, InitSender{Room: 2})
	req(2)
	st, _ := c.Status(2)
	require.Equal(t, WaitingForInput, st)
	c.Effects()

	c.Step(t0, Close{Reason: "test"})
	assert.Equal(t, map[uint64]string{0: CodeClosed, 1: CodeAborted, 2: CodeFailed}, codes(c.Effects()),
		"the waiting REQUEST and the live room's decode rank told, then the decode rank that the rank closed")
	st, _ = c.Status(2)
	assert.Equal(t, Failed, st)
	assert.Zero(t, c.RoomSizes().Pending, "no REQUEST waits for a sender on a closed rank")

	res := c.Step(t0, CreateSender{Room: 3}).Result
	require.Equal(t, Rejected, res.Outcome)
	require.ErrorIs(t, res.Err, ErrRankClosed)
	require.EqualError(t, res.Err, "room 3: kvmanager: manager closed")
	req(4)
	assert.Equal(t, map[uint64]string{4: CodeRejected}, codes(c.Effects()), "a REQUEST after Close refused")
	_, ok := c.Status(4)
	assert.False(t, ok)
	assert.Zero(t, c.RoomSizes().Pending)

	d := testCore(t, RoleDecode)
	d.Step(t0, Close{Reason: "test"})
	res = d.Step(t0, CreateReceiver{Room: 5, Targets: []Target{prefillT}}).Result
	require.ErrorIs(t, res.Err, ErrRankClosed)
	require.ErrorContains(t, res.Err, "room 5")
	d.Step(t0, RefuseRoom{Room: 6, Targets: []Target{prefillT}, Reason: "its links were not found"})
	d.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
	d.Step(t0, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true}})
	assert.Empty(t, sent[*wire.Abort](d.Effects()), "a closed decode rank owes no ABORT for a room it refused")
	assert.Zero(t, d.RoomSizes().Total())
}

// TestClosedRankRefusesRegisters: a closed prefill rank binds no decode
// rank and answers no REGISTER (the decode rank's retries and lookups find
// the rank's next process; a refusal would fail its waiting rooms as
// incompatible). One that arrives after Close is dropped with no agent
// challenged and no metadata loaded; one whose load was under way at
// Close is dropped when the load ends, not acknowledged, and one whose
// load or proof read Close cut short is dropped, not refused. Each is
// counted.
func TestClosedRankRefusesRegisters(t *testing.T) {
	m := kvlayout.Model{Layers: 1, KVHeads: 2, HeadBytes: 4, PageTokens: 2, Layout: kvlayout.HND}
	dropped := func(c *Core, want uint64) {
		t.Helper()
		effects := c.Effects()
		for _, e := range effects {
			require.NotContains(t, []EffectKind{EffectChallenge, EffectLoadMetadata}, e.Kind, "a closed rank challenged or loaded a REGISTER's agent")
		}
		require.Empty(t, sent[*wire.RegisterAck](effects), "a closed rank answered a REGISTER")
		require.Equal(t, want, c.stats.ClosedRegisters, "REGISTERs dropped at a closed rank, counted")
	}

	c, reg := mappedCore(t, m, 2)
	c.Step(t0, Close{Reason: "shutting down"})
	c.Effects()
	c.Step(t0, Received{Msg: reg})
	dropped(c, 1)
	c.Step(t0, Received{Msg: reg}) // its repeat
	dropped(c, 2)

	c, reg = mappedCore(t, m, 2)
	pp, err := c.CheckRegister(reg)
	require.NoError(t, err)
	echoChallenge(t, c, reg, t0) // its load asked for
	c.Effects()
	c.Step(t0, Close{Reason: "shutting down"})
	c.Effects()
	c.Step(t0, Registered{From: decodeFrom, Remote: "agent", Plan: pp})
	dropped(c, 1)
	assert.Empty(t, c.prefillCore.peers, "a registration loaded while the rank closed bound")

	// A load or proof read that Close cut short (its context cancelled)
	// ends refused by the shell: dropped too, and no ownership failure
	// counted.
	c, reg = mappedCore(t, m, 2)
	echoChallenge(t, c, reg, t0)
	c.Effects()
	c.Step(t0, Close{Reason: "shutting down"})
	c.Effects()
	notOwner := c.stats.LayoutRefused[RefusedNotOwner]
	c.Step(t0, RegisterRefused{From: decodeFrom, Reason: "reading the proof slots: context canceled", NotOwner: true})
	dropped(c, 1)
	assert.Equal(t, notOwner, c.stats.LayoutRefused[RefusedNotOwner], "a read Close cut short counted as not_owner")
}

// TestClosedRankAcksUnasked: Close owes every decode rank whose REQUEST
// the rank took a drained ABORT_ACK, unasked (its ABORT may not be read
// before the process exits, and the pages would wait out the quarantine):
// at once for a REQUEST still waiting for its sender (nothing was
// written), and for a room failed with a write in flight only once that
// write drains — never before. An ABORT that comes before the exit is
// answered as ever.
func TestClosedRankAcksUnasked(t *testing.T) {
	c, writes := prefillChunkQueued(t)
	require.True(t, c.Step(t0, Posting{Room: 1, Write: &writes[0]}).OK, "the chunk's write was not posted")
	c.Step(t0, Received{Msg: request(2, decodeFrom)}) // waits for its sender
	c.Effects()

	c.Step(t0, Close{Reason: "test"})
	effects := c.Effects()
	assert.Equal(t, map[uint64]string{0: CodeClosed, 1: CodeFailed, 2: CodeAborted}, codes(effects), "the decode rank told of both rooms, and that the rank closed")
	assert.Equal(t, []string{"2 true → " + decodeFrom.Endpoint}, ackSends(effects),
		"at Close: the REQUEST no sender served acknowledged drained, room 1 (its write in flight) not yet")

	c.Step(t0.Add(time.Second), WriteDone{Room: 1, Write: &writes[0]})
	assert.Equal(t, []string{"1 true → " + decodeFrom.Endpoint}, ackSends(c.Effects()), "room 1 acknowledged drained, unasked, once its write drained")

	c.Step(t0.Add(time.Second), Received{Msg: &wire.Abort{From: decodeFrom, Room: 1, Reason: "prefill closed"}})
	assert.Equal(t, []string{"1 true → " + decodeFrom.Endpoint}, ackSends(c.Effects()), "the decode rank's own ABORT answered")

	// A room the application cleared while its write was in flight, then
	// Close: its tombstone owes the ACK.
	c, writes = prefillChunkQueued(t)
	require.True(t, c.Step(t0, Posting{Room: 1, Write: &writes[0]}).OK, "the chunk's write was not posted")
	c.Step(t0, ClearSender{Room: 1})
	require.Equal(t, map[uint64]string{1: CodeCleared}, codes(c.Effects()))
	c.Step(t0, Close{Reason: "test"})
	assert.Empty(t, ackSends(c.Effects()), "at Close: the cleared room's write is in flight")
	c.Step(t0.Add(time.Second), WriteDone{Room: 1, Write: &writes[0]})
	assert.Equal(t, []string{"1 true → " + decodeFrom.Endpoint}, ackSends(c.Effects()), "the cleared room acknowledged drained, unasked, once its write drained")

	// A write that failed without the engine quiescing it may still land
	// until the stall deadline: no drained ACK at Close, and past the
	// deadline only an undrained one (the quarantine bounds the pages).
	c, writes = prefillChunkQueued(t)
	require.True(t, c.Step(t0, Posting{Room: 1, Write: &writes[0]}).OK, "the chunk's write was not posted")
	c.Step(t0, WriteDone{Room: 1, Write: &writes[0], Err: errors.New("nic reset"), Quiesced: false})
	c.Effects()
	c.Step(t0, Close{Reason: "test"})
	assert.Empty(t, ackSends(c.Effects()), "at Close: the failed write may still land")
	c.Step(t0.Add(simRegistryConfig().StallTimeout+time.Second), Tick{})
	assert.Equal(t, []string{"1 false → " + decodeFrom.Endpoint}, ackSends(c.Effects()), "past the drain deadline: undrained")
}

// TestClearedRoomAcksDrained: a room the prefill application clears
// before it finished is told to its decode ranks (STATUS cleared) and,
// when nothing of it can land, acknowledged drained with it, unasked — a
// rank that closes right after would never read their ABORTs. With a
// write in flight, no ACK goes with the STATUS.
func TestClearedRoomAcksDrained(t *testing.T) {
	c, _ := prefillChunkQueued(t)
	c.Step(t0, ClearSender{Room: 1}) // its write never posted
	effects := c.Effects()
	assert.Equal(t, map[uint64]string{1: CodeCleared}, codes(effects))
	assert.Equal(t, []string{"1 true → " + decodeFrom.Endpoint}, ackSends(effects), "nothing can land: the drained ACK with the STATUS")

	c, writes := prefillChunkQueued(t)
	require.True(t, c.Step(t0, Posting{Room: 1, Write: &writes[0]}).OK, "the chunk's write was not posted")
	c.Step(t0, ClearSender{Room: 1})
	effects = c.Effects()
	assert.Equal(t, map[uint64]string{1: CodeCleared}, codes(effects))
	assert.Empty(t, ackSends(effects), "a write in flight: no ACK with the STATUS")
}

// TestClosedNoticeCutsRequests, prefill side: Close tells each bound
// decode rank, last (after every STATUS of its rooms), that it closed and
// the highest REQUEST number of that process it took; a REQUEST read
// after Close is refused and does not raise it.
func TestClosedNoticeCutsRequests(t *testing.T) {
	c := testCore(t, RolePrefill)
	register(t, c, decodeFrom)
	other := decodeFrom
	other.Rank, other.Endpoint = 1, "tcp://d:2"
	register(t, c, other)
	numbered := func(room, n uint64) *wire.Request {
		q := request(room, decodeFrom)
		q.N = n
		return q
	}
	c.Step(t0, Received{Msg: numbered(1, 1)}) // waits for its sender
	c.Step(t0, CreateSender{Room: 2})
	c.Step(t0, InitSender{Room: 2})
	c.Step(t0, Received{Msg: numbered(2, 3)}) // a number skipped: lost on the way
	register(t, c, decodeFrom)                // its process registers again: what it sent stays taken
	c.Effects()

	c.Step(t0, Close{Reason: "test"})
	effects := c.Effects()
	var last *wire.Status
	notices := map[string]uint64{}
	for _, e := range effects {
		if m, ok := e.Msg.(*wire.Status); ok && e.Kind == EffectSend {
			last = m
			if m.Code == CodeClosed {
				require.Zero(t, m.Room)
				notices[e.To.Endpoint] = m.Taken
			}
		}
	}
	require.NotNil(t, last)
	assert.Equal(t, CodeClosed, last.Code, "the notice goes after every STATUS of the rank's rooms")
	assert.Equal(t, map[string]uint64{decodeFrom.Endpoint: 3, other.Endpoint: 0}, notices,
		"each bound decode rank told the highest of its REQUESTs taken")
	assert.EqualValues(t, 2, c.stats.ClosedNotices)

	c.Step(t0, Received{Msg: numbered(4, 4)})
	assert.Equal(t, map[uint64]string{4: CodeRejected}, codes(c.Effects()), "a REQUEST after Close refused")
}

// closingDecode is a decode core registered at prefillFrom with rooms
// 1..n sent there (REQUESTs numbered 1..n).
func closingDecode(t *testing.T, n int) *Core {
	t.Helper()
	d := testCore(t, RoleDecode)
	for room := uint64(1); room <= uint64(n); room++ {
		d.Step(t0, CreateReceiver{Room: room, Targets: []Target{prefillT}})
	}
	d.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint, Epoch: prefillFrom.Epoch})
	d.Step(t0, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true}})
	for room := uint64(1); room <= uint64(n); room++ {
		d.Step(t0, InitReceiver{Room: room, Spec: RequestSpec{DstPages: []uint32{uint32(room)}, AuxIndex: -1, Required: 1}})
	}
	var got []uint64
	for _, q := range sent[*wire.Request](d.Effects()) {
		got = append(got, q.N)
	}
	require.Len(t, got, n)
	for i, v := range got {
		require.EqualValues(t, i+1, v, "REQUESTs numbered from 1 in the order sent")
	}
	return d
}

// TestClosedNoticeFreesUntakenRooms, decode side: a closing prefill
// process's notice fails at once each live room whose REQUEST it never
// took (numbered above Taken), its pages released unforced — nothing of it
// was or will be written — and leaves a room it took to its writes; no
// REGISTER or REQUEST goes to the closed process again: the rank is
// looked up, a record still naming the closed process fails the rooms
// waiting for it, and one naming the rank's next process registers there.
func TestClosedNoticeFreesUntakenRooms(t *testing.T) {
	d := closingDecode(t, 3)
	d.Step(t0, Received{Msg: &wire.Status{From: prefillFrom, Status: wire.StatusFailed, Code: CodeClosed, Taken: 1, Reason: "prefill rank closed: test"}})
	effects := d.Effects()
	st, _ := d.Status(1)
	assert.Equal(t, WaitingForInput, st, "room 1, taken before Close, left to its writes")
	for _, room := range []uint64{2, 3} {
		st, _ := d.Status(room)
		require.Equal(t, Failed, st, "room %d never taken", room)
		rep, _ := d.Report(room)
		assert.Equal(t, CodeClosed, rep.Code)
		assert.Contains(t, rep.Reason, fmt.Sprintf("REQUEST %d of room %d not taken", room, room))
	}
	var released []uint64
	for _, e := range effects {
		if e.Kind == EffectReleased {
			require.False(t, e.Forced)
			released = append(released, e.Room)
		}
	}
	assert.Equal(t, []uint64{2, 3}, released, "the untaken rooms' pages free at once")
	assert.EqualValues(t, 2, d.stats.ClosedUntaken)
	require.Len(t, effectsOf(effects, EffectResolve), 1, "the rank looked up again")

	// Its record still names the closed process: a room waiting for the
	// rank fails, and nothing goes to that process.
	d.Step(t0, CreateReceiver{Room: 4, Targets: []Target{prefillT}})
	d.Step(t0, InitReceiver{Room: 4, Spec: RequestSpec{DstPages: []uint32{4}, AuxIndex: -1, Required: 1}})
	d.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint, Epoch: prefillFrom.Epoch})
	effects = d.Effects()
	assert.Empty(t, sent[*wire.Register](effects), "a REGISTER to the closed process")
	assert.Empty(t, sent[*wire.Request](effects), "a REQUEST to the closed process")
	st, _ = d.Status(4)
	assert.Equal(t, Failed, st, "the room waiting for the rank fails while its record names the closed process")
	assert.EqualValues(t, 1, d.stats.ClosedRecords)

	// The rank's next process (a pod restarted elsewhere) takes the next room.
	next := prefillFrom
	next.Endpoint, next.Epoch = "tcp://p:2", 11
	d.Step(t0, CreateReceiver{Room: 5, Targets: []Target{prefillT}})
	d.Step(t0, InitReceiver{Room: 5, Spec: RequestSpec{DstPages: []uint32{5}, AuxIndex: -1, Required: 1}})
	require.Len(t, effectsOf(d.Effects(), EffectResolve), 1, "looked up again for the next room, not registered at the closed process")
	d.Step(t0, Resolved{Target: prefillT, Endpoint: next.Endpoint, Epoch: next.Epoch})
	require.Len(t, sent[*wire.Register](d.Effects()), 1)
	d.Step(t0, Received{Msg: &wire.RegisterAck{From: next, OK: true}})
	reqs := sent[*wire.Request](d.Effects())
	require.Len(t, reqs, 1)
	assert.EqualValues(t, 5, reqs[0].Room)
}

// TestClosedNoticeFromAnotherProcessIgnored: a notice from a process other
// than the one the registration names (a late one from before a restart)
// touches nothing, counted.
func TestClosedNoticeFromAnotherProcessIgnored(t *testing.T) {
	d := closingDecode(t, 2)
	old := prefillFrom
	old.Epoch = 9
	stale := d.stats.StaleEpoch
	d.Step(t0, Received{Msg: &wire.Status{From: old, Status: wire.StatusFailed, Code: CodeClosed, Reason: "prefill rank closed: test"}})
	assert.Empty(t, d.Effects())
	for _, room := range []uint64{1, 2} {
		st, _ := d.Status(room)
		assert.Equal(t, WaitingForInput, st)
	}
	assert.Greater(t, d.stats.StaleEpoch, stale)
	assert.Zero(t, d.stats.ClosedHeard)
}

// effectsOf returns the effects of kind.
func effectsOf(effects []Effect, kind EffectKind) []Effect {
	var out []Effect
	for _, e := range effects {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// TestClosedNoticeThenRestartInPlace: after a closing notice, a record at
// the same endpoint that names a new epoch (the rank restarted in place),
// or says no epoch, is registered with: the rank's next process serves
// the next room.
func TestClosedNoticeThenRestartInPlace(t *testing.T) {
	for _, epoch := range []uint64{prefillFrom.Epoch + 1, 0} {
		d := closingDecode(t, 1)
		d.Step(t0, Received{Msg: &wire.Status{From: prefillFrom, Status: wire.StatusFailed, Code: CodeClosed, Taken: 1, Reason: "prefill rank closed: test"}})
		d.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint, Epoch: epoch})
		d.Effects()
		d.Step(t0, CreateReceiver{Room: 2, Targets: []Target{prefillT}})
		d.Step(t0, InitReceiver{Room: 2, Spec: RequestSpec{DstPages: []uint32{2}, AuxIndex: -1, Required: 1}})
		require.Len(t, sent[*wire.Register](d.Effects()), 1, "record epoch %d: not registered with", epoch)
		next := prefillFrom
		next.Epoch++
		d.Step(t0, Received{Msg: &wire.RegisterAck{From: next, OK: true}})
		reqs := sent[*wire.Request](d.Effects())
		require.Len(t, reqs, 1, "record epoch %d", epoch)
		assert.EqualValues(t, 2, reqs[0].Room)
		assert.EqualValues(t, 2, reqs[0].N, "numbers go on growing across the rank's processes")
	}
}

// closedNotice is prefillFrom's closing notice, taken up to taken.
func closedNotice(taken uint64) Received {
	return Received{Msg: &wire.Status{From: prefillFrom, Status: wire.StatusFailed, Code: CodeClosed, Taken: taken, Reason: "prefill rank closed: test"}}
}

// TestClosedNoticeBeforeRegisterAck: a notice that comes while a
// registration with its process is on the way (a REGISTER sent again after
// not_registered, or the first, whose REGISTER_ACK or offer load is still
// under way) is taken, and that process's REGISTER_ACK, arriving after,
// registers nothing: no REQUEST goes to the closed process (found by the
// review: the ACK made the registration good again).
func TestClosedNoticeBeforeRegisterAck(t *testing.T) {
	d := closingDecode(t, 1)
	d.Step(t0, Received{Msg: &wire.Status{From: prefillFrom, Room: 1, Status: wire.StatusFailed, Code: CodeNotRegistered, Reason: "x"}})
	require.Len(t, sent[*wire.Register](d.Effects()), 1, "registers again")
	d.Step(t0, closedNotice(0))
	d.Step(t0, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true}})
	assert.Empty(t, sent[*wire.Request](d.Effects()), "a REQUEST to the closed process")

	// The first registration, its ACK not yet in; its record names the
	// process's epoch, or none.
	for _, epoch := range []uint64{prefillFrom.Epoch, 0} {
		d = testCore(t, RoleDecode)
		d.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
		d.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint, Epoch: epoch})
		d.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1, Required: 1}})
		require.Len(t, sent[*wire.Register](d.Effects()), 1)
		d.Step(t0, closedNotice(0))
		d.Step(t0, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true}})
		assert.Empty(t, sent[*wire.Request](d.Effects()), "record epoch %d: a REQUEST to the closed process", epoch)
		assert.EqualValues(t, 1, d.stats.ClosedHeard, "record epoch %d", epoch)
	}
}

// TestClosedNoticeLookupFailsOnce: after a notice, a lookup that fails for
// want of the bootstrap service fails the rooms waiting for the rank
// rather than looking it up again at once (found by the review: a lookup
// loop with no backoff while the service refused connections).
func TestClosedNoticeLookupFailsOnce(t *testing.T) {
	d := closingDecode(t, 1)
	d.Step(t0, closedNotice(1))
	d.Effects()
	d.Step(t0, CreateReceiver{Room: 2, Targets: []Target{prefillT}})
	d.Step(t0, InitReceiver{Room: 2, Spec: RequestSpec{DstPages: []uint32{2}, AuxIndex: -1, Required: 1}})
	d.Effects()
	d.Step(t0, ResolveFailed{Target: prefillT, Err: errors.New("connection refused")})
	assert.Empty(t, effectsOf(d.Effects(), EffectResolve), "looked up again at once")
	st, _ := d.Status(2)
	assert.Equal(t, Failed, st, "the room waiting for a closed rank whose lookup failed")
	reason, _ := d.Failure(2)
	assert.Contains(t, reason, "connection refused (its last process, tcp://p:1 epoch 10, closed)", "the reason names the lookup's error and the closed process")
}

// TestClosedNoticeFreesFailedRooms: a room that failed (aborted here) or
// was cleared before the notice, its REQUEST never taken by the closed
// process, releases its pages at the notice, not at the quarantine
// (found by the review).
func TestClosedNoticeFreesFailedRooms(t *testing.T) {
	d := closingDecode(t, 3)
	d.Step(t0, AbortReceiver{Room: 2, Reason: "client went away"})
	d.Step(t0, ClearReceiver{Room: 3})
	d.Effects()
	d.Step(t0, closedNotice(1))
	var released []uint64
	for _, e := range effectsOf(d.Effects(), EffectReleased) {
		require.False(t, e.Forced)
		released = append(released, e.Room)
	}
	assert.Equal(t, []uint64{2, 3}, released)
	assert.True(t, d.Hold(1), "room 1 holds its pages: taken")
}

// TestClosedProcessAnswersAfterTheRankMoved: a closing prefill process's
// drained ABORT_ACK (sent once its writes drain, after its record was
// deleted) arrives after the decode rank has looked the rank up and found
// its next process elsewhere: it still answers for the REQUEST that
// process took, so the pages are released at once, not at the quarantine
// (found by a fault hunt on processes: the ACK was matched against the
// rank's new endpoint and dropped as stale). A STATUS the old process
// sends for a room it took counts the same way.
func TestClosedProcessAnswersAfterTheRankMoved(t *testing.T) {
	d := closingDecode(t, 2)
	failed := &wire.Status{From: prefillFrom, Room: 1, Status: wire.StatusFailed, Code: CodeFailed, Reason: "prefill rank closed: manager closed"}
	d.Step(t0, Received{Msg: failed})
	d.Step(t0, closedNotice(2))
	next := prefillFrom
	next.Endpoint, next.Epoch = "tcp://p:2", 11
	d.Step(t0, Resolved{Target: prefillT, Endpoint: next.Endpoint, Epoch: next.Epoch})
	d.Effects()

	d.Step(t0, Received{Msg: &wire.Status{From: prefillFrom, Room: 2, Status: wire.StatusFailed, Code: CodeFailed, Reason: "prefill rank closed: manager closed"}})
	st, _ := d.Status(2)
	assert.Equal(t, Failed, st, "room 2's STATUS from the process its REQUEST went to")
	for _, room := range []uint64{1, 2} {
		d.Step(t0, Received{Msg: &wire.AbortAck{From: prefillFrom, Room: room, Drained: true}})
		released := effectsOf(d.Effects(), EffectReleased)
		require.Len(t, released, 1, "room %d: the closed process's drained ACK released nothing", room)
		assert.False(t, released[0].Forced)
	}
}

// TestAckFromAnotherProcessAtTheEndpoint: once the rank has moved, a
// drained ACK from the endpoint its REQUEST went to, but from another
// process there (another epoch: the port reused), releases nothing.
func TestAckFromAnotherProcessAtTheEndpoint(t *testing.T) {
	d := closingDecode(t, 1)
	d.Step(t0, Received{Msg: &wire.Status{From: prefillFrom, Room: 1, Status: wire.StatusFailed, Code: CodeFailed, Reason: "x"}})
	d.Step(t0, closedNotice(1))
	d.Step(t0, Resolved{Target: prefillT, Endpoint: "tcp://p:2", Epoch: 11})
	d.Effects()
	other := prefillFrom
	other.Rank, other.Epoch = 1, 30 // another rank's process, the port reused
	d.Step(t0, Received{Msg: &wire.AbortAck{From: other, Room: 1, Drained: true}})
	assert.Empty(t, effectsOf(d.Effects(), EffectReleased), "released on another process's ACK")
	assert.True(t, d.Hold(1))
}

// TestFailedRoomAcksWithItsStatus: a prefill room that fails with nothing
// of it in flight sends its decode rank the drained ABORT_ACK with the
// STATUS, unasked: the decode rank's ABORT, a round trip later, may find
// the process gone (killed, or closed and exited). One that fails with a
// write in flight sends none until that write drains and it is asked.
func TestFailedRoomAcksWithItsStatus(t *testing.T) {
	c := prefillRequested(t)
	c.Step(t0, AbortSender{Room: 1, Reason: "the request was cancelled"})
	effects := c.Effects()
	assert.Equal(t, map[uint64]string{1: CodeAborted}, codes(effects))
	assert.Equal(t, []string{"1 true → " + decodeFrom.Endpoint}, ackSends(effects), "nothing in flight: the drained ACK with the STATUS")

	c, writes := prefillChunkQueued(t)
	require.True(t, c.Step(t0, Posting{Room: 1, Write: &writes[0]}).OK)
	c.Effects()
	c.Step(t0, AbortSender{Room: 1, Reason: "the request was cancelled"})
	effects = c.Effects()
	assert.Equal(t, map[uint64]string{1: CodeAborted}, codes(effects))
	assert.Empty(t, ackSends(effects), "an ACK while a write is in flight")
}
