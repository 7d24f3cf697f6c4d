package pool

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadPairs: the descriptor pairs a pulling decode rank reads, for
// each kind of write (pages over a layer range, a head slice of pages of
// different sizes, the aux item, state items), and the refusal of every
// piece outside either side's regions — a prefill rank's PAGES names its
// own pages, and a read of a page it does not have, or into one the decode
// rank does not have, must never be posted.
func TestReadPairs(t *testing.T) {
	const pageBytes, pages = 64, 8
	mk := func(base uintptr, regions int) Layout {
		l := Layout{Kind: nixl.DRAM, PageBytes: pageBytes, AuxItemBytes: 16, Aux: nixl.Desc{Addr: base + 0x100000, Len: 16 * 4},
			State: []StateRegion{{Desc: nixl.Desc{Addr: base + 0x200000, Len: 32 * 4}, ItemBytes: 32}}}
		for r := range regions {
			l.Regions = append(l.Regions, nixl.Desc{Addr: base + uintptr(r)*0x10000, Len: pages * pageBytes})
		}
		return l
	}
	src, dst := mk(0x10000000, 4), mk(0x20000000, 4)

	// Pages of layer 1 (regions 2 and 3), two runs.
	s, d, err := ReadPairs(&Write{Runs: []Run{{Src: 1, Dst: 6, Len: 2}, {Src: 7, Dst: 0, Len: 1}}, Layers: Layers{Lo: 1, Hi: 2}, AuxSrc: -1, State: -1}, src, dst, nil)
	require.NoError(t, err)
	want := [][2]nixl.Desc{
		{{Addr: 0x10020000 + 64, Len: 128}, {Addr: 0x20020000 + 6*64, Len: 128}},
		{{Addr: 0x10020000 + 7*64, Len: 64}, {Addr: 0x20020000, Len: 64}},
		{{Addr: 0x10030000 + 64, Len: 128}, {Addr: 0x20030000 + 6*64, Len: 128}},
		{{Addr: 0x10030000 + 7*64, Len: 64}, {Addr: 0x20030000, Len: 64}},
	}
	require.Len(t, s, len(want), "source pieces")
	require.Len(t, d, len(want), "destination pieces")
	for i, w := range want {
		require.Equal(t, w[0], s[i], "piece %d: source", i)
		require.Equal(t, w[1], d[i], "piece %d: destination", i)
	}
	// The aux item and state items.
	s, d, err = ReadPairs(&Write{AuxSrc: 3, AuxDst: 1, State: -1}, src, dst, nil)
	require.NoError(t, err, "aux")
	require.EqualValues(t, 0x10100000+48, s[0].Addr, "aux: %+v %+v", s, d)
	require.EqualValues(t, 0x20100000+16, d[0].Addr, "aux: %+v %+v", s, d)
	require.EqualValues(t, 16, s[0].Len, "aux: %+v %+v", s, d)
	s, d, err = ReadPairs(&Write{Runs: []Run{{Src: 2, Dst: 0, Len: 2}}, AuxSrc: -1, State: 0}, src, dst, nil)
	require.NoError(t, err, "state")
	require.Len(t, s, 2, "state: %+v %+v", s, d)
	require.EqualValues(t, 0x10200000+96, s[1].Addr, "state: %+v %+v", s, d)
	require.EqualValues(t, 0x20200000+32, d[1].Addr, "state: %+v %+v", s, d)
	// A head slice of pages of different sizes (prefill 4 tokens, decode
	// 8), HND: checked by the rank mapping's bounds.
	sl := &Slice{Heads: 2, SrcHeads: 2, DstHeads: 2, HeadBytes: 8, PageTokens: 4, DstPageTokens: 8, Layout: HND}
	sl4, dl8 := mk(0x30000000, 2), mk(0x40000000, 2)
	dl8.PageBytes = 128
	for r := range dl8.Regions {
		dl8.Regions[r].Len = pages * 128
	}
	_, _, err = ReadPairs(&Write{Runs: []Run{{Src: 0, Dst: 3, Len: 2}}, AuxSrc: -1, State: -1}, sl4, dl8, sl)
	require.NoError(t, err, "slice")

	// Every piece outside a side's regions is refused.
	for _, tc := range []struct {
		name string
		w    Write
		s    *Slice
		want string
	}{
		{"a source page past the regions", Write{Runs: []Run{{Src: 7, Dst: 0, Len: 2}}, AuxSrc: -1, State: -1}, nil, "outside the regions"},
		{"a destination page past the regions", Write{Runs: []Run{{Src: 0, Dst: 8, Len: 1}}, AuxSrc: -1, State: -1}, nil, "outside the regions"},
		{"an aux item past the source's", Write{AuxSrc: 4, AuxDst: 0, State: -1}, nil, "outside the aux regions"},
		{"an aux item past the destination's", Write{AuxSrc: 0, AuxDst: 4, State: -1}, nil, "outside the aux regions"},
		{"a state item past the region", Write{Runs: []Run{{Src: 3, Dst: 0, Len: 2}}, AuxSrc: -1, State: 0}, nil, "outside state region 0"},
		{"a state region neither side has", Write{Runs: []Run{{Src: 0, Dst: 0, Len: 1}}, AuxSrc: -1, State: 1}, nil, "does not match"},
		{"a unit past the destination's pages", Write{Runs: []Run{{Src: 0, Dst: 16, Len: 1}}, AuxSrc: -1, State: -1}, sl, "outside"},
	} {
		l, r := src, dst
		if tc.s != nil {
			l, r = sl4, dl8
		}
		s, d, err := ReadPairs(&tc.w, l, r, tc.s)
		assert.ErrorContains(t, err, tc.want, "%s", tc.name)
		assert.Nil(t, s, "%s: want nothing to read", tc.name)
		assert.Nil(t, d, "%s: want nothing to read", tc.name)
	}
}

