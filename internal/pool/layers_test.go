package pool

import (
	"bytes"
	"cmp"
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPoolWritesOnlyItsLayers: a write restricted to layers [1, 3) moves
// only regions 2…5 (K and V of those layers), whole pages and head
// slices alike; the zero range moves every layer.
func TestPoolWritesOnlyItsLayers(t *testing.T) {
	const layers, pages, page = 4, 8, 256
	for _, tc := range []struct {
		name  string
		slice *Slice
	}{
		{"pages", nil},
		{"hnd-slice", &Slice{SrcHead: 1, DstHead: 0, Heads: 1, SrcHeads: 2, DstHeads: 1, HeadBytes: 32, PageTokens: 4, Layout: HND}},
		{"nhd-slice", &Slice{SrcHead: 1, DstHead: 0, Heads: 1, SrcHeads: 2, DstHeads: 1, HeadBytes: 32, PageTokens: 4, Layout: NHD}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, d := newRank(t, "tl-prefill-"+tc.name, layers, pages, page), newRank(t, "tl-decode-"+tc.name, layers, pages, page)
			remote := connect(t, p, d)
			for i, b := range p.kv {
				for k := range b {
					b[k] = byte(1 + i*17 + k%13)
				}
			}
			pool, err := NewPool(p.agent, p.layout, Config{Workers: 1})
			require.NoError(t, err)
			defer pool.Close()
			done := make(chan error, 2)
			for _, l := range []Layers{{Lo: 1, Hi: 3}} {
				require.NoError(t, pool.Submit(Job{Room: 1, Writes: []Write{{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 2, Dst: 5, Len: 2}}, AuxSrc: -1, State: -1, Slice: tc.slice, Layers: l}},
					Gate: func(*Write) bool { return true },
					Done: func(_ *Write, err error, _ bool) { done <- err }}))
			}
			require.NoError(t, <-done)
			zero := make([]byte, page)
			for r := range d.kv {
				got := d.kv[r][5*page : 7*page]
				written := !bytes.Equal(got[:page], zero) || !bytes.Equal(got[page:], zero)
				assert.Equal(t, r >= 2 && r < 6, written, "region %d (layer %d): written", r, r/2)
				if tc.slice == nil && r >= 2 && r < 6 {
					assert.Equal(t, p.kv[r][2*page:4*page], got, "region %d: pages differ", r)
				}
			}
		})
	}
}

// TestPoolReadyGates: a write whose data is not ready waits without
// holding back another room's writes, is posted once Ready says so, and
// fails unposted (quiesced) on Ready's error or past the stall timeout.
func TestPoolReadyGates(t *testing.T) {
	p, d := newRank(t, "tr-prefill", 1, 8, 64), newRank(t, "tr-decode", 1, 8, 64)
	remote := connect(t, p, d)
	pool, err := NewPool(p.agent, p.layout, Config{Workers: 1, Stall: 2 * time.Second})
	require.NoError(t, err)
	defer pool.Close()
	type result struct {
		room     uint64
		err      error
		quiesced bool
	}
	got := make(chan result, 8)
	var gated atomic.Int32
	submit := func(room uint64, ready Ready) {
		t.Helper()
		require.NoError(t, pool.Submit(Job{Room: room, Writes: []Write{{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 0, Dst: uint32(room), Len: 1}}, AuxSrc: -1, State: -1, Ready: ready}},
			Gate: func(*Write) bool { gated.Add(1); return true },
			Done: func(w *Write, err error, q bool) { got <- result{uint64(w.Runs[0].Dst), err, q} }}))
	}
	var ready atomic.Bool
	var asked atomic.Int32
	submit(1, func() (bool, error) { asked.Add(1); return ready.Load(), nil })
	submit(2, nil)
	r := <-got
	require.EqualValues(t, 2, r.room, "the ready room's write: %+v (a waiting room held it back?)", r)
	require.NoError(t, r.err, "the ready room's write (a waiting room held it back?)")
	for asked.Load() < 3 { // asked again and again while not ready
		runtime.Gosched()
	}
	require.EqualValues(t, 1, gated.Load(), "writes that passed the gate before room 1's data was ready")
	ready.Store(true)
	r = <-got
	require.EqualValues(t, 1, r.room, "room 1 once ready: %+v", r)
	require.NoError(t, r.err, "room 1 once ready")
	boom := errors.New("kernel failed")
	submit(3, func() (bool, error) { return false, boom })
	r = <-got
	require.EqualValues(t, 3, r.room, "ready error: %+v", r)
	require.ErrorIs(t, r.err, boom, "ready error: %+v", r)
	require.True(t, r.quiesced, "ready error: %+v", r)
	submit(4, func() (bool, error) { return false, nil })
	r = <-got
	require.EqualValues(t, 4, r.room, "never ready: %+v", r)
	require.ErrorIs(t, r.err, ErrNotReady, "never ready: %+v", r)
	require.True(t, r.quiesced, "never ready: %+v", r)
}

