package core

import (
	"testing"
	"time"
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
