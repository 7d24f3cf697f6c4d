package core

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/stretchr/testify/require"
)

// lifecycleEvents is the number of registry events one lifecycle applies.
const lifecycleEvents = 6

// lifecycle runs one prefill room through its whole life: create, a decode
// request, init, a chunk posted and completed, clear (6 events).
// It returns the status the last write left.
func lifecycle(r *testReg, id uint64) Poll {
	r.Create(id, RolePrefill)
	r.Request(id, PeerRequest{Peer: "decode-0", Required: 1})
	r.Init(id)
	r.Posted(id)
	st := r.WriteDone(id, true, nil).Status
	r.Clear(id)
	return st
}

func benchRegistry(b *testing.B) (*testReg, *fakeClock) {
	clk := newFakeClock()
	r, err := newTestReg(DefaultRegistryConfig(), clk)
	require.NoError(b, err)
	return r, clk
}

// sweepEvery bounds the tombstones a benchmark accumulates, as the
// Manager's periodic sweep does.
const sweepEvery = 1 << 14

// BenchmarkLifecycle: one goroutine, one room after another.
func BenchmarkLifecycle(b *testing.B) {
	r, clk := benchRegistry(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if st := lifecycle(r, uint64(i)); st != Success {
			b.Fatalf("room %d ended %v", i, st)
		}
		if i%sweepEvery == sweepEvery-1 {
			r.Sweep(clk.Advance(11 * time.Minute))
		}
	}
	b.ReportMetric(float64(b.N*lifecycleEvents)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkLifecycleParallel: GOMAXPROCS goroutines over distinct rooms
// sharing one registry. The 11-minute clock jumps that expire tombstones
// also fail the few rooms mid-lifecycle at that moment; that is fine here.
func BenchmarkLifecycleParallel(b *testing.B) {
	r, clk := benchRegistry(b)
	var next atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := next.Add(1)
			lifecycle(r, id)
			if id%sweepEvery == 0 {
				r.Sweep(clk.Advance(11 * time.Minute))
			}
		}
	})
	b.ReportMetric(float64(b.N*lifecycleEvents)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkSweep: one sweep over 10,000 live rooms, none due.
func BenchmarkSweep(b *testing.B) {
	r, clk := benchRegistry(b)
	for id := uint64(0); id < 10_000; id++ {
		r.Create(id, RolePrefill)
	}
	now := clk.Now()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r.Sweep(now)
	}
}

// BenchmarkCoreRoom: one room's whole protocol through a prefill core and a
// decode core, messages handed across directly (no sockets): create on
// both sides, REQUEST, one chunk (a data write and the aux write, both
// completing), both notifications, Success on both sides, Clear on both.
// The decode rank is registered once, before the loop.
func BenchmarkCoreRoom(b *testing.B) {
	p := newTestCore(b, RolePrefill, DefaultRegistryConfig())
	d := newTestCore(b, RoleDecode, DefaultRegistryConfig())
	now := time.Unix(1_000_000, 0)
	deliver := func(dst *Core, from wire.From, effects []Effect) {
		for _, e := range effects {
			if e.Kind != EffectSend {
				continue
			}
			switch m := e.Msg.(type) {
			case *wire.Register:
				cp := *m
				cp.From = from
				lay, _ := dst.CheckRegister(&cp)
				echoChallenge(b, dst, &cp, now)
				dst.Step(now, Registered{From: from, Remote: cp.Agent, Plan: lay})
			case *wire.RegisterAck:
				cp := *m
				cp.From = from
				dst.Step(now, Received{Msg: &cp})
			case *wire.Request:
				cp := *m
				cp.From = from
				dst.Step(now, Received{Msg: &cp})
			}
		}
	}
	d.Step(now, CreateReceiver{Room: 0, Targets: []Target{prefillT}})
	d.Step(now, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
	d.Step(now, InitReceiver{Room: 0, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: 1}})
	deliver(p, decodeFrom, d.Effects())
	deliver(d, prefillFrom, p.Effects())
	d.Effects()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		room := uint64(i)
		d.Step(now, CreateReceiver{Room: room, Targets: []Target{prefillT}})
		d.Step(now, InitReceiver{Room: room, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: 1}})
		p.Step(now, CreateSender{Room: room})
		p.Step(now, InitSender{Room: room})
		deliver(p, decodeFrom, d.Effects())
		p.Effects()
		if err := p.Step(now, SendChunk{Room: room, Pages: []uint32{0}, Last: true, AuxIndex: 0}).Err; err != nil {
			b.Fatal(err)
		}
		var writes []kvlayout.Write
		for _, e := range p.Effects() {
			writes = append(writes, e.Writes...)
		}
		for j := range writes {
			if !p.Step(now, Posting{Room: room, Write: &writes[j]}).OK {
				b.Fatal("gate refused")
			}
			p.Step(now, WriteDone{Room: room, Write: &writes[j], Err: nil, Quiesced: false})
		}
		d.Step(now, Notified{Room: room, UID: 0, Chunk: 0, Total: 1, Aux: false})
		d.Step(now, Notified{Room: room, UID: 0, Chunk: 0, Total: 0, Aux: true})
		if st, _ := d.Status(room); st != Success {
			b.Fatalf("decode room %v", st)
		}
		if st, _ := p.Status(room); st != Success {
			b.Fatalf("prefill room %v", st)
		}
		p.Step(now, ClearSender{Room: room})
		d.Step(now, ClearReceiver{Room: room})
		p.Effects()
		d.Effects()
		if i%sweepEvery == 0 {
			now = now.Add(11 * time.Minute)
			p.Step(now, Tick{})
			d.Step(now, Tick{})
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rooms/s")
}
