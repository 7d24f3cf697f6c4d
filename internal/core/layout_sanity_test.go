package core

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/mem"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/stretchr/testify/require"
)

// Layout sanity (issue 23, part 5): memory a REGISTER or REQUEST names that
// cannot be right is refused before anything is loaded or written.

// stateLayout is simLayout with one state region of 8 items of 32 bytes.
func stateLayout() kvlayout.Layout {
	l := simLayout()
	l.State = []kvlayout.StateRegion{{Desc: mem.Desc{Addr: 0xa000, Len: 8 * 32}, ItemBytes: 32}}
	return l
}

// stateCore is a prefill core whose layout has stateLayout's state region,
// with decodeFrom registered with stateLayout.
func stateCore(t *testing.T) *Core {
	t.Helper()
	c := testCore(t, RolePrefill)
	c.cfg.Layout.State = stateLayout().State
	registerLayout(t, c, decodeFrom, stateLayout())
	return c
}

// refusal is the one STATUS failed among effects ("" when none, or more).
func refusal(effects []Effect) (code, reason string) {
	if st := sent[*wire.Status](effects); len(st) == 1 {
		return st[0].Code, st[0].Reason
	}
	return "", ""
}

func wantAll(t *testing.T, what, s string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		require.Contains(t, s, p, "%s does not name %q", what, p)
	}
}

// A REGISTER two of whose kv/aux/state regions share memory (same kind,
// same device for VRAM, intersecting ranges) is refused: REGISTER_ACK ok
// false naming both regions and the peer, counted, no registration kept.
// Regions that only touch, or lie in different address spaces, are fine.
func TestRegisterOverlapRefused(t *testing.T) {
	type edit func(r *wire.Register)
	vram := func(r *wire.Register, devs ...int) {
		for i := range r.KV {
			r.KV[i].Mem, r.KV[i].Dev = wire.MemVRAM, devs[i%len(devs)]
		}
	}
	refused := []struct {
		name string
		edit edit
		want func(r *wire.Register) []string
	}{
		{"the aux region inside a KV region", func(r *wire.Register) { r.Aux[0].Addr = r.KV[0].Addr + 64 },
			func(r *wire.Register) []string {
				return []string{fmt.Sprintf("kv[0] [%#x, %#x) in DRAM", r.KV[0].Addr, r.KV[0].Addr+r.KV[0].Len),
					fmt.Sprintf("aux[0] [%#x, %#x) in DRAM", r.Aux[0].Addr, r.Aux[0].Addr+r.Aux[0].Len)}
			}},
		{"two KV regions the same memory", func(r *wire.Register) { r.KV[1].Addr = r.KV[0].Addr },
			func(*wire.Register) []string { return []string{"kv[0] [", "kv[1] ["} }},
		{"a state region over the end of the aux region", func(r *wire.Register) { r.State[0].Addr = r.Aux[0].Addr + r.Aux[0].Len - 8 },
			func(*wire.Register) []string { return []string{"aux[0] [", "state[0] ["} }},
		{"KV regions overlapping in one GPU's memory", func(r *wire.Register) {
			vram(r, 1, 1)
			r.KV[1].Addr = r.KV[0].Addr + r.KV[0].Len - 64
		}, func(*wire.Register) []string { return []string{"kv[0] [", "kv[1] [", "in VRAM of device 1"} }},
	}
	accepted := []struct {
		name string
		edit edit
	}{
		{"KV regions at one address on two GPUs", func(r *wire.Register) { vram(r, 0, 1); r.KV[1].Addr = r.KV[0].Addr }},
		{"regions that only touch", func(r *wire.Register) {
			r.KV[1].Addr = r.KV[0].Addr + r.KV[0].Len
			last := r.KV[len(r.KV)-1]
			r.Aux[0].Addr = last.Addr + last.Len
		}},
		{"host memory at a GPU region's address", func(r *wire.Register) { vram(r, 0, 0); r.Aux[0].Addr = r.KV[0].Addr }},
		{"an empty region inside another", func(r *wire.Register) {
			r.Aux = append(r.Aux, wire.Region{Addr: r.KV[0].Addr, ItemLen: 16, Mem: wire.MemDRAM})
		}},
	}
	fixedAndMutant(t, "overlap-accepted", func(t *testing.T, fixed bool) {
		msg := func(e edit) *wire.Register {
			kv, aux, state := RegionsOf(stateLayout())
			r := &wire.Register{From: decodeFrom, Compat: "sim", KV: kv, Aux: aux, State: state}
			e(r)
			return r
		}
		for _, tc := range accepted {
			c := testCore(t, RolePrefill)
			c.cfg.Layout.State = stateLayout().State
			_, err := c.CheckRegister(msg(tc.edit))
			require.NoError(t, err, "%s: refused", tc.name)
		}
		for n, tc := range refused {
			c := testCore(t, RolePrefill)
			c.cfg.Layout.State = stateLayout().State
			r := msg(tc.edit)
			_, err := c.CheckRegister(r)
			require.Equal(t, fixed, err != nil, "%s: CheckRegister: %v", tc.name, err)
			if !fixed {
				continue
			}
			wantAll(t, tc.name+": reason", err.Error(), append(tc.want(r), "overlapping regions", decodeFrom.Peer())...)
			require.Equal(t, [LayoutRefusals]uint64{RefusedOverlap: 1}, c.Stats().LayoutRefused, "%s: counted", tc.name)
			c.Step(t0, RegisterRefused{From: r.From, Reason: err.Error()})
			acks := sent[*wire.RegisterAck](c.Effects())
			require.Len(t, acks, 1, "%s: REGISTER_ACKs %+v", tc.name, acks)
			require.False(t, acks[0].OK, "%s: REGISTER_ACKs %+v", tc.name, acks)
			require.Equal(t, err.Error(), acks[0].Reason, "%s: REGISTER_ACKs %+v", tc.name, acks)
			s := c.Sizes()
			require.Zero(t, s.Peers, "%s: a registration was kept: %+v", tc.name, s)
			c.Step(t0, Received{Msg: request(uint64(n+1), decodeFrom)})
			code, _ := refusal(c.Effects())
			require.Equal(t, CodeNotRegistered, code, "%s: a REQUEST after the refusal", tc.name)
		}
	})
}

