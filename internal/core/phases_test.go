package core

import (
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/wire"
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
	if !c.Step(at(2), Received{Msg: request(1, decodeFrom)}).OK {
		t.Fatal("REQUEST refused")
	}
	if out := c.Step(at(4), SendChunk{Room: 1, Pages: []uint32{0}, Last: true, AuxIndex: -1}); out.Err != nil {
		t.Fatal(out.Err)
	}
	var writes []*Effect
	eff := c.Effects()
	for i := range eff {
		if eff[i].Kind == EffectPost {
			writes = append(writes, &eff[i])
		}
	}
	if len(writes) != 1 || len(writes[0].Writes) < 2 {
		t.Fatalf("want one post of two or more writes (KV, notification), got %+v", eff)
	}
	ws := writes[0].Writes
	for i := range ws {
		if !c.Step(at(5+i), Posting{Room: 1, Write: &ws[i]}).OK {
			t.Fatalf("write %d not posted", i)
		}
	}
	for i := range ws {
		c.Step(at(9), WriteDone{Room: 1, Write: &ws[i]})
	}
	if st, _ := c.Status(1); st != Success {
		t.Fatalf("room %v", st)
	}
	_, entered, ok := c.RoomTimes(1)
	if !ok {
		t.Fatal("room 1 not live")
	}
	got := map[Poll]time.Duration{}
	for st := Bootstrapping; st < Success; st++ {
		got[st] = entered[st+1].Sub(entered[st])
	}
	want := map[Poll]time.Duration{Bootstrapping: 2 * time.Second, WaitingForInput: 3 * time.Second, Transferring: 4 * time.Second}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%v: %v, want %v (all: %v)", k, got[k], v, got)
		}
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
	if out := c.Step(at(0), CreateSender{Room: 1}); out.Prior != 0 || out.Succeeded {
		t.Errorf("CreateSender: %+v, want no prior status", out)
	}
	if out := c.Step(at(1), InitSender{Room: 1}); out.Prior != Bootstrapping {
		t.Errorf("InitSender: prior %v, want Bootstrapping", out.Prior)
	}
	if out := c.Step(at(2), Received{Msg: request(1, decodeFrom)}); !out.OK || out.Prior != Bootstrapping {
		t.Errorf("REQUEST: %+v, want accepted with prior Bootstrapping", out)
	}
	c.Step(at(4), SendChunk{Room: 1, Pages: []uint32{0}, Last: true, AuxIndex: -1})
	var ws []kvlayout.Write
	for _, e := range c.Effects() {
		if e.Kind == EffectPost {
			ws = append(ws, e.Writes...)
		}
	}
	if len(ws) < 2 {
		t.Fatalf("want two or more writes, got %d", len(ws))
	}
	for i := range ws {
		out := c.Step(at(5+i), Posting{Room: 1, Write: &ws[i]})
		if want := map[bool]Poll{true: WaitingForInput, false: Transferring}[i == 0]; out.Prior != want {
			t.Errorf("Posting write %d: prior %v, want %v (the first post is the room's first)", i, out.Prior, want)
		}
	}
	for i := range ws {
		out := c.Step(at(9), WriteDone{Room: 1, Write: &ws[i]})
		last := i == len(ws)-1
		if out.Succeeded != last {
			t.Errorf("WriteDone %d of %d: Succeeded %v", i+1, len(ws), out.Succeeded)
		}
		if last && (!out.Started.Equal(at(0)) || !out.Entered[Success].Equal(at(9)) || !out.Entered[Transferring].Equal(at(5))) {
			t.Errorf("the last WriteDone's times: started %v, entered %v", out.Started, out.Entered)
		}
	}
	if out := c.Step(at(10), AbortSender{Room: 1, Reason: "late"}); out.Prior != Success || out.Succeeded {
		t.Errorf("AbortSender after success: %+v, want prior Success", out)
	}
	// A message from the peer's next process: it restarted.
	again := decodeFrom
	again.Epoch++
	if out := c.Step(at(11), Received{Msg: &wire.Abort{From: again, Room: 2, Reason: "x"}}); !out.PeerRestarted || out.Prior != 0 {
		t.Errorf("a message of the peer's next epoch: %+v, want PeerRestarted and no prior room", out)
	}
	if out := c.Step(at(12), Received{Msg: &wire.Abort{From: again, Room: 3, Reason: "x"}}); out.PeerRestarted {
		t.Errorf("a second message of the same epoch: PeerRestarted")
	}
}