// A write without a notification (a state write) is vouched for only by a
// later write's completion: nothing more of its room is posted while it is
// in flight, though a room may otherwise have two writes in flight.
func TestPoolSilentWriteNotOvertaken(t *testing.T) {
	p, d := newRank(t, "ts-prefill", 1, 8, 64), newRank(t, "ts-decode", 1, 8, 64)
	remote := connect(t, p, d)
	pool, err := NewPool(p.agent, p.layout, Config{Workers: 1})
	require.NoError(t, err)
	defer pool.Close()
	var mu sync.Mutex
	var events []string
	log := func(s string) { mu.Lock(); events = append(events, s); mu.Unlock() }
	done := make(chan struct{}, 3)
	pool.Submit(Job{Room: 1, Writes: []Write{
		{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 0, Dst: 0, Len: 1}}, AuxSrc: -1, State: -1, Notif: "kv"},
		{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 1, Dst: 1, Len: 1}}, AuxSrc: -1, State: -1}, // silent
		{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 2, Dst: 2, Len: 1}}, AuxSrc: -1, State: -1, Notif: "aux", Last: true},
	},
		Gate: func(w *Write) bool { log("post " + cmp.Or(w.Notif, "silent")); return true },
		Done: func(w *Write, err error, _ bool) { log("done " + cmp.Or(w.Notif, "silent")); done <- struct{}{} }})
	for range 3 {
		<-done
	}
	mu.Lock()
	defer mu.Unlock()
	i, j := slices.Index(events, "done silent"), slices.Index(events, "post aux")
	require.True(t, i >= 0 && j >= 0 && j >= i, "the aux write was posted before the silent write completed: %v", events)
	if i, j := slices.Index(events, "post silent"), slices.Index(events, "done kv"); j >= 0 && i > j {
		t.Logf("(the first two went one after the other: %v)", events)
	}
}

// A write waiting for its data is asked again within the back-off however
// busy the worker is (a stream of other jobs must not push the ask back),
// and is dropped at once when its room is over.
func TestPoolReadyNotStarved(t *testing.T) {
	p, d := newRank(t, "tn-prefill", 1, 8, 64), newRank(t, "tn-decode", 1, 8, 64)
	remote := connect(t, p, d)
	pool, err := NewPool(p.agent, p.layout, Config{Workers: 1, Stall: time.Hour})
	require.NoError(t, err)
	defer pool.Close()
	var asked atomic.Int32
	posted := make(chan struct{})
	pool.Submit(Job{Room: 1, Writes: []Write{{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 0, Dst: 0, Len: 1}}, AuxSrc: -1, State: -1,
		Ready: func() (bool, error) { return asked.Add(1) > 8, nil }}}, // the back-off grows to its most first
		Gate: func(*Write) bool { return true },
		Done: func(*Write, error, bool) { close(posted) }})
	const n = 200_000
	sent := 0
	for ; sent < n; sent++ {
		select {
		case <-posted:
			// The asks take about 1.1 ms of back-off: about 1,400 jobs
			// here; with the ask pushed back by each job, 20,000 to all.
			require.Less(t, sent, 10_000, "the waiting write was asked again only after that many other jobs")
			goto live
		default:
		}
		pool.Submit(Job{Room: 2}) // nothing to write: only wakes the worker
	}
	t.Fatalf("the waiting write was never asked again during %d other jobs", n)
live:
	var over atomic.Bool
	dropped := make(chan struct{})
	pool.Submit(Job{Room: 3, Writes: []Write{{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 0, Dst: 3, Len: 1}}, AuxSrc: -1, State: -1,
		Ready: func() (bool, error) { return false, nil }}},
		Gate:    func(*Write) bool { t.Error("a write of a room that is over passed the gate"); return false },
		Done:    func(*Write, error, bool) { t.Error("a write of a room that is over completed") },
		Dropped: func(*Write) { close(dropped) },
		Live:    func() bool { return !over.Load() }})
	over.Store(true)
	select {
	case <-dropped: // long before the hour's stall timeout
	case <-time.After(20 * time.Second):
		t.Fatal("a waiting write of a room that is over was not dropped")
	}
}