// A REQUEST naming a destination page twice, or an item of one state
// region twice, is refused with STATUS failed (rejected) naming the room,
// the page and the peer; the room never gets it, so nothing can be
// written, and nothing of it is kept. A dummy REQUEST carries the room's
// pages for the other prefill ranks: it is held to the same rule.
func TestRequestRepeatRefused(t *testing.T) {
	fixedAndMutant(t, "repeat-accepted", func(t *testing.T, fixed bool) {
		c := stateCore(t)
		for _, tc := range []struct {
			room uint64
			name string
			req  func(r *wire.Request)
			want []string
		}{
			{1, "dst_pages", func(r *wire.Request) { r.DstPages = []uint32{3, 5, 3} },
				[]string{"room 1:", "dst_pages[0] and dst_pages[2]", "page 3"}},
			{2, "one state region's items", func(r *wire.Request) { r.DstPages, r.StateIndices = []uint32{6}, [][]uint32{{1, 2, 2}} },
				[]string{"room 2:", "state_indices[0][1] and [0][2]", "item 2"}},
			{3, "a dummy's dst_pages", func(r *wire.Request) { r.DstPages, r.Dummy = []uint32{4, 4}, true },
				[]string{"room 3:", "dst_pages[0] and dst_pages[1]", "page 4"}},
		} {
			room := tc.room
			c.Step(t0, CreateSender{Room: room})
			c.Step(t0, InitSender{Room: room})
			r := request(room, decodeFrom)
			tc.req(r)
			c.Effects()
			accepted := c.Step(t0, Received{Msg: r}).OK
			code, reason := refusal(c.Effects())
			require.Equal(t, !fixed, accepted, "%s: accepted %v (STATUS %s %q)", tc.name, accepted, code, reason)
			if !fixed {
				continue
			}
			require.Equal(t, CodeRejected, code, "%s: STATUS code", tc.name)
			wantAll(t, tc.name+": reason", reason, append(tc.want, decodeFrom.Peer())...)
			st, _ := c.Status(room)
			require.Equal(t, Bootstrapping, st, "%s: room %d got the REQUEST", tc.name, room)
		}
		if !fixed {
			return
		}
		require.Equal(t, [LayoutRefusals]uint64{RefusedRepeat: 3}, c.Stats().LayoutRefused, "counted")
		s := c.Sizes()
		require.Zero(t, s.InUse, "refused REQUESTs left %+v", s)
		require.Zero(t, s.Pending, "refused REQUESTs left %+v", s)
		// Nothing of the refused REQUEST stays: the right one is taken.
		r := request(1, decodeFrom)
		r.DstPages = []uint32{3, 5}
		if !c.Step(t0, Received{Msg: r}).OK {
			require.Fail(t, "the corrected REQUEST was refused", "%v", sent[*wire.Status](c.Effects()))
		}
		st, _ := c.Status(1)
		require.Equal(t, WaitingForInput, st, "room 1 after its REQUEST")
	})
}

