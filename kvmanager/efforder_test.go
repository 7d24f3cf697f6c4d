package kvmanager

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/transfer"
)

// TestEffOrder: tickets follow the order they are taken in; a ticket's
// turn comes once every earlier one is done; a barrier is closed once
// every ticket taken before it is done (at once when none is pending);
// buffers are reused, emptied, and at most maxFreeEffBufs are kept.
func TestEffOrder(t *testing.T) {
	var o effOrder
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	require.True(t, closed(o.barrier()), "a barrier with nothing pending")
	msg := &wire.Abort{Room: 7}
	t0, b0 := o.take([]core.Effect{{Kind: core.EffectSend, Msg: msg}})
	t1, b1 := o.take([]core.Effect{{Kind: core.EffectWake}, {Kind: core.EffectWake}})
	require.Equal(t, []uint64{0, 1}, []uint64{t0, t1}, "tickets in the order taken")
	require.Len(t, b1, 2)
	bar := o.barrier() // covers tickets 0 and 1
	require.False(t, closed(bar), "a barrier closed with tickets pending")
	o.wait(t0) // its turn: nothing before it
	turn1 := make(chan struct{})
	go func() { o.wait(t1); close(turn1) }()
	require.False(t, closed(turn1), "ticket 1's turn before ticket 0 is done")
	o.done(t0, b0)
	<-turn1
	require.Nil(t, b0[:1][0].Msg, "a done buffer keeps the step's messages")
	require.False(t, closed(bar), "the barrier closed with ticket 1 pending")
	t2, _ := o.take(nil)
	o.done(t1, b1)
	require.True(t, closed(bar), "the barrier not closed once the tickets before it were done")
	require.False(t, closed(o.barrier()), "a barrier taken with ticket 2 pending is closed")
	o.done(t2, nil)
	require.True(t, closed(o.barrier()))
	require.Empty(t, o.at, "channels kept after their turns")
	var tks []uint64 // many steps carrying out effects at once
	var bs [][]core.Effect
	for range 2 * maxFreeEffBufs {
		tk, b := o.take(make([]core.Effect, 1))
		tks, bs = append(tks, tk), append(bs, b)
	}
	for i, tk := range tks {
		o.done(tk, bs[i])
	}
	require.Len(t, o.free, maxFreeEffBufs, "buffers kept past the bound")
	var bufs [][]core.Effect
	for range 2 * maxFreeEffBufs {
		_, b := o.take(nil)
		bufs = append(bufs, b)
	}
	require.LessOrEqual(t, len(o.free), maxFreeEffBufs)
	reused := 0
	for _, b := range bufs {
		if cap(b) > 0 {
			reused++
		}
	}
	require.Positive(t, reused, "no buffer reused")
	require.LessOrEqual(t, reused, maxFreeEffBufs, "more buffers kept than the bound")
}

// TestStepsWaitForTheirTurnOffTheLock: a step whose effects wait for an
// earlier step's (held here while its effects are not carried out) waits
// without the core's lock: a read and a step without effects go on, and an
// application's chunk (a step whose effects are all posts) is posted and
// lands on the decode rank meanwhile. Before, the waiting step held the
// lock, and every read, step and Send of the rank waited behind a
// descheduled holder of the effects' turn (issue 52: REQUEST → first post
// p99 with a goroutine per room).
func TestStepsWaitForTheirTurnOffTheLock(t *testing.T) {
	srv := testauth.Server()
	require.NoError(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { srv.Close(context.Background()) })
	p := newTestPrefill(t, func(c *Config) { c.Instance, c.BootstrapURL = "turns", srv.URL() })
	cfg := DefaultConfig(RoleDecode)
	cfg.Auth, cfg.Instance, cfg.Compat, cfg.BootstrapURL = testauth.Auth(), "turns-decode", p.cfg.Compat, srv.URL()
	cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
	cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: 64, Regions: []nixl.Desc{{Len: 8 * 64}, {Len: 8 * 64}}}
	d, err := NewDecode(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// within fails the test if f does not return in 10 s (the bound of a
	// wait that must not happen, not a synchronisation).
	within := func(what string, f func()) {
		t.Helper()
		done := make(chan struct{})
		go func() { defer close(done); f() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s waited behind another step's turn", what)
		}
	}

	const room = 1
	require.NoError(t, d.CreateReceiverFor(room, "", AutoDP))
	require.NoError(t, p.CreateSender(room))
	require.NoError(t, p.InitSender(room))
	require.NoError(t, d.InitReceiver(ctx, room, RequestSpec{DstPages: []uint32{3}, AuxIndex: -1}))
	st, err := p.WaitReady(ctx, room)
	require.NoError(t, err)
	require.Equal(t, WaitingForInput, st)

	// Step A (an ABORT of an unknown room: its effect is an ABORT_ACK)
	// holds its turn; step B (the same for another room) waits for its.
	decode := wire.From{Role: wire.RoleDecode, Instance: "d", Endpoint: "tcp://127.0.0.1:1", Epoch: 1}
	abort := func(id uint64) {
		p.step(func(c *core.Core, now time.Time) {
			c.Step(now, core.Received{Msg: &wire.Abort{From: decode, Room: id, Reason: "turn test"}})
		})
	}
	held, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) }) // before the ranks close, also on failure
	var holdOnce sync.Once
	hold := func() { holdOnce.Do(func() { close(held); <-release }) }
	p.afterUnlock.Store(&hold)
	aDone, bDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(aDone); abort(100) }()
	<-held
	p.afterUnlock.Store(nil)
	parked := make(chan uint64, 1)
	park := func(v uint64) {
		select {
		case parked <- v:
		default:
		}
	}
	p.eff.parked.Store(&park)
	go func() { defer close(bDone); abort(101) }()
	within("step B's wait for its turn", func() { <-parked })
	p.eff.parked.Store(nil)

	within("a read", func() { p.Status(room) })
	within("a step without effects", func() { require.NoError(t, p.CreateSender(room+1)) })
	within("the application's Send", func() { require.NoError(t, p.SendChunk(room, []uint32{5}, true, -1, nil)) })
	within("the room's bytes landing", func() {
		st, err := d.Wait(ctx, room)
		require.NoError(t, err)
		require.Equal(t, Success, st, "decode: %s", d.Failure(room))
	})
	releaseOnce.Do(func() { close(release) })
	within("steps A and B", func() { <-aDone; <-bDone })
	st, err = p.Wait(ctx, room)
	require.NoError(t, err)
	require.Equal(t, Success, st, "prefill: %s", p.Failure(room))
	p.Clear(room)
	p.Clear(room + 1)
	d.Clear(room)
}