// pullPair is a prefill rank whose pages and aux items hold a pattern
// (each page's bytes its region·mul + page + 1, each aux item 0xc0 + its
// index) and a decode rank that has loaded its agent (remote).
func pullPair(t *testing.T, name string, layers, pages int, page uint64, mul int) (p, d *rank, remote string) {
	t.Helper()
	p, d = newRank(t, name+"-prefill", layers, pages, page), newRank(t, name+"-decode", layers, pages, page)
	for i, b := range p.kv {
		for k := range b {
			b[k] = byte(i*mul + k/int(page) + 1)
		}
	}
	for k := range p.aux {
		p.aux[k] = byte(0xc0 + k/64)
	}
	return p, d, connect(t, d, p)
}

// readResult is what a read job reported.
type readResult struct {
	err      error
	quiesced bool
	dropped  bool
}

// readJob is a job reading from src (its agent loaded by the pool's as
// remote) what writes name, reporting on the returned channel.
func readJob(remote string, src *rank, writes []Write, until time.Time, hold *sync.RWMutex, gate func() bool) (Job, *Read, chan readResult) {
	out := make(chan readResult, 2) // room for a second report, which TestPoolReads refuses
	rd := &Read{Remote: remote, Source: src.layout, Writes: writes, Until: until, Hold: hold}
	return Job{Room: 5, Read: rd,
		Gate:    func(w *Write) bool { return gate() },
		Done:    func(w *Write, err error, quiesced bool) { out <- readResult{err: err, quiesced: quiesced} },
		Dropped: func(w *Write) { out <- readResult{dropped: true} },
	}, rd, out
}