// A REQUEST naming a page, the aux item or a state item that another room
// of the same decode process holds (from that room's acceptance, pending
// included) is refused the same way, naming both rooms, the page and the
// peer. Another decode process's memory is its own; a dummy REQUEST writes
// nothing; the same room's REQUEST again is the registry's duplicate.
func TestRequestPageInUseRefused(t *testing.T) {
	fixedAndMutant(t, "in-use-accepted", func(t *testing.T, fixed bool) {
		c := stateCore(t)
		other := otherDecode
		registerLayout(t, c, other, stateLayout())
		holder := request(1, decodeFrom)
		holder.DstPages, holder.AuxIndex, holder.StateIndices, holder.Prefix = []uint32{2, 3}, 1, [][]uint32{{4}}, 2
		require.True(t, c.Step(t0, Received{Msg: holder}).OK, "the first REQUEST was refused") // pending: no sender yet
		require.Equal(t, 4, c.Sizes().InUse, "room 1 holds destinations, want its 2 pages, aux item and state item")
		c.Effects()
		for _, tc := range []struct {
			room       uint64
			pages      []uint32
			aux        int
			state      [][]uint32
			dest, from string
		}{
			{2, []uint32{4, 3}, -1, nil, "page 3", "dst_pages[1]"},
			{3, []uint32{5}, 1, nil, "aux item 1", "aux_index"},
			{4, []uint32{6}, 0, [][]uint32{{5, 4}}, "item 4 of state region 0", "state_indices[0][1]"},
		} {
			r := request(tc.room, decodeFrom)
			r.DstPages, r.AuxIndex = tc.pages, tc.aux
			if tc.state != nil {
				r.StateIndices = tc.state
			}
			accepted := c.Step(t0, Received{Msg: r}).OK
			code, reason := refusal(c.Effects())
			require.Equal(t, !fixed, accepted, "room %d: accepted %v (STATUS %s %q)", tc.room, accepted, code, reason)
			if fixed {
				require.Equal(t, CodeRejected, code, "room %d: STATUS code", tc.room)
				wantAll(t, "reason", reason, fmt.Sprintf("room %d:", tc.room), tc.dest, tc.from, "in use by room 1 of "+decodeFrom.Peer())
			}
		}
		if !fixed {
			return
		}
		require.Equal(t, [LayoutRefusals]uint64{RefusedInUse: 3}, c.Stats().LayoutRefused, "counted")
		// Not over-strict: the pages before the prefix (decode holds them,
		// nothing writes them), another process's memory, a dummy.
		for _, r := range []*wire.Request{
			{From: decodeFrom, Room: 5, DstPages: []uint32{0, 1}, AuxIndex: -1, Required: 1, StateIndices: [][]uint32{}},
			{From: other, Room: 6, DstPages: []uint32{2, 3}, AuxIndex: 1, Required: 1, StateIndices: [][]uint32{{4}}},
			{From: decodeFrom, Room: 7, DstPages: []uint32{2, 3}, AuxIndex: 1, Required: 1, StateIndices: [][]uint32{{4}}, Dummy: true},
		} {
			if !c.Step(t0, Received{Msg: r}).OK {
				require.Fail(t, "a REQUEST refused", "room %d refused: %v", r.Room, sent[*wire.Status](c.Effects()))
			}
		}
		c.Effects()
		require.False(t, c.Step(t0, Received{Msg: holder}).OK, "room 1's REQUEST accepted twice")
		_, reason := refusal(c.Effects())
		require.Contains(t, reason, ErrDuplicateRequest.Error(), "room 1's REQUEST again: want the registry's duplicate refusal")
	})
}

