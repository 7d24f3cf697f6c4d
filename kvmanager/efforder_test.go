package kvmanager

import (
	"context"
	_ "embed"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/rankhooks"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/transfer"
)

// TestEffOrder: tickets follow the order they are taken in; a ticket's
// effects (its ordered ones only) are carried out after every earlier
// one's, by one carrier at a time — the first to come, carrying the
// others' queued effects while their owners wait, at most carryMore past
// its own before it hands the queue to the next ticket's owner; a barrier
// is closed once every ticket taken before it is carried out (at once
// when none is pending); a carrier that panics inside an effect hands the
// queue on; buffers are emptied, reused, and at most maxFreeEffBufs are
// kept.
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
	within := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not within 10 s", what)
		}
	}
	send := func(room uint64) core.Effect {
		return core.Effect{Kind: core.EffectSend, Msg: &wire.Abort{Room: room}}
	}
	room := func(e core.Effect) uint64 { return e.Msg.(*wire.Abort).Room }
	require.True(t, closed(o.barrier()), "a barrier with nothing pending")

	// Two tickets carried by the first owner to carry: in order, the
	// posts left to their owners.
	t0 := o.take([]core.Effect{send(1), {Kind: core.EffectPost}})
	t1 := o.take([]core.Effect{send(2)})
	require.Equal(t, []uint64{0, 1}, []uint64{t0, t1}, "tickets in the order taken")
	bar := o.barrier()
	require.False(t, closed(bar), "a barrier closed with tickets pending")
	var got []uint64
	var seen [][]core.Effect
	o.carry(t0, func(es []core.Effect) {
		for _, e := range es {
			require.Equal(t, core.EffectSend, e.Kind, "an effect carried in the turn that is not ordered")
			got = append(got, room(e))
		}
		seen = append(seen, es)
	})
	require.Equal(t, []uint64{1, 2}, got, "ticket 1's effects carried by the carrier of ticket 0, after them")
	require.True(t, closed(bar), "the barrier not closed once the tickets before it were carried out")
	o.carry(t1, func([]core.Effect) { t.Fatal("ticket 1 carried twice") })
	for _, es := range seen {
		for _, e := range es {
			require.Nil(t, e.Msg, "a carried-out buffer keeps the step's messages")
		}
	}

	// carrying runs o.carry(tk, do) on a goroutine of its own, closing
	// the channel when it returns; parkedOn's channel is closed once tk's
	// owner waits for another carrier.
	carrying := func(tk uint64, do func([]core.Effect)) <-chan struct{} {
		done := make(chan struct{})
		go func() { defer close(done); o.carry(tk, do) }()
		return done
	}
	parkedOn := func(tk uint64) <-chan struct{} {
		parked := make(chan struct{})
		park := func(v uint64) {
			if v == tk {
				close(parked)
			}
		}
		o.parked.Store(&park)
		return parked
	}
	// holding's do stalls inside the effects for stall until release is
	// closed (a carrier descheduled), and counts the tickets it carries.
	holding := func(stall uint64, hold, release chan struct{}, carried *[]uint64) func([]core.Effect) {
		return func(es []core.Effect) {
			if room(es[0]) == stall {
				close(hold)
				<-release
			}
			*carried = append(*carried, room(es[0]))
		}
	}

	// One carrier at a time: while the first is inside an effect, the
	// next ticket's owner waits, and the carrier carries its effects.
	hold, release := make(chan struct{}), make(chan struct{})
	var byA []uint64
	aDone := carrying(o.take([]core.Effect{send(3)}), holding(3, hold, release, &byA))
	within("the first carrier", hold)
	tb := o.take([]core.Effect{send(4)})
	parked := parkedOn(tb)
	bDone := carrying(tb, func([]core.Effect) { t.Error("a second carrier while the first carries") })
	within("the second ticket's owner waiting", parked)
	o.parked.Store(nil)
	close(release)
	within("the first carrier", aDone)
	within("the second ticket's owner", bDone)
	require.Equal(t, []uint64{3, 4}, byA, "the first carrier carried the second ticket's effects")

	// A carrier carries at most carryMore tickets past its own, then the
	// earliest owner waiting carries on — here not the next ticket's, whose
	// owner has not come to carry yet.
	hold, release = make(chan struct{}), make(chan struct{})
	first := o.take([]core.Effect{send(100)})
	var rest []uint64
	for i := range carryMore + 5 {
		rest = append(rest, o.take([]core.Effect{send(101 + uint64(i))}))
	}
	next := rest[carryMore+2] // two past the carrier's bound: the owners of the two before it are not there
	var byM, byN []uint64
	mDone := carrying(first, holding(100, hold, release, &byM))
	within("the carrier", hold)
	parked = parkedOn(next)
	nDone := carrying(next, holding(0, nil, nil, &byN))
	within("the owner waiting", parked)
	o.parked.Store(nil)
	close(release)
	within("the carrier", mDone)
	within("the owner waiting, handed the queue", nDone)
	require.Len(t, byM, 1+carryMore, "tickets carried by one carrier")
	require.Len(t, byN, 5, "tickets carried by the owner it handed the queue to (from the first left)")
	require.True(t, closed(o.barrier()), "tickets left uncarried")
	require.Empty(t, o.done, "waiters' channels kept")
	require.Empty(t, o.at, "barriers' channels kept")

	// A carrier that panics inside an effect (recovered up its stack, as
	// net/http recovers a handler's) counts the ticket carried out and
	// hands the queue to the owner waiting: the rank's later steps do not
	// wait for ever on a carrier that is gone.
	hold, release = make(chan struct{}), make(chan struct{})
	tp := o.take([]core.Effect{send(200)})
	pDone, panicked := make(chan struct{}), make(chan any, 1)
	go func() {
		defer close(pDone)
		defer func() { panicked <- recover() }()
		o.carry(tp, func(es []core.Effect) {
			close(hold)
			<-release
			panic("an effect's bug")
		})
	}()
	within("the carrier", hold)
	tq := o.take([]core.Effect{send(201)})
	parked = parkedOn(tq)
	var byQ []uint64
	qDone := carrying(tq, holding(0, nil, nil, &byQ))
	within("the owner waiting", parked)
	o.parked.Store(nil)
	close(release)
	within("the carrier that panicked", pDone)
	require.Equal(t, "an effect's bug", <-panicked, "the panic went on up the carrier's stack")
	within("the owner waiting, handed the queue by the carrier that panicked", qDone)
	require.Equal(t, []uint64{201}, byQ, "the next ticket's effects")
	require.True(t, closed(o.barrier()), "the ticket whose effect panicked counted pending for ever")
	require.False(t, o.carrying, "the queue still carried by the carrier that panicked")

	// Buffers: at most maxFreeEffBufs kept, and reused.
	var last uint64
	for range 3 * maxFreeEffBufs {
		last = o.take([]core.Effect{send(1)})
	}
	o.carry(last, func([]core.Effect) {})
	require.Len(t, o.free, maxFreeEffBufs, "buffers kept past the bound")
	o.take([]core.Effect{send(1)})
	require.Len(t, o.free, maxFreeEffBufs-1, "a kept buffer not reused")
	big := make([]core.Effect, 2*maxKeptEffBuf)
	for i := range big {
		big[i] = send(1)
	}
	o.free = nil
	o.carry(o.take(big), func([]core.Effect) {})
	for _, b := range o.free {
		require.LessOrEqual(t, cap(b), maxKeptEffBuf, "a step's large buffer kept")
	}
}

