package kvmanager

import (
	"sync/atomic"
	"testing"
	"time"
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
	if err != nil {
		b.Fatal(err)
	}
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