// A page is held while its room is live: pending or not terminal, its
// write in flight. Once the room has ended — failed, cleared, its write
// failed unquiesced — the page is free for the decode process's next room
// although that write may still land: the decode rank failed the room and
// reuses its pages once its quarantine expires, as the protocol allows
// (the chaos soak's paused prefill rank refused hundreds of correct
// REQUESTs under the stricter hold, mutant dead-holder-blocks). At success,
// or when a pending REQUEST is dropped, the page is free too. The holds
// are the registration's: a restarted decode process starts free, and a
// write of the old process does not free the new one's page.
func TestPagesHeldWhileTheRoomIsLive(t *testing.T) {
	// again asks for page 1 (room 1's, prefillChunkQueued) for room.
	again := func(c *Core, from wire.From, room uint64) bool {
		r := request(room, from)
		r.DstPages = []uint32{1}
		ok := c.Step(t0, Received{Msg: r}).OK
		c.Effects()
		return ok
	}
	fixedAndMutant(t, "dead-holder-blocks", func(t *testing.T, fixed bool) {
		for _, tc := range []struct {
			name string
			end  func(c *Core, w *kvlayout.Write) // room 1's end while its write is in flight
		}{
			{"failed", func(c *Core, _ *kvlayout.Write) { c.Step(t0, AbortSender{Room: 1, Reason: "app"}) }},
			{"cleared", func(c *Core, _ *kvlayout.Write) { c.Step(t0, ClearSender{Room: 1}) }},
			{"failed write, not quiesced", func(c *Core, w *kvlayout.Write) {
				c.Step(t0, WriteDone{Room: 1, Write: w, Err: errors.New("nic reset"), Quiesced: false})
			}},
			{"failed write, not quiesced, cleared", func(c *Core, w *kvlayout.Write) {
				c.Step(t0, WriteDone{Room: 1, Write: w, Err: errors.New("nic reset"), Quiesced: false})
				c.Step(t0, ClearSender{Room: 1})
			}},
		} {
			c, writes := prefillChunkQueued(t)
			require.True(t, c.Step(t0, Posting{Room: 1, Write: &writes[0]}).OK, "%s: the write was not posted", tc.name)
			require.False(t, again(c, decodeFrom, 2), "%s: room 2 took live room 1's page", tc.name)
			tc.end(c, &writes[0])
			c.Effects()
			require.Equal(t, fixed, again(c, decodeFrom, 3), "%s: room 3 naming ended room 1's page accepted (fixed core: %v)", tc.name, fixed)
		}
		if !fixed {
			return
		}
		// Success frees the pages at once.
		c, writes := prefillChunkQueued(t)
		require.NoError(t, c.Step(t0, SendChunk{Room: 1, Pages: nil, Last: true, AuxIndex: -1}).Err)
		for _, e := range c.Effects() {
			writes = append(writes, e.Writes...)
		}
		for i := range writes {
			c.Step(t0, Posting{Room: 1, Write: &writes[i]})
		}
		for i := range writes {
			c.Step(t0, WriteDone{Room: 1, Write: &writes[i], Err: nil, Quiesced: false})
		}
		st, _ := c.Status(1)
		require.Equal(t, Success, st, "room 1: its page not free")
		require.True(t, again(c, decodeFrom, 2), "room 1 %v: its page not free", st)
		// A pending REQUEST dropped by an ABORT frees its page.
		c = testCore(t, RolePrefill)
		register(t, c, decodeFrom)
		again(c, decodeFrom, 1)
		c.Step(t0, Received{Msg: &wire.Abort{From: decodeFrom, Room: 1, Reason: "app"}})
		require.True(t, again(c, decodeFrom, 2), "an aborted pending REQUEST kept its page")
		// A REGISTER again from the same process keeps its rooms' pages.
		c, writes = prefillChunkQueued(t)
		c.Step(t0, Posting{Room: 1, Write: &writes[0]})
		register(t, c, decodeFrom)
		require.False(t, again(c, decodeFrom, 2), "a repeated REGISTER freed the pages of its process's rooms")
		// A restarted process's memory is new: its page 1 is free although
		// the old process's room still has a write in flight; that write's
		// completion does not free the new process's page.
		restarted := decodeFrom
		restarted.Epoch = 2
		register(t, c, restarted)
		require.True(t, again(c, restarted, 3), "the restarted process's page held by its old process's room")
		c.Step(t0, WriteDone{Room: 1, Write: &writes[0], Err: nil, Quiesced: false})
		c.Effects()
		require.False(t, again(c, restarted, 4), "the old process's write completion freed the new process's page")
	})
}