// TestPoolReads: a pull read goes through the pool like a write — the
// decode rank's pool reads pages of one layer and an aux item from the
// prefill rank's memory, each in its own transfer, byte for byte, gated
// once; what it moved is counted; a read its gate refuses is dropped,
// nothing read; one whose lease has ended is never posted (quiesced),
// nothing read; one whose Hold is held for writing (an offer replacing its
// remote's metadata) is not prepared, gated or posted until it is let go.
func TestPoolReads(t *testing.T) {
	const layers, pages, page = 2, 16, 128
	p, d, remote := pullPair(t, "read", layers, pages, page, 17)
	pl, err := NewPool(d.agent, d.layout, Config{Workers: 2})
	require.NoError(t, err)
	defer pl.Close()
	zero := func() {
		for _, b := range d.kv {
			clear(b)
		}
		clear(d.aux)
	}
	untouched := func(what string) {
		for i, b := range d.kv {
			require.Equal(t, make([]byte, len(b)), b, "%s: region %d written", what, i)
		}
		require.Equal(t, make([]byte, len(d.aux)), d.aux, "%s: aux written", what)
	}
	writes := []Write{{Runs: []Run{{Src: 2, Dst: 5, Len: 3}}, Layers: Layers{Lo: 1, Hi: 2}, AuxSrc: -1, State: -1},
		{AuxSrc: 3, AuxDst: 7, State: -1}}
	future := time.Now().Add(time.Hour)

	var reported []chan readResult // each job's: nothing more once it reported
	defer func() {
		pl.Close() // every transfer ended and settled
		for i, out := range reported {
			assert.Empty(t, out, "read %d reported twice", i)
		}
	}()
	gates := 0
	j, rd, out := readJob(remote, p, writes, future, nil, func() bool { gates++; return true })
	reported = append(reported, out)
	require.NoError(t, pl.Submit(j))
	r := <-out
	require.NoError(t, r.err, "the read")
	require.True(t, r.quiesced, "a read that succeeded is quiesced")
	require.Equal(t, 1, gates, "the read's gate, once")
	require.Equal(t, 2, rd.Transfers, "one transfer for the pages, one for the aux item")
	require.EqualValues(t, 2*3*page+64, rd.Bytes, "the bytes it moved")
	for i, b := range d.kv {
		for pg := range pages {
			want := make([]byte, page)
			if i >= 2 && pg >= 5 && pg < 8 {
				want = p.kv[i][(pg-3)*page : (pg-2)*page]
			}
			require.Equal(t, want, b[pg*page:(pg+1)*page], "region %d page %d", i, pg)
		}
	}
	require.Equal(t, p.aux[3*64:4*64], d.aux[7*64:8*64], "the aux item")
	require.Equal(t, make([]byte, 7*64), d.aux[:7*64], "other aux items")

	zero()
	j, _, out = readJob(remote, p, writes, future, nil, func() bool { return false })
	reported = append(reported, out)
	require.NoError(t, pl.Submit(j))
	require.Equal(t, readResult{dropped: true}, <-out, "a read its gate refused")
	untouched("a read its gate refused")

	j, _, out = readJob(remote, p, writes, time.Now().Add(-time.Millisecond), nil, func() bool { return true })
	reported = append(reported, out)
	require.NoError(t, pl.Submit(j))
	r = <-out
	require.ErrorIs(t, r.err, ErrLeaseEnded, "a read past its lease")
	require.True(t, r.quiesced, "a read past its lease was never posted")
	untouched("a read past its lease")

	var hold sync.RWMutex
	hold.Lock()
	gated := make(chan struct{}, 1)
	j, _, out = readJob(remote, p, writes, future, &hold, func() bool { gated <- struct{}{}; return true })
	reported = append(reported, out)
	require.NoError(t, pl.Submit(j))
	select {
	case <-gated:
		require.Fail(t, "a read gated while its remote's metadata is being replaced")
	case r := <-out:
		require.Fail(t, "a read done while its remote's metadata is being replaced", "%+v", r)
	case <-time.After(200 * time.Millisecond): // waiting, not synchronising: nothing may happen
	}
	untouched("a read held")
	hold.Unlock()
	<-gated
	require.NoError(t, (<-out).err, "the held read, once let go")
	require.Equal(t, p.aux[3*64:4*64], d.aux[7*64:8*64], "the held read's aux item")
}

