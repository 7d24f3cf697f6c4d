package transfer

import (
	"bytes"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
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
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			done := make(chan error, 2)
			for _, l := range []Layers{{Lo: 1, Hi: 3}} {
				if err := pool.Submit(Job{Room: 1, Writes: []Write{{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 2, Dst: 5, Len: 2}}, AuxSrc: -1, State: -1, Slice: tc.slice, Layers: l}},
					Gate: func(*Write) bool { return true },
					Done: func(_ *Write, err error, _ bool) { done <- err }}); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			zero := make([]byte, page)
			for r := range d.kv {
				got := d.kv[r][5*page : 7*page]
				written := !bytes.Equal(got[:page], zero) || !bytes.Equal(got[page:], zero)
				if want := r >= 2 && r < 6; written != want {
					t.Errorf("region %d (layer %d): written %v, want %v", r, r/2, written, want)
				}
				if tc.slice == nil && r >= 2 && r < 6 && !bytes.Equal(got, p.kv[r][2*page:4*page]) {
					t.Errorf("region %d: pages differ", r)
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
	if err != nil {
		t.Fatal(err)
	}
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
		if err := pool.Submit(Job{Room: room, Writes: []Write{{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 0, Dst: uint32(room), Len: 1}}, AuxSrc: -1, State: -1, Ready: ready}},
			Gate: func(*Write) bool { gated.Add(1); return true },
			Done: func(w *Write, err error, q bool) { got <- result{uint64(w.Runs[0].Dst), err, q} }}); err != nil {
			t.Fatal(err)
		}
	}
	var ready atomic.Bool
	var asked atomic.Int32
	submit(1, func() (bool, error) { asked.Add(1); return ready.Load(), nil })
	submit(2, nil)
	if r := <-got; r.room != 2 || r.err != nil {
		t.Fatalf("the ready room's write: %+v (a waiting room held it back?)", r)
	}
	for asked.Load() < 3 { // asked again and again while not ready
		runtime.Gosched()
	}
	if gated.Load() != 1 {
		t.Fatalf("%d writes passed the gate before room 1's data was ready", gated.Load())
	}
	ready.Store(true)
	if r := <-got; r.room != 1 || r.err != nil {
		t.Fatalf("room 1 once ready: %+v", r)
	}
	boom := errors.New("kernel failed")
	submit(3, func() (bool, error) { return false, boom })
	if r := <-got; r.room != 3 || !errors.Is(r.err, boom) || !r.quiesced {
		t.Fatalf("ready error: %+v", r)
	}
	submit(4, func() (bool, error) { return false, nil })
	if r := <-got; r.room != 4 || !errors.Is(r.err, ErrNotReady) || !r.quiesced {
		t.Fatalf("never ready: %+v", r)
	}
}