// settleLog counts the requests the registry settled, by room.
type settleLog map[uint64]int

func (l settleLog) settled(room uint64, reqs []PeerRequest) { l[room] += len(reqs) }

// Every accepted request settles exactly once, and only when its room can
// no longer write: on every path out of the pending table and the room
// table, through a cleared room's tombstone while its writes may land, and
// at the tombstone's TTL for a write that never completes.
func TestRequestsSettleOnce(t *testing.T) {
	cfg := testConfig(nil)
	r, err := NewRegistry(cfg, nil)
	require.NoError(t, err)
	log := settleLog{}
	r.settler = log
	at := func(d time.Duration) time.Time { now := t0.Add(d); r.SetNow(now); return now }
	at(0)
	live := func(id uint64) {
		r.Create(id, RolePrefill)
		r.Init(id)
		require.Equal(t, Applied, r.Request(id, peer("d", 1)).Outcome, "room %d: request", id)
	}
	posted := func(id uint64) {
		live(id)
		require.Equal(t, Applied, r.Posted(id).Outcome, "room %d: posted", id)
	}
	check := func(when string, want map[uint64]int) {
		t.Helper()
		for id := uint64(1); id <= 12; id++ {
			require.Equal(t, want[id], log[id], "%s: room %d settled %d times, want %d (all: %v)", when, id, log[id], want[id], log)
		}
	}
	fail := errors.New("nic reset")
	for id := uint64(1); id <= 4; id++ {
		r.Request(id, peer("d", 1)) // pending
	}
	r.Abort(1, "app", nil)
	r.Clear(2)
	r.Create(4, RoleDecode) // requests are refused to a decode room
	live(5)
	r.Posted(5)
	live(6)
	r.Update(6, Failed, "app")
	posted(7)
	r.Abort(7, "app", nil)
	posted(8)
	r.WriteDone(8, false, fail, false) // failed, may still land
	live(9)
	r.Clear(9)
	posted(10)
	r.Clear(10)
	posted(11)
	r.WriteDone(11, false, fail, false)
	r.Clear(11)
	posted(12)
	r.Clear(12) // its write never completes
	check("after the first events", map[uint64]int{1: 1, 2: 1, 4: 1, 6: 1, 9: 1})
	r.WriteDone(5, true, nil, false) // success
	r.WriteDone(7, false, nil, false)
	r.WriteDone(10, false, nil, false)
	check("after the writes completed", map[uint64]int{1: 1, 2: 1, 4: 1, 5: 1, 6: 1, 7: 1, 9: 1, 10: 1})
	r.Sweep(at(cfg.StallTimeout + time.Second))
	check("past the drain deadline", map[uint64]int{1: 1, 2: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1, 9: 1, 10: 1, 11: 1})
	r.Sweep(at(cfg.PendingTimeout + time.Second))
	check("past the pending deadline", map[uint64]int{1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1, 9: 1, 10: 1, 11: 1})
	for id := uint64(1); id <= 11; id++ { // late events settle nothing again
		r.WriteDone(id, true, nil, false)
		r.Abort(id, "late", nil)
		r.Clear(id)
	}
	check("after late events", map[uint64]int{1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1, 9: 1, 10: 1, 11: 1})
	r.Sweep(at(cfg.TombstoneTTL + time.Minute)) // room 12's tombstone is forgotten: nothing counts its write
	check("past the tombstone TTL", map[uint64]int{1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1, 9: 1, 10: 1, 11: 1, 12: 1})
}