// TestStepsWaitForTheirTurnOffTheLock: a step whose effects wait for an
// earlier step's (its carrier stalled inside a send, as a descheduled
// goroutine would be) waits without the core's lock: a read and a step
// without effects go on meanwhile. An application's chunk (a step whose
// effects are posts) waits for its turn too, off the lock, and is posted
// once the carrier goes on: a room's posts follow the effects of the
// steps before them. Before, the waiting step held the lock, and every
// read, step and Send of the rank waited behind the stalled carrier
// (issue 52: REQUEST → first post p99 with a goroutine per room).
func TestStepsWaitForTheirTurnOffTheLock(t *testing.T) {
	srv := testauth.Server()
	require.NoError(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { srv.Close(context.Background()) })
	var evMu sync.Mutex
	var events []string // ABORT_ACKs handed to the loop, and the Send's post handed to the pool, in order
	event := func(e string) {
		evMu.Lock()
		events = append(events, e)
		evMu.Unlock()
	}
	// No step of the ranks' own while the test steps them: no sweep, no
	// heartbeat within the test's minute.
	quiet := func(c *Config) { c.SweepInterval, c.HeartbeatInterval = time.Hour, time.Hour }
	p := newTestPrefill(t, quiet, func(c *Config) {
		c.Instance, c.BootstrapURL = "turns", srv.URL()
		c.hooks.Trace = func(room uint64, ev rankhooks.Event, _ time.Time) {
			if ev == rankhooks.Submitted {
				event(fmt.Sprintf("post %d", room))
			}
		}
	})
	cfg := DefaultConfig(RoleDecode)
	cfg.Auth, cfg.Instance, cfg.Compat, cfg.BootstrapURL = testauth.Auth(), "turns-decode", p.cfg.Compat, srv.URL()
	cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
	cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: 64, Regions: []nixl.Desc{{Len: 8 * 64}, {Len: 8 * 64}}}
	quiet(&cfg)
	d, err := NewDecode(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// within fails the test if ch is not closed (or sent on) in 10 s: the
	// bound of a wait that must not happen, not a synchronisation.
	within := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not within 10 s", what)
		}
	}
	async := func(f func()) <-chan struct{} {
		done := make(chan struct{})
		go func() { defer close(done); f() }()
		return done
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
	// carries its effects out and stalls in its send (a carrier
	// descheduled); step B (the same for another room) waits for A to
	// carry out its effects too.
	decode := wire.From{Role: wire.RoleDecode, Instance: "d", Endpoint: "tcp://127.0.0.1:1", Epoch: 1}
	abort := func(id uint64) {
		p.step(func(c *core.Core, now time.Time) {
			c.Step(now, core.Received{Msg: &wire.Abort{From: decode, Room: id, Reason: "turn test"}})
		})
	}
	held, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) }) // before the ranks close, also on failure
	onSend := func(msg wire.Message) {
		if a, ok := msg.(*wire.AbortAck); ok {
			event(fmt.Sprintf("ack %d", a.Room))
			if a.Room == 100 {
				close(held)
				<-release
			}
		}
	}
	p.onSend.Store(&onSend)
	aDone := async(func() { abort(100) })
	within("step A's send", held)
	// parkedAt signals once the owner of the rank's next ticket waits.
	parkedAt := func() <-chan struct{} {
		p.eff.mu.Lock()
		want := p.eff.next
		p.eff.mu.Unlock()
		parked := make(chan struct{})
		var once sync.Once
		park := func(v uint64) {
			if v == want {
				once.Do(func() { close(parked) })
			}
		}
		p.eff.parked.Store(&park)
		return parked
	}
	parked := parkedAt()
	bDone := async(func() { abort(101) })
	within("step B's wait for step A to carry its effects", parked)

	within("a read behind the stalled carrier", async(func() { p.Status(room) }))
	var created error
	within("a step without effects behind the stalled carrier", async(func() { created = p.CreateSender(room + 1) }))
	require.NoError(t, created)
	parked = parkedAt()
	var sent error
	sendDone := async(func() { sent = p.SendChunk(room, []uint32{5}, true, -1, nil) })
	within("the application's Send waiting for its turn", parked)
	p.eff.parked.Store(nil)
	releaseOnce.Do(func() { close(release) })
	within("step A", aDone)
	within("step B", bDone)
	within("the application's Send", sendDone)
	require.NoError(t, sent)
	var dst Poll
	within("the room's bytes landing", async(func() { dst, err = d.Wait(ctx, room) }))
	require.NoError(t, err)
	require.Equal(t, Success, dst, "decode: %s", d.Failure(room))
	p.onSend.Store(nil)
	evMu.Lock()
	require.Equal(t, []string{"ack 100", "ack 101", "post 1"}, events, "effects out of the steps' order")
	evMu.Unlock()
	st, err = p.Wait(ctx, room)
	require.NoError(t, err)
	require.Equal(t, Success, st, "prefill: %s", p.Failure(room))
	p.Clear(room)
	p.Clear(room + 1)
	d.Clear(room)
}

