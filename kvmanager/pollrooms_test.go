package kvmanager

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Both roles' handles carry the batch poll.
var (
	_ interface{ PollRooms([]uint64, []Poll) } = (*Prefill)(nil)
	_ interface{ PollRooms([]uint64, []Poll) } = (*Decode)(nil)
)

// pollPrefill is a prefill rank over the loopback engine for the batch
// poll's tests and benchmark (newTestPrefill takes a *testing.T).
func pollPrefill(tb testing.TB) *Prefill {
	tb.Helper()
	cfg := DefaultConfig(RolePrefill)
	cfg.Auth = testauth.Auth()
	cfg.Instance, cfg.Compat = "poll-test", "v1:test"
	cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
	cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: 64, Regions: []nixl.Desc{{Len: 8 * 64}, {Len: 8 * 64}}}
	p, err := NewPrefill(cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { p.Close() })
	return p
}

// TestPollRooms: the batch poll answers, room by room, what Status answers
// (0 where Status says unknown: never created, cleared, early-aborted),
// for duplicates too, leaves out's tail alone, and refuses a short out.
func TestPollRooms(t *testing.T) {
	p := pollPrefill(t)
	for id := uint64(1); id <= 5; id++ {
		p.CreateSender(id)
	}
	p.InitSender(2)
	p.Abort(3, "operator")
	p.Clear(4)
	rooms := []uint64{1, 2, 3, 4, 5, 6, 2, 1}
	want := []Poll{Bootstrapping, Bootstrapping, Failed, 0, Bootstrapping, 0, Bootstrapping, Bootstrapping}
	if st, _ := p.Status(2); st != Bootstrapping { // no decode request: init alone does not make it ready
		want[1], want[6] = st, st
	}
	out := make([]Poll, len(rooms)+2)
	for i := range out {
		out[i] = Success // a stale status must not survive; the last two are sentinels
	}
	p.PollRooms(rooms, out)
	for i, id := range rooms {
		st, known := p.Status(id)
		if !known {
			st = 0
		}
		assert.Equal(t, want[i], out[i], "room %d: PollRooms (Status %v, known %v)", id, st, known)
		assert.Equal(t, st, out[i], "room %d: PollRooms vs Status (known %v)", id, known)
	}
	assert.Equal(t, Success, out[len(rooms)], "PollRooms wrote past len(rooms): %v", out[len(rooms):])
	assert.Equal(t, Success, out[len(rooms)+1], "PollRooms wrote past len(rooms): %v", out[len(rooms):])
	p.PollRooms(nil, nil) // nothing to poll, nothing to write
	assert.Panics(t, func() { p.PollRooms(rooms, out[:3]) }, "PollRooms with a short out did not panic")
}

// TestPollRoomsAllocatesNothing: the batch poll over 1,000 rooms allocates
// nothing.
func TestPollRoomsAllocatesNothing(t *testing.T) {
	p := pollPrefill(t)
	rooms := make([]uint64, 1000)
	for i := range rooms {
		rooms[i] = uint64(i + 1)
		if i%2 == 0 { // half live, half unknown
			p.CreateSender(rooms[i])
		}
	}
	out := make([]Poll, len(rooms))
	require.Zero(t, testing.AllocsPerRun(100, func() { p.PollRooms(rooms, out) }), "PollRooms allocations per call")
	require.Equal(t, Bootstrapping, out[0], "status of room 0")
	require.Zero(t, out[1], "status of room 1")
}

// TestPollRoomsIsOneSnapshot: a writer creates two rooms in one step and
// clears them in one step; a batch poll of the pair must never see one
// created and the other not, which it would if it let a step run between
// the two rooms (taking the lock per room).
func TestPollRoomsIsOneSnapshot(t *testing.T) {
	p := pollPrefill(t)
	const pairs = 10_000
	var published atomic.Uint64 // the pair the writer is on: rooms 2k, 2k+1
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for k := uint64(1); k <= pairs; k++ {
			p.step(func(c *core.Core, now time.Time) {
				c.Step(now, core.CreateSender{Room: 2 * k})
				c.Step(now, core.CreateSender{Room: 2*k + 1})
			})
			published.Store(k)
			p.step(func(c *core.Core, now time.Time) {
				c.Step(now, core.ClearSender{Room: 2 * k})
				c.Step(now, core.ClearSender{Room: 2*k + 1})
			})
		}
	}()
	// The pair at the two ends of the batch, ids no room takes between
	// them: a poll that let a step in between rooms would have the whole
	// batch's length to do it in.
	rooms, out := make([]uint64, 66), make([]Poll, 66)
	for i := range rooms {
		rooms[i] = 1 << 40
	}
	last := len(rooms) - 1
	splits, polls, seen := 0, 0, 0
	for k := published.Load(); k < pairs; k = published.Load() {
		rooms[0], rooms[last] = 2*k+2, 2*k+3 // the next pair: created while we poll
		for range 4 {
			p.PollRooms(rooms, out)
			polls++
			if (out[0] == 0) != (out[last] == 0) {
				splits++
			}
			if out[0] != 0 {
				seen++
			}
		}
	}
	wg.Wait()
	require.Zero(t, splits, "of %d batch polls, those that saw one room of a pair created in one step and not the other", polls)
	t.Logf("%d polls, %d saw the pair live", polls, seen)
}

// BenchmarkPollRooms: one batch poll of n live rooms against the same
// rooms polled one by one with Status, in the same run (b.N of each, one
// after the other): ns/room of each and their ratio.
func BenchmarkPollRooms(b *testing.B) {
	for _, n := range []int{10, 10_000} {
		b.Run(fmt.Sprintf("rooms=%d", n), func(b *testing.B) {
			p := pollPrefill(b)
			rooms := make([]uint64, n)
			for i := range rooms {
				rooms[i] = uint64(i + 1)
				p.CreateSender(rooms[i])
				if i%2 == 0 {
					p.InitSender(rooms[i])
				}
			}
			out := make([]Poll, n)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				p.PollRooms(rooms, out)
			}
			batch := time.Since(start)
			start = time.Now()
			for range b.N {
				for i, id := range rooms {
					out[i], _ = p.Status(id)
				}
			}
			single := time.Since(start)
			b.StopTimer()
			perRoom := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N*n) }
			b.ReportMetric(perRoom(batch), "batch-ns/room")
			b.ReportMetric(perRoom(single), "status-ns/room")
			b.ReportMetric(perRoom(batch)/perRoom(single), "batch/status")
			b.ReportMetric(0, "ns/op") // the op is two polls of n rooms; the per-room figures are the result
		})
	}
}