// TestPoolReadFailures: how a read fails, and whether what it posted may
// still land (quiesced). The pool's clock (Config.Now, asked right before
// each post) plays the lease ending, or the remote's metadata dropped,
// between the read's two transfers, and checks that the read's Hold is
// held at each post. A read of layers outside the source's, or of nothing,
// fails unposted; none is left unreported (the pool's Close returns).
func TestPoolReadFailures(t *testing.T) {
	const layers, pages, page = 2, 16, 128
	p, d, remote := pullPair(t, "fail", layers, pages, page, 13)
	var hold sync.RWMutex
	var mu sync.Mutex
	var posts int
	var atSecond func() time.Time // what the clock does before a read's second post
	var heldAtPost []bool
	pl, err := NewPool(d.agent, d.layout, Config{Workers: 1, Now: func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		held := !hold.TryLock()
		if !held {
			hold.Unlock()
		}
		heldAtPost = append(heldAtPost, held)
		if posts++; posts%2 == 0 && atSecond != nil {
			return atSecond()
		}
		return time.Now()
	}})
	require.NoError(t, err)
	closed := false
	defer func() {
		if !closed {
			pl.Close()
		}
	}()
	zero := func() {
		for _, b := range d.kv {
			clear(b)
		}
		clear(d.aux)
	}
	future := time.Now().Add(time.Hour)
	pagesThenAux := []Write{{Runs: []Run{{Src: 1, Dst: 2, Len: 2}}, AuxSrc: -1, State: -1}, {AuxSrc: 0, AuxDst: 1, State: -1}}
	run := func(what string, writes []Write, second func() time.Time) readResult {
		t.Helper()
		mu.Lock()
		posts, atSecond, heldAtPost = 0, second, nil
		mu.Unlock()
		zero()
		j, _, out := readJob(remote, p, writes, future, &hold, func() bool { return true })
		require.NoError(t, pl.Submit(j), what)
		var r readResult
		select {
		case r = <-out:
		case <-time.After(30 * time.Second):
			closed = true // its flight never settles: Close would wait for it
			t.Fatalf("%s: the read was never reported", what)
		}
		mu.Lock()
		defer mu.Unlock()
		for i, held := range heldAtPost {
			require.True(t, held, "%s: the read's Hold not held at its post %d", what, i+1)
		}
		return r
	}

	// The lease ends between the two posts: the pages land, the aux item
	// is never posted, and nothing more can land (quiesced).
	r := run("the lease ending between the posts", pagesThenAux, func() time.Time { return future.Add(time.Second) })
	require.ErrorIs(t, r.err, ErrLeaseEnded, "the lease ending between the posts")
	require.True(t, r.quiesced, "the lease ending between the posts: the posted transfer ended, the other was never posted")
	require.Equal(t, p.kv[0][page:3*page], d.kv[0][2*page:4*page], "the lease ending between the posts: the pages posted first")
	require.Equal(t, make([]byte, len(d.aux)), d.aux, "the lease ending between the posts: the aux item was posted")

	// The remote's metadata dropped between the posts: the second post
	// fails (the remote unknown). Only a stale preparation is known never
	// to have reached the engine; any other failed post may have started
	// (not quiesced).
	r = run("the remote dropped between the posts", pagesThenAux, func() time.Time {
		assert.NoError(t, d.agent.InvalidateRemote(remote)) // (on the worker: no FailNow there)
		return time.Now()
	})
	require.Error(t, r.err, "the remote dropped between the posts")
	require.False(t, r.quiesced, "the remote dropped between the posts: its failed post may have started")
	remote = connect(t, d, p)

	// Layers outside the source's (two layers: regions 0 to 3), whole or in
	// part, and a read of nothing: failed before any post.
	for _, tc := range []struct {
		what   string
		writes []Write
	}{
		{"layers past the source's", []Write{{Runs: []Run{{Src: 0, Dst: 0, Len: 1}}, Layers: Layers{Lo: 5, Hi: 6}, AuxSrc: -1, State: -1}}},
		{"layers partly past the source's", []Write{{Runs: []Run{{Src: 0, Dst: 0, Len: 1}}, Layers: Layers{Lo: 1, Hi: 3}, AuxSrc: -1, State: -1}}},
		{"a read of nothing", nil},
	} {
		r := run(tc.what, tc.writes, nil)
		require.Error(t, r.err, "%s: read as if it were there", tc.what)
		require.True(t, r.quiesced, "%s: never posted", tc.what)
		for i, b := range d.kv {
			require.Equal(t, make([]byte, len(b)), b, "%s: region %d written", tc.what, i)
		}
	}
	pl.Close() // every read reported and settled: Close returns
	closed = true
}

// TestPoolReadsAtClose: once the pool begins to close, a read still queued
// is not prepared, gated or posted: it fails ErrClosed, never posted
// (quiesced). (A read posted before is reported too; whether it ended or
// was released as the close began depends on the engine.)
func TestPoolReadsAtClose(t *testing.T) {
	const layers, pages, page = 1, 8, 64
	p, d := newRank(t, "close-prefill", layers, pages, page), newRank(t, "close-decode", layers, pages, page)
	remote := connect(t, d, p)
	pl, err := NewPool(d.agent, d.layout, Config{Workers: 1})
	require.NoError(t, err)
	for _, b := range p.kv {
		for k := range b {
			b[k] = 0x5a
		}
	}
	future := time.Now().Add(time.Hour)
	entered, release := make(chan struct{}), make(chan struct{})
	first, _, out1 := readJob(remote, p, []Write{{Runs: []Run{{Src: 0, Dst: 1, Len: 2}}, AuxSrc: -1, State: -1}}, future, nil,
		func() bool { close(entered); <-release; return true })
	var secondGated atomic.Bool
	second, _, out2 := readJob(remote, p, []Write{{Runs: []Run{{Src: 0, Dst: 5, Len: 2}}, AuxSrc: -1, State: -1}}, future, nil,
		func() bool { secondGated.Store(true); return true })
	require.NoError(t, pl.Submit(first))
	<-entered // the worker is inside the first read's gate
	require.NoError(t, pl.Submit(second))
	closed := make(chan struct{})
	go func() {
		pl.Close()
		close(closed)
	}()
	<-pl.closing // Close has begun
	close(release)
	<-out1
	r := <-out2
	require.ErrorIs(t, r.err, ErrClosed, "a read queued when the pool began to close")
	require.True(t, r.quiesced, "a read queued when the pool began to close: never posted")
	require.False(t, secondGated.Load(), "a read queued when the pool began to close was gated")
	for i, b := range d.kv {
		require.Equal(t, make([]byte, 2*page), b[5*page:7*page], "region %d: the second read's pages written", i)
	}
	<-closed
	assert.Empty(t, out1, "the first read reported twice")
	assert.Empty(t, out2, "the second read reported twice")
}