// shellSource is shell.go as built (embedded: an -overlay of the file,
// as scripts/srcmutants lays, is what the test reads).
//
//go:embed shell.go
var shellSource string

// TestEveryEffectKindCarried: every kind of effect the core has is
// carried out by exactly one carrier — carryOutOrdered in the step's turn
// for the kinds ordered says, carryOutPosts (or carryOut's reads) after it
// for the others — read from the shell's source. An ordered kind left to
// carryOutPosts is carried out of step order; one ordered says is in the
// turn but only carryOutPosts knows is dropped; a new kind of the core's
// with no case is carried by no one.
func TestEveryEffectKindCarried(t *testing.T) {
	fs := token.NewFileSet()
	f, err := parser.ParseFile(fs, "shell.go", shellSource, 0)
	require.NoError(t, err)
	cases := map[string]map[string]bool{}
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok {
			continue
		}
		name := fn.Name.Name
		ast.Inspect(fn, func(n ast.Node) bool {
			cc, ok := n.(*ast.CaseClause)
			if !ok {
				return true
			}
			for _, e := range cc.List {
				var sel *ast.SelectorExpr
				switch x := e.(type) {
				case *ast.SelectorExpr:
					sel = x
				case *ast.BinaryExpr: // carryOut's e.Kind == core.EffectRead
					sel, _ = x.Y.(*ast.SelectorExpr)
				}
				if sel != nil && strings.HasPrefix(sel.Sel.Name, "Effect") {
					if cases[name] == nil {
						cases[name] = map[string]bool{}
					}
					cases[name][sel.Sel.Name] = true
				}
			}
			return true
		})
	}
	kinds := 0
	for k := core.EffectKind(1); !strings.HasPrefix(k.String(), "EffectKind("); k++ {
		kinds++
		name := k.String()
		inTurn, after := cases["carryOutOrdered"][name], cases["carryOutPosts"][name] || cases["carryOut"][name]
		assert.True(t, inTurn != after, "%s: carried in the turn %v, after it %v: exactly one carrier", name, inTurn, after)
		assert.Equal(t, inTurn, ordered(k), "%s: ordered() says %v, carried in the turn %v", name, ordered(k), inTurn)
	}
	require.GreaterOrEqual(t, kinds, 15, "the core's effect kinds enumerated")
}
