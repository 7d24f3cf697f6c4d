package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/rankhooks"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/sender"
)

// BenchmarkControlRooms: rooms per second at zero payload, and the control
// path's CPU per room, with 1, 100 and 10,000 rooms in flight (issue 24
// part 3). A prefill and a decode Manager in this process talk over real
// ZeroMQ sockets on loopback, authenticated (the default); the engine is
// loopback, so what a room costs is the protocol's: the decode rank's
// REQUEST (dummy: no pages, no aux), the prefill rank's chunk with no data
// (its writes carry only the notifications), both cores' steps to Success,
// and the handles' calls. REGISTER and its ACK happen once, in the warm-up
// (amortised over every room). CPU is the whole process's (user + system,
// both ranks, the bootstrap server, the benchmark's goroutines).
//
// Each run moves max(b.N, 3 × in flight) rooms, so that the in-flight
// level is reached and held; read rooms/s and cpu-µs/room, not ns/op.
// "poll" drives the rooms as an engine's scheduler does (one goroutine,
// PollRooms); "goroutines" parks a goroutine per room in WaitReady and
// Wait, whose stacks every GC cycle scans.
func BenchmarkControlRooms(b *testing.B) {
	for _, drive := range []string{"poll", "goroutines"} {
		for _, inflight := range []int{1, 100, 10000} {
			b.Run(fmt.Sprintf("%s/inflight-%d", drive, inflight), func(b *testing.B) {
				c := newBenchCluster(b, 1, 64, 1024, func(cfg *kvmanager.Config) {
					cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
					cfg.WarmMemory = false
					rankhooks.Set(cfg, rankhooks.Hooks{}) // no trace: the cluster's trace map would grow with every room
					cfg.Registry.MaxPendingPerPeer = 1 << 16
				})
				ctx := context.Background()
				c.zeroRoom(b, ctx, 1) // REGISTER, REGISTER_ACK, sockets, engine connection
				n := max(b.N, 3*inflight)
				sent0 := controlStats(c.prefill.Manager).Sent + controlStats(c.decode.Manager).Sent
				m := cpuMeter(b)
				start := time.Now()
				b.ResetTimer()
				if drive == "poll" {
					c.pollRooms(b, n, inflight, 0)
				} else {
					sem := make(chan struct{}, inflight)
					var wg sync.WaitGroup
					for i := 0; i < n; i++ {
						sem <- struct{}{}
						wg.Add(1)
						go func(id uint64) {
							defer wg.Done()
							defer func() { <-sem }()
							c.zeroRoom(b, ctx, id)
						}(uint64(100 + i))
					}
					wg.Wait()
				}
				el := time.Since(start)
				b.StopTimer()
				cpu := cpuOf(b, m)
				sent := controlStats(c.prefill.Manager).Sent + controlStats(c.decode.Manager).Sent - sent0
				b.ReportMetric(float64(n)/el.Seconds(), "rooms/s")
				b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-µs/room")
				b.ReportMetric(float64(sent)/float64(n), "ctl-msgs/room")
			})
		}
	}
}

// pollRooms runs n rooms, inflight at a time, as an engine's scheduler
// does: one goroutine admits rooms (with pages > 0, while both sides have
// that many pages free; with 0, dummy rooms), polls every room in flight
// on both ranks with one PollRooms each per iteration, sends a room's
// chunk once its prefill side is ready, and clears (and frees) rooms that
// succeeded on both sides. No goroutine per room; an iteration that found
// nothing to do sleeps 50 µs (an engine's iteration is longer).
func (c *benchCluster) pollRooms(b *testing.B, n, inflight, pages int) {
	type slot struct {
		r        *receiver.Receiver
		s        *sender.Sender
		src, dst []uint32
		aux      int
		sent     bool
	}
	live := make([]slot, 0, inflight)
	ids := make([]uint64, 0, inflight)
	dst := make([]kvmanager.Poll, inflight)
	src := make([]kvmanager.Poll, inflight)
	for next, done := 0, 0; done < n; {
		for len(live) < inflight && next < n {
			id := uint64(100 + next)
			sl := slot{aux: -1}
			spec := kvmanager.RequestSpec{AuxIndex: -1, Dummy: true}
			if pages > 0 {
				if sl.src = c.pFree.Get(pages); sl.src == nil {
					break
				}
				if sl.dst = c.dFree.Get(pages); sl.dst == nil {
					c.pFree.Put(sl.src)
					break
				}
				sl.aux = int(id % 4096)
				spec = kvmanager.RequestSpec{DstPages: sl.dst, AuxIndex: sl.aux}
			}
			next++
			var err error
			if sl.r, err = receiver.New(c.decode, id); err != nil {
				b.Fatal(err)
			}
			if sl.s, err = sender.New(c.prefill, id); err != nil {
				b.Fatal(err)
			}
			if err := sl.s.Init(); err != nil {
				b.Fatal(err)
			}
			if c.early && pages > 0 {
				if err := sl.s.Send(sl.src, true, sl.aux); err != nil {
					b.Fatal(err)
				}
				sl.sent = true
			}
			if err := sl.r.Init(context.Background(), spec); err != nil {
				b.Fatal(err)
			}
			live = append(live, sl)
			ids = append(ids, id)
		}
		c.decode.PollRooms(ids, dst)
		c.prefill.PollRooms(ids, src)
		progressed, keep := false, 0
		for i, sl := range live {
			switch {
			case dst[i] == kvmanager.Failed || src[i] == kvmanager.Failed:
				b.Fatalf("room %d: decode %v %s, prefill %v %s", ids[i], dst[i], sl.r.Failure(), src[i], sl.s.Failure())
			case !sl.sent && src[i] == kvmanager.WaitingForInput:
				c.mark(ids[i], appReady)
				if err := sl.s.Send(sl.src, true, sl.aux); err != nil {
					b.Fatal(err)
				}
				sl.sent, progressed = true, true
			case dst[i] == kvmanager.Success && src[i] == kvmanager.Success:
				sl.r.Clear()
				sl.s.Clear()
				if pages > 0 {
					c.pFree.Put(sl.src)
					c.dFree.Put(sl.dst)
				}
				done++
				progressed = true
				continue
			}
			live[keep], ids[keep] = sl, ids[i]
			keep++
		}
		clear(live[keep:])
		live, ids = live[:keep], ids[:keep]
		if !progressed {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// zeroRoom runs one dummy room through both ranks to Success and clears it.
func (c *benchCluster) zeroRoom(b *testing.B, ctx context.Context, id uint64) {
	r, err := receiver.New(c.decode, id)
	if err != nil {
		b.Error(err)
		return
	}
	defer r.Clear()
	s, err := sender.New(c.prefill, id)
	if err != nil {
		b.Error(err)
		return
	}
	defer s.Clear()
	if err := s.Init(); err != nil {
		b.Error(err)
		return
	}
	if err := r.Init(ctx, kvmanager.RequestSpec{AuxIndex: -1, Dummy: true}); err != nil {
		b.Error(err)
		return
	}
	if st, err := s.WaitReady(ctx); st != kvmanager.WaitingForInput {
		b.Errorf("room %d: prefill %v %v %s", id, st, err, s.Failure())
		return
	}
	if err := s.Send(nil, true, -1); err != nil {
		b.Error(err)
		return
	}
	if st, err := r.Wait(ctx); st != kvmanager.Success {
		b.Errorf("room %d: decode %v %v %s", id, st, err, r.Failure())
		return
	}
	if st, err := s.Wait(ctx); st != kvmanager.Success {
		b.Errorf("room %d: prefill %v %v %s", id, st, err, s.Failure())
	}
}