// A decode rank may reuse a room's pages as soon as it saw the room
// succeed, which can be before this rank hears the final write complete:
// each decode rank's destinations are free once its final write of the
// room (its aux write) passed the gate, while the other ranks' stay held
// until theirs did; the room's end later frees nothing that another room
// holds by then.
func TestPagesFreeOnceTheirFinalWriteIsPosted(t *testing.T) {
	fixedAndMutant(t, "held-past-final-post", func(t *testing.T, fixed bool) {
		c, other := twoDecodePeers(t)
		ask := func(from wire.From, room uint64, required int) bool {
			r := request(room, from)
			r.DstPages, r.Required = []uint32{1}, required
			ok := c.Step(t0, Received{Msg: r}).OK
			c.Effects()
			return ok
		}
		c.Step(t0, CreateSender{Room: 1})
		c.Step(t0, InitSender{Room: 1})
		require.True(t, ask(decodeFrom, 1, 2), "room 1's REQUESTs refused")
		require.True(t, ask(other, 1, 2), "room 1's REQUESTs refused")
		require.NoError(t, c.Step(t0, SendChunk{Room: 1, Pages: []uint32{0}, Last: true, AuxIndex: -1}).Err)
		var writes []kvlayout.Write
		for _, e := range c.Effects() {
			writes = append(writes, e.Writes...)
		}
		require.Len(t, writes, 4, "writes %+v, want a page and an aux write to each decode rank", writes)
		require.Equal(t, decodeFrom.Peer(), writes[1].PeerKey, "writes %+v, want a page and an aux write to each decode rank", writes)
		require.True(t, strings.HasSuffix(writes[1].Notif, ":aux"), "writes %+v, want a page and an aux write to each decode rank", writes)
		for i := range writes[:2] {
			c.Step(t0, Posting{Room: 1, Write: &writes[i]})
		}
		require.Equal(t, fixed, ask(decodeFrom, 2, 1), "%s's page after its final write was posted: taken", decodeFrom.Peer())
		if !fixed {
			return
		}
		require.False(t, ask(other, 3, 1), "%s's page taken before its final write was posted", other.Peer())
		for i := range writes[2:] {
			c.Step(t0, Posting{Room: 1, Write: &writes[2+i]})
		}
		require.True(t, ask(other, 4, 1), "%s's page held after its final write was posted", other.Peer())
		for i := range writes {
			c.Step(t0, WriteDone{Room: 1, Write: &writes[i], Err: nil, Quiesced: false})
		}
		st, _ := c.Status(1)
		require.Equal(t, Success, st, "room 1")
		require.False(t, ask(decodeFrom, 5, 1), "room 1's end freed pages rooms 2 and 4 hold")
		require.False(t, ask(other, 6, 1), "room 1's end freed pages rooms 2 and 4 hold")
	})
}
