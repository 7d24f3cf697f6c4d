package core

import (
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRoomPhases: a prefill room's first entry into each status, on the
// core's clock, driven through Step — created at t0, initialised at +1 s,
// its REQUEST in at +2 s, its first write posted at +5 s and a second at
// +6 s (the first entry into Transferring counts), both done at +9 s —
// gives the phases kvbridge_room_phase_seconds records: 2, 3 and 4 s.
func TestRoomPhases(t *testing.T) {
	c := testCore(t, RolePrefill)
	register(t, c, decodeFrom)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	c.Step(at(0), CreateSender{Room: 1})
	c.Step(at(1), InitSender{Room: 1})
	require.True(t, c.Step(at(2), Received{Msg: request(1, decodeFrom)}).OK, "REQUEST refused")
	require.NoError(t, c.Step(at(4), SendChunk{Room: 1, Pages: []uint32{0}, Last: true, AuxIndex: -1}).Err)
	var writes []*Effect
	eff := c.Effects()
	for i := range eff {
		if eff[i].Kind == EffectPost {
			writes = append(writes, &eff[i])
		}
	}
	require.Len(t, writes, 1, "want one post of two or more writes (KV, notification), got %+v", eff)
	require.GreaterOrEqual(t, len(writes[0].Writes), 2, "want one post of two or more writes (KV, notification), got %+v", eff)
	ws := writes[0].Writes
	for i := range ws {
		require.True(t, c.Step(at(5+i), Posting{Room: 1, Write: &ws[i]}).OK, "write %d not posted", i)
	}
	for i := range ws {
		c.Step(at(9), WriteDone{Room: 1, Write: &ws[i]})
	}
	st, _ := c.Status(1)
	require.Equal(t, Success, st, "room 1")
	_, entered, ok := c.RoomTimes(1)
	require.True(t, ok, "room 1 not live")
	got := map[Poll]time.Duration{}
	for st := Bootstrapping; st < Success; st++ {
		got[st] = entered[st+1].Sub(entered[st])
	}
	want := map[Poll]time.Duration{Bootstrapping: 2 * time.Second, WaitingForInput: 3 * time.Second, Transferring: 4 * time.Second}
	for k, v := range want {
		assert.Equal(t, v, got[k], "%v (all: %v)", k, got)
	}
}

// TestStepOutputNamesItsRoom: Step's Output carries what the shell used
// to read from the core around the step (issue 49, 1: no closures step
// the core): the input's room's status before it (Prior), whether the
// step took it to Success with its times (the latency and phase metrics),
// and whether a peer restarted.
func TestStepOutputNamesItsRoom(t *testing.T) {
	c := testCore(t, RolePrefill)
	register(t, c, decodeFrom)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	out := c.Step(at(0), CreateSender{Room: 1})
	assert.Zero(t, out.Prior, "CreateSender: %+v, want no prior status", out)
	assert.False(t, out.Succeeded, "CreateSender: %+v", out)
	assert.Equal(t, Bootstrapping, c.Step(at(1), InitSender{Room: 1}).Prior, "InitSender: prior")
	out = c.Step(at(2), Received{Msg: request(1, decodeFrom)})
	assert.True(t, out.OK, "REQUEST: %+v, want accepted with prior Bootstrapping", out)
	assert.Equal(t, Bootstrapping, out.Prior, "REQUEST: %+v, want accepted with prior Bootstrapping", out)
	c.Step(at(4), SendChunk{Room: 1, Pages: []uint32{0}, Last: true, AuxIndex: -1})
	var ws []kvlayout.Write
	for _, e := range c.Effects() {
		if e.Kind == EffectPost {
			ws = append(ws, e.Writes...)
		}
	}
	require.GreaterOrEqual(t, len(ws), 2, "want two or more writes")
	for i := range ws {
		out := c.Step(at(5+i), Posting{Room: 1, Write: &ws[i]})
		want := map[bool]Poll{true: WaitingForInput, false: Transferring}[i == 0]
		assert.Equal(t, want, out.Prior, "Posting write %d: prior (the first post is the room's first)", i)
	}
	for i := range ws {
		out := c.Step(at(9), WriteDone{Room: 1, Write: &ws[i]})
		last := i == len(ws)-1
		assert.Equal(t, last, out.Succeeded, "WriteDone %d of %d: Succeeded", i+1, len(ws))
		if last {
			assert.True(t, out.Started.Equal(at(0)), "the last WriteDone's times: started %v, entered %v", out.Started, out.Entered)
			assert.True(t, out.Entered[Success].Equal(at(9)), "the last WriteDone's times: started %v, entered %v", out.Started, out.Entered)
			assert.True(t, out.Entered[Transferring].Equal(at(5)), "the last WriteDone's times: started %v, entered %v", out.Started, out.Entered)
		}
	}
	out = c.Step(at(10), AbortSender{Room: 1, Reason: "late"})
	assert.Equal(t, Success, out.Prior, "AbortSender after success: %+v, want prior Success", out)
	assert.False(t, out.Succeeded, "AbortSender after success: %+v", out)
	// A message from the peer's next process: it restarted.
	again := decodeFrom
	again.Epoch++
	out = c.Step(at(11), Received{Msg: &wire.Abort{From: again, Room: 2, Reason: "x"}})
	assert.True(t, out.PeerRestarted, "a message of the peer's next epoch: %+v, want PeerRestarted and no prior room", out)
	assert.Zero(t, out.Prior, "a message of the peer's next epoch: %+v, want PeerRestarted and no prior room", out)
	assert.False(t, c.Step(at(12), Received{Msg: &wire.Abort{From: again, Room: 3, Reason: "x"}}).PeerRestarted, "a second message of the same epoch: PeerRestarted")
}
