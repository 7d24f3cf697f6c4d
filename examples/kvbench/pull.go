package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/kvbridge/kvbridge/transfer"
)

// pullMode: pull against push in the same run (docs/PROTOCOL.md "Pull").
//
// Bandwidth: the same rooms (4,096 tokens, fragmented pages, one chunk of
// 2,048 tokens after another) moved by a decode rank that reads them and
// by a prefill rank that writes them, TP 1 → 1 and TP 2 → 1, HND: GB/s and
// CPU per GB against push's.
//
// Admission: vLLM's serial flow — the prefill rank has computed a room
// (its pages are held from then) and the decode rank admits the request
// after a delay of 0, 50 or 500 ms. Per room: the decode rank's wait for
// the KV after admission (the part of TTFT the transfer adds), the prefill
// pages' page-seconds (pages × seconds from "computed" to the pages'
// release: the writes' completion for push, the decode rank's READ_DONE for
// pull) and the CPU per room, pull against push.
func (b *bench) pullMode() error {
	tokens, iters, rooms := 4096, 6, 6
	delays := []time.Duration{0, 50 * time.Millisecond, 500 * time.Millisecond}
	if b.quick {
		tokens, iters, rooms = 512, 2, 2
		delays = []time.Duration{0, 50 * time.Millisecond}
	}
	pt := b.model.PageTokens
	n := tokens / pt
	bytes := float64(tokens) * float64(b.model.BytesPerToken())
	pulling := func(cfg *kvmanager.Config) { cfg.Pull = cfg.Role == kvmanager.RoleDecode }
	cluster := func(ptp int, pull bool) (*topoCluster, error) {
		var mods []func(*kvmanager.Config)
		if pull {
			mods = append(mods, pulling)
		}
		return b.topoClusterPages(ptp, 1, transfer.HND, 2*n, pt, pt, 2*n, mods...)
	}
	steps, total := 0, 4+2*len(delays)
	for _, ptp := range []int{1, 2} {
		var gbps, cpu, room [2]float64
		for i, pull := range []bool{false, true} {
			progress("pull", steps, total)
			c, err := cluster(ptp, pull)
			if err != nil {
				return err
			}
			rng := rand.New(rand.NewPCG(5, 6))
			mk := func(kind string) func() error {
				return func() error {
					return c.roomChunks(scatter(kind, n, 2*n, rng), scatter(kind, n, 2*n, rng), max(2048/pt, 1))
				}
			}
			gbps[i], cpu[i], room[i], err = timeRooms(iters, bytes, mk("contiguous"), mk("fragmented"))
			c.close()
			if err != nil {
				return err
			}
			steps++
		}
		b.add(Row{Mode: "pull", Name: fmt.Sprintf("%s pull TP %d→1 HND %d tok", b.model.Name, ptp, tokens), Bytes: uint64(bytes),
			Value: gbps[1], Unit: "GB/s", References: map[string]float64{"push": gbps[0]},
			CPU: cpu[1], CPUUnit: "s/GB", RefCPU: map[string]float64{"push": cpu[0]}, CPURoom: room[1]})
	}
	for _, delay := range delays {
		var wait, held, cpuRoom [2]float64
		for i, pull := range []bool{false, true} {
			progress("pull", steps, total)
			c, err := cluster(1, pull)
			if err != nil {
				return err
			}
			wait[i], held[i], cpuRoom[i], err = admissionRooms(c, n, rooms, delay)
			c.close()
			if err != nil {
				return err
			}
			steps++
		}
		name := fmt.Sprintf("%s admission %v %d tok", b.model.Name, delay, tokens)
		b.add(Row{Mode: "pull", Name: name + ": KV wait after admission", Value: wait[1], Unit: "ms", References: map[string]float64{"push": wait[0]},
			CPU: cpuRoom[1], CPUUnit: "µs/room", RefCPU: map[string]float64{"push": cpuRoom[0]}, CPURoom: cpuRoom[1]})
		b.add(Row{Mode: "pull", Name: name + ": prefill page-seconds", Value: held[1], Unit: "page·s", References: map[string]float64{"push": held[0]},
			CPU: cpuRoom[1], CPUUnit: "µs/room", RefCPU: map[string]float64{"push": cpuRoom[0]}, CPURoom: cpuRoom[1]})
	}
	progress("pull", steps, total)
	return nil
}

// admissionRooms runs rooms one after another on a cluster of one prefill
// and one decode rank: the prefill rank's pages are "computed" at t0 (the
// sender created and initialised, its pages held from then), the decode
// rank admits the request delay later (receiver, REQUEST). It returns the
// median of the decode rank's wait for the KV after admission (ms) and of
// the page-seconds the prefill rank held (pages × seconds from t0 to the
// pages' release), and the CPU µs per room (every rank is in this process;
// the delays cost none).
func admissionRooms(c *topoCluster, n, rooms int, delay time.Duration) (waitMS, pageSeconds, cpuRoom float64, err error) {
	p, d := c.prefills[0], c.decodes[0]
	ctx := context.Background()
	var waits, held []float64
	_, cpu, err := cpuOver(func() error {
		for k := 0; k < rooms; k++ {
			c.next++
			id := c.next
			src, dst := scatter("fragmented", n, 2*n, rand.New(rand.NewPCG(id, 1))), scatter("fragmented", n, 2*n, rand.New(rand.NewPCG(id, 2)))
			t0 := time.Now()
			s, err := sender.New(p, id)
			if err != nil {
				return err
			}
			s.Init()
			var wg sync.WaitGroup
			var rerr error
			var wait time.Duration
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(delay) // the decode rank admits the request this much later (the workload, not synchronisation)
				r, err := receiver.NewFor(d, id, "", kvmanager.AutoDP)
				if err != nil {
					rerr = err
					return
				}
				defer r.Clear()
				admitted := time.Now()
				if err := r.Init(ctx, kvmanager.RequestSpec{DstPages: dst, AuxIndex: int(id % 4096)}); err != nil {
					rerr = err
					return
				}
				if st, _ := r.Wait(ctx); st != kvmanager.Success {
					rerr = fmt.Errorf("room %d: decode %v: %s", id, st, r.Failure())
				}
				wait = time.Since(admitted)
			}()
			if st, err := s.WaitReady(ctx); st != kvmanager.WaitingForInput {
				wg.Wait()
				return fmt.Errorf("room %d: prefill %v %v", id, st, err)
			}
			for i := 0; i < len(src); i += 128 {
				end := min(i+128, len(src))
				if err := s.Send(src[i:end], end == len(src), int(id%4096)); err != nil {
					wg.Wait()
					return err
				}
			}
			if st, _ := s.Wait(ctx); st != kvmanager.Success {
				wg.Wait()
				return fmt.Errorf("room %d: prefill %v: %s", id, st, s.Failure())
			}
			<-s.Released()
			released := time.Since(t0)
			s.Clear()
			wg.Wait()
			if rerr != nil {
				return rerr
			}
			waits = append(waits, float64(wait.Microseconds())/1e3)
			held = append(held, float64(n)*released.Seconds())
		}
		return nil
	})
	if err != nil {
		return 0, 0, 0, err
	}
	return median(waits), median(held), float64(cpu.Microseconds()) / float64(rooms), nil
}
