package core

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConcurrentStress plays the three threads of a prefill rank at once
// over 10,000 rooms: a scheduler creating and initialising senders, a
// control loop delivering decode requests and aborts, and transfer workers
// posting chunks; a sweeper advances the clock. Some rooms miss a request,
// some are never created, some are aborted at random stages, and cleared
// ids are reused. At the end no room may be live and non-terminal past its
// deadline, and after clear and the TTL the registry must be empty.
func TestConcurrentStress(t *testing.T) {
	const (
		rooms   = 10_000
		workers = 4
		chunks  = 3
	)
	clk := newFakeClock()
	cfg := testConfig(clk)
	cfg.MaxPendingRooms, cfg.MaxPendingPerPeer = rooms, rooms
	reg, err := newTestReg(cfg, clk)
	require.NoError(t, err)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	type plan struct {
		required  int
		noCreate  bool // the scheduler never creates it: requests pend and expire
		noInit    bool // the sender is never initialised: bootstrap deadline
		missing   bool // one decode rank never sends its request
		abortWhen int  // 0 none, 1 before requests, 2 between, 3 after
	}
	plans := make([]plan, rooms+1)
	for id := 1; id <= rooms; id++ {
		p := plan{required: 1 + rng.IntN(2)}
		p.noCreate = rng.IntN(50) == 0
		p.noInit = rng.IntN(50) == 0
		p.missing = p.required == 2 && rng.IntN(50) == 0
		if rng.IntN(10) == 0 {
			p.abortWhen = 1 + rng.IntN(3)
		}
		plans[id] = p
	}
	// Each thread sees the rooms in roughly arrival order, shuffled within
	// windows of 128, as when decode requests race the prefill scheduler.
	order := func(salt uint64) []uint64 {
		ids := make([]uint64, rooms)
		for i := range ids {
			ids[i] = uint64(i + 1)
		}
		r := rand.New(rand.NewPCG(seed, salt))
		for w := 0; w < rooms; w += 128 {
			win := ids[w:min(w+128, rooms)]
			r.Shuffle(len(win), func(i, j int) { win[i], win[j] = win[j], win[i] })
		}
		return ids
	}

	var (
		succeeded, failed, reuseRefused atomic.Int64
		work                            = make(chan uint64, rooms)
		producers, consumers            sync.WaitGroup
		stopSweep                       = make(chan struct{})
		sweeperDone                     = make(chan struct{})
	)

	// Scheduler: two goroutines, as a batch scheduler would create senders.
	for s := 0; s < 2; s++ {
		producers.Add(1)
		go func(ids []uint64) {
			defer producers.Done()
			for i, id := range ids {
				if int(id)%2 != s || plans[id].noCreate {
					continue
				}
				res := reg.Create(id, RolePrefill)
				if res.Outcome != Applied {
					t.Errorf("room %d: create: %+v", id, res)
					continue
				}
				if !plans[id].noInit {
					reg.Init(id)
				}
				work <- id
				if i%64 == 0 {
					runtime.Gosched()
				}
			}
		}(order(uint64(10 + s)))
	}
	// Bootstrap loop: decode requests and aborts, in its own order.
	producers.Add(1)
	go func(ids []uint64) {
		defer producers.Done()
		for _, id := range ids {
			p := plans[id]
			send := func(peer string) {
				res := reg.Request(id, PeerRequest{Peer: peer, Required: p.required})
				// Refusals are right when the room was aborted, failed or
				// already cleared (a failed room cleared before this rank's
				// request arrived).
				if res.Outcome == Rejected && !errors.Is(res.Err, ErrRoomAborted) &&
					!errors.Is(res.Err, ErrRoomFailed) && !errors.Is(res.Err, ErrRoomCleared) {
					t.Errorf("room %d: request %s: %v", id, peer, res.Err)
				}
			}
			if p.abortWhen == 1 {
				reg.Abort(id, "decode gave up early")
			}
			send("d0")
			if p.abortWhen == 2 {
				reg.Abort(id, "decode gave up")
			}
			if p.required == 2 && !p.missing {
				send("d1")
			}
			if p.abortWhen == 3 {
				reg.Abort(id, "decode gave up late")
			}
		}
	}(order(20))

	// Waiters: a client blocking on some rooms must always be released.
	var waiters sync.WaitGroup
	for w := 0; w < 2; w++ {
		waiters.Add(1)
		go func() {
			defer waiters.Done()
			for id := uint64(1 + w); id <= rooms; id += 97 {
				st, err := reg.Wait(context.Background(), id)
				switch {
				case err == nil && !st.Terminal():
					t.Errorf("room %d: Wait returned %v", id, st)
				case err != nil && !errors.Is(err, ErrUnknownRoom) && !errors.Is(err, ErrRoomCleared) && !errors.Is(err, ErrRoomAborted):
					t.Errorf("room %d: Wait: %v", id, err)
				}
			}
		}()
	}

	// Workers: post each room's chunks once it is ready, clear it when done.
	for w := 0; w < workers; w++ {
		consumers.Add(1)
		go func() {
			defer consumers.Done()
			var mine []uint64
			posted := map[uint64]int{}
			open := true
			for open || len(mine) > 0 {
				if open {
					select {
					case id, ok := <-work:
						if !ok {
							open = false
						} else {
							mine = append(mine, id)
						}
					default:
					}
				}
				kept := mine[:0]
				for _, id := range mine {
					st, _ := reg.Status(id)
					if st == WaitingForInput || st == Transferring {
						if res := reg.Posted(id); res.Outcome == Applied {
							posted[id]++
							last := posted[id] == chunks
							reg.WriteDone(id, last, nil)
						}
						st, _ = reg.Status(id)
					}
					if !st.Terminal() {
						kept = append(kept, id)
						continue
					}
					if st == Success {
						succeeded.Add(1)
					} else {
						failed.Add(1)
					}
					if res := reg.Clear(id); res.Outcome != Applied {
						t.Errorf("room %d: clear: %+v", id, res)
					}
					if id%10 == 0 { // a router reusing the id at once
						if res := reg.Create(id, RolePrefill); errors.Is(res.Err, ErrRoomCleared) {
							reuseRefused.Add(1)
						} else {
							t.Errorf("room %d: reuse inside the TTL: %+v", id, res)
						}
					}
				}
				mine = kept
				runtime.Gosched()
			}
		}()
	}

	// Sweeper: the clock moves 10 ms per pass; no room is ever left past
	// its deadline after a sweep.
	go func() {
		defer close(sweeperDone)
		for {
			select {
			case <-stopSweep:
				return
			default:
			}
			now := clk.Advance(10 * time.Millisecond)
			reg.Sweep(now)
			if n := reg.Overdue(now); n != 0 {
				t.Errorf("%d rooms overdue right after a sweep", n)
			}
			runtime.Gosched()
		}
	}()

	producers.Wait()
	close(work)
	consumers.Wait()
	waiters.Wait()
	close(stopSweep)
	<-sweeperDone

	now := clk.Advance(max(cfg.BootstrapTimeout, cfg.WaitingTimeout, cfg.PendingTimeout) + time.Second)
	reg.Sweep(now)
	live := 0
	for id := uint64(1); id <= rooms; id++ {
		if st, known := reg.Status(id); known {
			live++
			assert.True(t, st.Terminal(), "room %d still %v after every deadline", id, st)
			reg.Clear(id)
		}
	}
	reg.Sweep(clk.Advance(cfg.TombstoneTTL + time.Second))
	s := reg.Sizes()
	require.Zero(t, s.Total(), "registry not empty after clear and TTL: %+v", s)
	// After the TTL every id is free again.
	for id := uint64(10); id <= rooms; id += 10 {
		res := reg.Create(id, RolePrefill)
		require.Equal(t, Applied, res.Outcome, "room %d: reuse after the TTL: %+v", id, res)
		require.Equal(t, Bootstrapping, res.Status, "room %d: reuse after the TTL: %+v", id, res)
		reg.Clear(id)
	}
	t.Logf("%d succeeded, %d failed, %d reuses refused inside the TTL, %d left live for the final sweep",
		succeeded.Load(), failed.Load(), reuseRefused.Load(), live)
	require.Positive(t, succeeded.Load(), "expected both outcomes, got %d succeeded, %d failed", succeeded.Load(), failed.Load())
	require.Positive(t, failed.Load(), "expected both outcomes, got %d succeeded, %d failed", succeeded.Load(), failed.Load())
}
