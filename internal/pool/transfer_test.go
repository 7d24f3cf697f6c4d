package pool

import (
	"bytes"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// rank is an agent with a KV layout of `layers` layers and `pages` pages.
type rank struct {
	agent  *nixl.Agent
	layout Layout
	kv     [][]byte
	aux    []byte
}

func newRank(t *testing.T, name string, layers, pages int, page uint64) *rank {
	t.Helper()
	a, err := nixl.Open(nixl.Config{Name: name, Engine: nixl.EngineLoopback})
	require.NoError(t, err)
	t.Cleanup(func() { a.Close() })
	r := &rank{agent: a, layout: Layout{Kind: nixl.DRAM, PageBytes: page, AuxItemBytes: 64}}
	for i := 0; i < 2*layers; i++ {
		_, buf, err := a.Alloc(uint64(pages) * page)
		require.NoError(t, err)
		r.kv = append(r.kv, buf)
		r.layout.Regions = append(r.layout.Regions, nixl.BytesDesc(buf))
	}
	_, r.aux, _ = a.Alloc(64 * 16)
	r.layout.Aux = nixl.BytesDesc(r.aux)
	return r
}

func connect(t *testing.T, from, to *rank) string {
	md, _ := to.agent.Metadata()
	name, err := from.agent.LoadRemote(md)
	require.NoError(t, err)
	return name
}

func TestPoolWritesPagesInOrder(t *testing.T) {
	const layers, pages, page = 4, 64, 256
	p, d := newRank(t, "tp-prefill", layers, pages, page), newRank(t, "tp-decode", layers, pages, page)
	remote := connect(t, p, d)
	for i, b := range p.kv {
		for k := range b {
			b[k] = byte(i*31 + k/page)
		}
	}
	copy(p.aux[3*64:4*64], bytes.Repeat([]byte{0xa5}, 64))
	pool, err := NewPool(p.agent, p.layout, Config{Workers: 2, RoomInFlight: 1})
	require.NoError(t, err)
	defer pool.Close()

	var mu sync.Mutex
	var order []string
	done := make(chan struct{})
	gate := func(w *Write) bool { return true }
	record := func(w *Write, err error, _ bool) {
		assert.NoError(t, err)
		mu.Lock()
		order = append(order, w.Notif)
		n := len(order)
		mu.Unlock()
		if n == 4 {
			close(done)
		}
	}
	// Chunk 0: pages 0..9 → 20..29 (contiguous); chunk 1 (last): scattered
	// pages, then the aux item.
	src1, dst1 := []uint32{10, 11, 40, 41, 42}, []uint32{5, 6, 50, 51, 60}
	jobs := []Job{
		{Room: 7, Writes: []Write{{Remote: remote, Peer: d.layout, Runs: kvlayout.Runs([]uint32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9},
			[]uint32{20, 21, 22, 23, 24, 25, 26, 27, 28, 29}), AuxSrc: -1, State: -1, Notif: "kvb1:7:0:0:0"}}},
		{Room: 7, Writes: []Write{
			{Remote: remote, Peer: d.layout, Runs: kvlayout.Runs(src1, dst1), AuxSrc: -1, State: -1, Notif: "kvb1:7:0:1:2", Last: true},
			{Remote: remote, Peer: d.layout, AuxSrc: 3, AuxDst: 9, State: -1, Notif: "kvb1:7:0:aux", Last: true},
			{Remote: remote, Peer: d.layout, AuxSrc: -1, State: -1, Notif: "kvb1:7:0:empty"}, // nothing to move: notification only
		}},
	}
	for _, j := range jobs {
		j.Gate, j.Done = gate, record
		require.NoError(t, pool.Submit(j))
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("writes did not complete")
	}
	require.Equal(t, []string{"kvb1:7:0:0:0", "kvb1:7:0:1:2", "kvb1:7:0:aux", "kvb1:7:0:empty"}, order, "order")
	check := func(sp, dp uint32) {
		for l := range p.kv {
			require.Equal(t, p.kv[l][sp*page:(sp+1)*page], d.kv[l][dp*page:(dp+1)*page], "region %d: page %d → %d wrong", l, sp, dp)
		}
	}
	for i := uint32(0); i < 10; i++ {
		check(i, 20+i)
	}
	for i := range src1 {
		check(src1[i], dst1[i])
	}
	require.Equal(t, p.aux[3*64:4*64], d.aux[9*64:10*64], "aux item not written")
	ns, _ := d.agent.Notifs()
	var got []string
	for _, n := range ns {
		got = append(got, string(n.Msg))
	}
	require.Equal(t, order, got, "notifications")
}

func TestPoolGateDrops(t *testing.T) {
	p, d := newRank(t, "tg-prefill", 1, 8, 64), newRank(t, "tg-decode", 1, 8, 64)
	remote := connect(t, p, d)
	pool, _ := NewPool(p.agent, p.layout, Config{Workers: 1})
	dropped := make(chan string, 4)
	var wrote int
	for i := 0; i < 3; i++ {
		pool.Submit(Job{Room: 1, Writes: []Write{{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 0, Dst: 0, Len: 1}}, AuxSrc: -1, State: -1, Notif: fmt.Sprint(i)}},
			Gate:    func(w *Write) bool { return w.Notif == "0" },
			Done:    func(*Write, error, bool) { wrote++ },
			Dropped: func(w *Write) { dropped <- w.Notif }})
	}
	pool.Close()
	require.Equal(t, 1, wrote, "wrote")
	require.Len(t, dropped, 2, "dropped")
	require.ErrorIs(t, pool.Submit(Job{Room: 1}), ErrClosed, "submit after close")
}

// TestPoolQuiesced: a write that fails before anything is posted is
// reported quiesced (it can never land); the core may then count the room
// drained. A write refused after its post could still land, so the pool
// never claims that for it.
func TestPoolQuiesced(t *testing.T) {
	p, d := newRank(t, "tq-prefill", 1, 8, 64), newRank(t, "tq-decode", 1, 8, 64)
	remote := connect(t, p, d)
	pool, _ := NewPool(p.agent, p.layout, Config{Workers: 1})
	defer pool.Close()
	type done struct {
		err      error
		quiesced bool
	}
	got := make(chan done, 2)
	peer := d.layout
	peer.AuxItemBytes = p.layout.AuxItemBytes + 1 // refused before any post
	pool.Submit(Job{Room: 1, Writes: []Write{
		{Remote: remote, Peer: peer, AuxSrc: 0, AuxDst: 0, State: -1},
		{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 0, Dst: 0, Len: 1}}, AuxSrc: -1, State: -1},
	},
		Gate: func(*Write) bool { return true },
		Done: func(_ *Write, err error, q bool) { got <- done{err, q} }})
	r := <-got
	require.Error(t, r.err, "write refused before its post")
	require.True(t, r.quiesced, "write refused before its post: quiesced")
	r = <-got
	require.NoError(t, r.err, "completed write")
	require.False(t, r.quiesced, "completed write: quiesced")
}

// TestPoolJobTaken: a job's Taken (the latency breakdown's trace point) is
// called once per job, when its worker takes it off the queue: before its
// writes pass their gate.
func TestPoolJobTaken(t *testing.T) {
	p, d := newRank(t, "tt-prefill", 1, 8, 64), newRank(t, "tt-decode", 1, 8, 64)
	remote := connect(t, p, d)
	pool, err := NewPool(p.agent, p.layout, Config{Workers: 1})
	require.NoError(t, err)
	var mu sync.Mutex
	var seen []string
	note := func(s string) { mu.Lock(); seen = append(seen, s); mu.Unlock() }
	done := make(chan struct{}, 2)
	for i := range 2 {
		require.NoError(t, pool.Submit(Job{Room: 1, Writes: []Write{{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 0, Dst: 0, Len: 1}}, AuxSrc: -1, State: -1, Notif: fmt.Sprint(i)}},
			Taken: func() { note(fmt.Sprint("taken ", i)) },
			Gate:  func(w *Write) bool { note("gate " + w.Notif); return true },
			Done:  func(*Write, error, bool) { done <- struct{}{} }}))
	}
	for range 2 {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("writes did not complete")
		}
	}
	pool.Close()
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 4, "each job taken once, each write gated once: %q", seen)
	require.Less(t, slices.Index(seen, "taken 0"), slices.Index(seen, "gate 0"), "%q", seen)
	require.Less(t, slices.Index(seen, "taken 1"), slices.Index(seen, "gate 1"), "%q", seen)
}

// TestSumPiecesOneDevice: a digest over VRAM is summed on one device, of
// pieces inside the regions summed, or refused before any driver is
// asked (the agent is nil here): pieces of regions on two devices, naming
// both and the region; a piece past its region's end, before the first
// region or between two, naming the piece — the kernel would read outside
// the device's memory, a fault that on a GPU takes the process's context
// down.
func TestSumPiecesOneDevice(t *testing.T) {
	l := Layout{Kind: nixl.VRAM, PageBytes: 64, Regions: []nixl.Desc{{Addr: 1 << 20, Len: 64, Dev: 0}, {Addr: 2 << 20, Len: 64, Dev: 1}}}
	_, err := SumPieces(nil, l, 0, 2, []uint64{1 << 20, 64, 2 << 20, 64}, []int{2})
	require.ErrorContains(t, err, "a digest over regions of devices 0 and 1 (region 1)")
	l.Regions[1].Dev = 0
	for name, piece := range map[string][2]uint64{
		"past the end":    {2<<20 + 32, 33},
		"before":          {1<<20 - 1, 2},
		"between":         {1<<20 + 64, 1},
		"a second region": {1<<20 + 8, 2 << 20},
	} {
		_, err = SumPieces(nil, l, 0, 2, []uint64{1 << 20, 64, piece[0], piece[1]}, []int{2})
		require.ErrorContains(t, err, fmt.Sprintf("a digest's piece 1 (%#x, %d bytes) lies outside the regions summed", piece[0], piece[1]), name)
	}
	// Inside: a region's whole, its last byte, a piece at the second
	// region's first address, with a region of no bytes at the same
	// address listed first.
	l.Regions = append([]nixl.Desc{{Addr: 2 << 20, Len: 0}}, l.Regions...)
	require.NoError(t, piecesInside(l.Regions, []uint64{1 << 20, 64, 1<<20 + 63, 1, 2 << 20, 8, 2<<20 + 8, 56}))
}

// blockWorker gives the pool's one worker a write whose gate holds it
// until release is closed: the worker then takes nothing off its queue
// and settles no completion, as a worker not yet scheduled.
func blockWorker(t *testing.T, pool *Pool, remote string, peer Layout) (release func(), done <-chan struct{}) {
	t.Helper()
	held, rel, fin := make(chan struct{}), make(chan struct{}), make(chan struct{})
	require.NoError(t, pool.Submit(Job{Room: 1000, Writes: []Write{{Remote: remote, Peer: peer, Runs: []Run{{Src: 7, Dst: 7, Len: 1}}, AuxSrc: -1, State: -1, Notif: "block"}},
		Gate: func(*Write) bool { close(held); <-rel; return true },
		Done: func(*Write, error, bool) { close(fin) }}))
	<-held
	return sync.OnceFunc(func() { close(rel) }), fin
}

// locked copies *v under mu (a failed require must not leave mu held:
// the pool's callbacks take it).
func locked[T any](mu *sync.Mutex, v *[]T) []T {
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(*v)
}

// handWorker is a pool of one worker whose state the test steps by hand
// (no worker goroutine runs), between two ranks named for the test.
func handWorker(t *testing.T, name string, cfg Config) (p, d *rank, remote string, pool *Pool, wk *workerState) {
	t.Helper()
	p, d = newRank(t, name+"-prefill", 1, 8, 64), newRank(t, name+"-decode", 1, 8, 64)
	remote = connect(t, p, d)
	cfg.Workers = 1
	pool, err := newPool(p.agent, p.layout, cfg, false)
	require.NoError(t, err)
	t.Cleanup(pool.lists.close)
	wk = &workerState{p: pool, ahead: &pool.ahead[0], rooms: map[uint64]*roomWork{}, flights: map[*nixl.Xfer]*flight{},
		early: map[*nixl.Xfer]bool{}, seqs: map[uint64]seqRecord{}, done: pool.dones[0]}
	return p, d, remote, pool, wk
}

// notifsUpTo adds the notifications d's agent receives to got until it
// holds n.
func notifsUpTo(t *testing.T, d *rank, got []string, n int) []string {
	t.Helper()
	for len(got) < n {
		select {
		case <-d.agent.NotifyC():
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d notifications: %q", len(got), n, got)
		}
		ns, err := d.agent.Notifs()
		require.NoError(t, err)
		for _, nf := range ns {
			got = append(got, string(nf.Msg))
		}
	}
	return got
}

// TestPoolFirstPostedBySubmit: a room's first writes (Job.First) are
// gated and posted by Submit, on the caller's goroutine, while the worker
// is held elsewhere (issue 52: REQUEST → first post): in order, up to
// RoomInFlight of them, none after a write without a notification, while
// together they move at most FirstBytes; the job's later writes follow
// through the worker, in order, after them. A write whose data is not in
// place (Ready false), or that moves more than FirstBytes, is left to the
// worker, as is a job not marked First.
func TestPoolFirstPostedBySubmit(t *testing.T) {
	p, d := newRank(t, "tf-prefill", 1, 8, 64), newRank(t, "tf-decode", 1, 8, 64)
	remote := connect(t, p, d)
	pool, err := NewPool(p.agent, p.layout, Config{Workers: 1, FirstBytes: 3 * 2 * 64}) // three pages of both regions: room 2's three writes fit
	require.NoError(t, err)
	defer pool.Close()
	release, blocked := blockWorker(t, pool, remote, d.layout)
	defer release()

	var mu sync.Mutex
	var gated, finished []string
	done := make(chan struct{}, 16) // room for every write: a failed require stops reading
	job := func(room uint64, first bool, ready Ready, notifs ...string) Job {
		j := Job{Room: room, First: first,
			Gate: func(w *Write) bool { mu.Lock(); gated = append(gated, w.Notif); mu.Unlock(); return true },
			Done: func(w *Write, err error, _ bool) {
				assert.NoError(t, err, w.Notif)
				mu.Lock()
				finished = append(finished, w.Notif)
				mu.Unlock()
				done <- struct{}{}
			}}
		for i, n := range notifs {
			j.Writes = append(j.Writes, Write{Remote: remote, Peer: d.layout, Runs: []Run{{Src: uint32(i), Dst: uint32(i), Len: 1}}, AuxSrc: -1, State: -1, Notif: n, Ready: ready})
		}
		return j
	}
	var ready atomic.Bool // room 4's data: not in place until the worker runs
	require.NoError(t, pool.Submit(job(2, true, nil, "2a", "2b", "2c")))
	require.NoError(t, pool.Submit(job(3, false, nil, "3a")))
	require.NoError(t, pool.Submit(job(4, true, func() (bool, error) { return ready.Load(), nil }, "4a")))
	big := job(5, true, nil, "5a")
	big.Writes[0].Runs[0].Len = 4 // four pages: past FirstBytes
	require.NoError(t, pool.Submit(big))
	require.NoError(t, pool.Submit(job(6, true, nil, "", "6b"))) // a write without a notification first
	sum := job(7, true, nil, "7a", "7b")
	sum.Writes[1].Runs[0].Len = 3 // one page, then three: past FirstBytes together
	require.NoError(t, pool.Submit(sum))
	require.Equal(t, []string{"2a", "2b", "", "7a"}, locked(&mu, &gated),
		"gated before the worker ran: room 2's first two (RoomInFlight), room 6's silent write alone, room 7's first (FirstBytes)")
	got := notifsUpTo(t, d, nil, 3) // the first writes land with the worker still held
	require.ElementsMatch(t, []string{"2a", "2b", "7a"}, got, "only the first writes landed while the worker was held")
	ready.Store(true)
	release()
	<-blocked
	for range 10 {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("writes did not complete")
		}
	}
	fin := locked(&mu, &finished)
	require.ElementsMatch(t, []string{"2a", "2b", "2c", "3a", "4a", "5a", "", "6b", "7a", "7b"}, fin)
	require.Less(t, slices.Index(fin, "2a"), slices.Index(fin, "2b"), "room 2's writes in order: %q", fin)
	require.Less(t, slices.Index(fin, "2b"), slices.Index(fin, "2c"), "room 2's writes in order: %q", fin)
	require.Less(t, slices.Index(fin, ""), slices.Index(fin, "6b"), "room 6's writes in order: %q", fin)
	got = notifsUpTo(t, d, got, 10)
	require.Less(t, slices.Index(got, "2b"), slices.Index(got, "2c"), "room 2's notifications in order: %q", got)
	require.Less(t, slices.Index(got, "7a"), slices.Index(got, "7b"), "room 7's notifications in order: %q", got)
}

// TestPoolFirstInFlightBound: the first writes Submit posts per worker
// are at most FirstInFlight until they are final: past it, a room's first
// write waits for the worker; once one is final (its completion settled
// by the worker), the next room's first write is posted by Submit again.
func TestPoolFirstInFlightBound(t *testing.T) {
	p, d := newRank(t, "tb-prefill", 1, 8, 64), newRank(t, "tb-decode", 1, 8, 64)
	remote := connect(t, p, d)
	pool, err := NewPool(p.agent, p.layout, Config{Workers: 1, FirstInFlight: 1})
	require.NoError(t, err)
	defer pool.Close()
	release, blocked := blockWorker(t, pool, remote, d.layout)
	defer release()
	var mu sync.Mutex
	var gated []uint64
	done := make(chan uint64, 4)
	submit := func(room uint64) {
		require.NoError(t, pool.Submit(Job{Room: room, First: true, Writes: []Write{{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 0, Dst: uint32(room), Len: 1}}, AuxSrc: -1, State: -1, Notif: fmt.Sprint(room)}},
			Gate: func(*Write) bool { mu.Lock(); gated = append(gated, room); mu.Unlock(); return true },
			Done: func(*Write, error, bool) { done <- room }}))
	}
	submit(2)
	submit(3)
	require.Equal(t, []uint64{2}, locked(&mu, &gated), "one first write posted by Submit, the second left to the held worker")
	release()
	<-blocked
	got := map[uint64]bool{}
	for range 2 {
		select {
		case r := <-done:
			got[r] = true
		case <-time.After(10 * time.Second):
			t.Fatal("writes did not complete")
		}
	}
	require.Equal(t, map[uint64]bool{2: true, 3: true}, got)
	submit(4) // room 2's write is final, settled: the bound is free again
	require.Equal(t, []uint64{2, 3, 4}, locked(&mu, &gated), "room 4's first write posted by Submit")
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("room 4's write did not complete")
	}
	// A first write refused at its gate, or failing before its post,
	// gives its place in the bound back at once.
	var dropped atomic.Int32
	require.NoError(t, pool.Submit(Job{Room: 5, First: true, Writes: []Write{{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 0, Dst: 5, Len: 1}}, AuxSrc: -1, State: -1, Notif: "5"}},
		Gate: func(*Write) bool { return false }, Dropped: func(*Write) { dropped.Add(1) }}))
	require.EqualValues(t, 1, dropped.Load(), "refused at its gate, by Submit")
	failed := make(chan error, 1)
	require.NoError(t, pool.Submit(Job{Room: 6, First: true, Writes: []Write{{Remote: "no-such-agent", Peer: d.layout, Runs: []Run{{Src: 0, Dst: 6, Len: 1}}, AuxSrc: -1, State: -1, Notif: "6"}},
		Gate: func(*Write) bool { return true }, Done: func(_ *Write, err error, _ bool) { failed <- err }}))
	require.Error(t, <-failed, "a write to an unknown agent fails before its post")
	submit(7)
	require.Equal(t, []uint64{2, 3, 4, 7}, locked(&mu, &gated), "room 7's first write posted by Submit: the bound was given back")
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("room 7's write did not complete")
	}
}

// TestPoolFirstCompletedBeforeTaken: the completion of a first write
// Submit posted can reach its worker before the job does; the worker
// keeps it until it takes the job, then settles the write once — its
// Done called, the bound freed — with the room still holding the job's
// rest, which the worker then posts. Stepped by hand (no worker goroutine
// reads this worker's queue), so the order is the test's, not the
// scheduler's.
func TestPoolFirstCompletedBeforeTaken(t *testing.T) {
	p, d, remote, pool, wk := handWorker(t, "te", Config{Workers: 1, RoomInFlight: 1})
	var calls []string
	j := Job{Room: 5, First: true, Writes: []Write{
		{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 1, Dst: 2, Len: 1}}, AuxSrc: -1, State: -1, Notif: "5a"},
		{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 3, Dst: 4, Len: 1}}, AuxSrc: -1, State: -1, Notif: "5b"}},
		Gate: func(w *Write) bool { calls = append(calls, "gate "+w.Notif); return true },
		Done: func(w *Write, err error, _ bool) { calls = append(calls, fmt.Sprint("done ", w.Notif, " ", err)) }}
	require.True(t, pool.postFirst(&j, 0))
	require.Len(t, j.ahead, 1, "one posted by Submit (RoomInFlight 1)")
	require.Len(t, j.Writes, 1, "one left for the worker")
	next := func() *nixl.Xfer {
		t.Helper()
		select {
		case x := <-wk.done:
			return x
		case <-time.After(10 * time.Second):
			t.Fatal("a write did not complete")
			return nil
		}
	}
	wk.complete(next()) // before its job: kept
	require.Equal(t, []string{"gate 5a"}, calls, "not settled before its job is taken")
	require.Equal(t, int32(1), pool.ahead[0].Load())
	wk.submit(j)
	require.Equal(t, []string{"gate 5a", "done 5a <nil>"}, calls, "settled once, when its job was taken")
	require.Zero(t, pool.ahead[0].Load(), "the bound freed")
	require.Contains(t, wk.rooms, uint64(5), "the room kept, with its rest")
	wk.post(false)
	wk.complete(next())
	require.Equal(t, []string{"gate 5a", "done 5a <nil>", "gate 5b", "done 5b <nil>"}, calls, "the rest posted by the worker, after")
	require.Empty(t, wk.rooms, "the room forgotten")
	require.Empty(t, wk.flights)
	require.Empty(t, wk.early)
	require.Equal(t, p.kv[0][64:128], d.kv[0][128:192], "page 1 → 2")
	require.Equal(t, p.kv[0][192:256], d.kv[0][256:320], "page 3 → 4")
}

// TestPoolFirstHeldApart: first writes Submit posted, once the worker
// holds them, count against FirstInFlight, not InFlight: the worker's own
// writes (another room's, not First) are posted beside them, so a burst of
// fresh rooms never starves the rooms queued on the worker. Stepped by
// hand: the held write's completion waits unread on the worker's channel.
func TestPoolFirstHeldApart(t *testing.T) {
	_, d, remote, pool, wk := handWorker(t, "th", Config{Workers: 1, InFlight: 1})
	var gated []string
	job := func(room uint64, first bool) Job {
		return Job{Room: room, First: first, Writes: []Write{{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 1, Dst: uint32(room), Len: 1}}, AuxSrc: -1, State: -1, Notif: fmt.Sprint(room)}},
			Gate: func(w *Write) bool { gated = append(gated, w.Notif); return true },
			Done: func(*Write, error, bool) {}}
	}
	a := job(5, true)
	require.True(t, pool.postFirst(&a, 0))
	wk.submit(a) // held, its completion not read yet
	wk.submit(job(6, false))
	wk.post(false)
	require.Equal(t, []string{"5", "6"}, gated, "room 6's write posted beside the held first write (InFlight 1)")
	for range 2 {
		select {
		case x := <-wk.done:
			wk.complete(x)
		case <-time.After(10 * time.Second):
			t.Fatal("writes did not complete")
		}
	}
	require.Empty(t, wk.flights)
	require.Zero(t, wk.held)
	require.Zero(t, pool.ahead[0].Load())
}

// TestPoolJobsInSeqOrder: a room's write jobs are taken in Seq order
// whatever order they were submitted in — the control loop submits the
// chunks kept before the REQUEST, the application those it sends after,
// and either may come first —, a job that came early kept until those
// before it came; the first (Seq 0, First) still posted by Submit.
func TestPoolJobsInSeqOrder(t *testing.T) {
	p, d := newRank(t, "ts-prefill", 1, 8, 64), newRank(t, "ts-decode", 1, 8, 64)
	remote := connect(t, p, d)
	pool, err := NewPool(p.agent, p.layout, Config{Workers: 1})
	require.NoError(t, err)
	defer pool.Close()
	release, blocked := blockWorker(t, pool, remote, d.layout)
	defer release()
	var mu sync.Mutex
	var gated, finished []string
	done := make(chan struct{}, 4)
	job := func(seq int, notif string) Job {
		return Job{Room: 8, Seq: seq, First: seq == 0,
			Writes: []Write{{Remote: remote, Peer: d.layout, Runs: []Run{{Src: uint32(seq), Dst: uint32(seq), Len: 1}}, AuxSrc: -1, State: -1, Notif: notif}},
			Gate:   func(w *Write) bool { mu.Lock(); gated = append(gated, w.Notif); mu.Unlock(); return true },
			Done: func(w *Write, err error, _ bool) {
				assert.NoError(t, err)
				mu.Lock()
				finished = append(finished, w.Notif)
				mu.Unlock()
				done <- struct{}{}
			}}
	}
	require.NoError(t, pool.Submit(job(2, "8c")))
	require.NoError(t, pool.Submit(job(1, "8b")))
	require.NoError(t, pool.Submit(job(0, "8a")))
	require.Equal(t, []string{"8a"}, locked(&mu, &gated), "the first posted by Submit")
	release()
	<-blocked
	for range 3 {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("writes did not complete")
		}
	}
	require.Equal(t, []string{"8a", "8b", "8c"}, locked(&mu, &gated), "gated in Seq order")
	require.Equal(t, []string{"8a", "8b", "8c"}, locked(&mu, &finished), "done in Seq order")
	// The room's writes all done, its worker forgets it, but not its
	// next Seq: a job after that and one after it, in the wrong order,
	// still go in Seq order (the second waits for the first).
	require.NoError(t, pool.Submit(job(4, "8e")))
	require.NoError(t, pool.Submit(job(3, "8d")))
	for range 2 {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the jobs after the room was forgotten did not complete")
		}
	}
	require.Equal(t, []string{"8a", "8b", "8c", "8d", "8e"}, locked(&mu, &finished), "done in Seq order after the room was forgotten")
}

// TestPoolLaterJobsAtClose: a job still waiting for an earlier one of its
// room when the pool closes (that one's Submit failed: the pool was
// closing) is taken then, so Close ends and every write is accounted for.
func TestPoolLaterJobsAtClose(t *testing.T) {
	p, d := newRank(t, "tc-prefill", 1, 8, 64), newRank(t, "tc-decode", 1, 8, 64)
	remote := connect(t, p, d)
	pool, err := NewPool(p.agent, p.layout, Config{Workers: 1})
	require.NoError(t, err)
	var accounted atomic.Int32
	require.NoError(t, pool.Submit(Job{Room: 9, Seq: 1, Writes: []Write{{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 0, Dst: 0, Len: 1}}, AuxSrc: -1, State: -1, Notif: "9b"}},
		Gate:    func(*Write) bool { return false }, // the room failed meanwhile
		Dropped: func(*Write) { accounted.Add(1) }}))
	closed := make(chan struct{})
	go func() { pool.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end: a job waiting for an earlier one held the worker")
	}
	require.EqualValues(t, 1, accounted.Load(), "its write met its gate")
}

// TestPoolSeqKeptWhenForgotten: a worker forgets a room whose writes are
// all done, but keeps its next Seq (unless it took its final write), so
// the room's next two jobs, submitted in the wrong order, still go in
// Seq order. Stepped by hand.
func TestPoolSeqKeptWhenForgotten(t *testing.T) {
	_, d, remote, _, wk := handWorker(t, "tk", Config{Workers: 1})
	var gated []string
	job := func(seq int, last bool) Job {
		return Job{Room: 4, Seq: seq, Writes: []Write{{Remote: remote, Peer: d.layout, Runs: []Run{{Src: uint32(seq), Dst: uint32(seq), Len: 1}}, AuxSrc: -1, State: -1, Notif: fmt.Sprint(seq), Last: last}},
			Gate: func(w *Write) bool { gated = append(gated, w.Notif); return true }, Done: func(*Write, error, bool) {}}
	}
	drain := func() {
		t.Helper()
		wk.post(false)
		for len(wk.flights) > 0 {
			select {
			case x := <-wk.done:
				wk.complete(x)
			case <-time.After(10 * time.Second):
				t.Fatal("a write did not complete")
			}
		}
	}
	wk.submit(job(0, false))
	drain()
	require.Empty(t, wk.rooms, "forgotten")
	require.Equal(t, 1, wk.seqs[4].next, "its next Seq kept")
	wk.submit(job(2, false))
	wk.post(false)
	require.Equal(t, []string{"0"}, gated, "Seq 2 waits for Seq 1")
	wk.submit(job(1, true))
	drain()
	require.Equal(t, []string{"0", "1", "2"}, gated)
	require.Empty(t, wk.rooms)
	require.NotContains(t, wk.seqs, uint64(4), "its final write taken: nothing kept")
}

// TestPoolSeqAfterFirstSettledAtOnce: a room whose first job Submit
// posted whole, its completion already in, is settled — and forgotten —
// the moment its worker takes the job; its next job still finds its
// place (the count moves before the take). Stepped by hand.
func TestPoolSeqAfterFirstSettledAtOnce(t *testing.T) {
	_, d, remote, pool, wk := handWorker(t, "tz", Config{Workers: 1})
	var gated []string
	job := func(seq int) Job {
		return Job{Room: 6, Seq: seq, First: seq == 0, Writes: []Write{{Remote: remote, Peer: d.layout, Runs: []Run{{Src: uint32(seq), Dst: uint32(seq), Len: 1}}, AuxSrc: -1, State: -1, Notif: fmt.Sprint(seq)}},
			Gate: func(w *Write) bool { gated = append(gated, w.Notif); return true }, Done: func(*Write, error, bool) {}}
	}
	first := job(0)
	require.True(t, pool.postFirst(&first, 0))
	require.Empty(t, first.Writes, "posted whole by Submit")
	select {
	case x := <-wk.done:
		wk.complete(x) // before its job: kept
	case <-time.After(10 * time.Second):
		t.Fatal("the first write did not complete")
	}
	wk.submit(first)
	require.Empty(t, wk.rooms, "settled and forgotten as it was taken")
	wk.submit(job(1))
	wk.post(false)
	require.Equal(t, []string{"0", "1"}, gated, "the next job taken, not kept waiting for itself")
	select {
	case x := <-wk.done:
		wk.complete(x)
	case <-time.After(10 * time.Second):
		t.Fatal("the second write did not complete")
	}
}

// TestPoolFirstNotificationAlone: a room's first job whose only write
// moves nothing (a notification alone: every page in the decode rank's
// prefix) is over once Submit sent it, yet still reaches its worker — it
// holds the room's place in the Seq order, and the room's next job is
// taken after it, not kept waiting for it.
func TestPoolFirstNotificationAlone(t *testing.T) {
	p, d := newRank(t, "tn-prefill", 1, 8, 64), newRank(t, "tn-decode", 1, 8, 64)
	remote := connect(t, p, d)
	pool, err := NewPool(p.agent, p.layout, Config{Workers: 1})
	require.NoError(t, err)
	defer pool.Close()
	done := make(chan string, 2)
	for seq, w := range []Write{
		{Remote: remote, Peer: d.layout, AuxSrc: -1, State: -1, Notif: "alone"},
		{Remote: remote, Peer: d.layout, Runs: []Run{{Src: 1, Dst: 1, Len: 1}}, AuxSrc: -1, State: -1, Notif: "next"},
	} {
		require.NoError(t, pool.Submit(Job{Room: 2, Seq: seq, First: seq == 0, Writes: []Write{w},
			Gate: func(*Write) bool { return true }, Done: func(w *Write, err error, _ bool) { assert.NoError(t, err); done <- w.Notif }}))
	}
	for _, want := range []string{"alone", "next"} {
		select {
		case got := <-done:
			require.Equal(t, want, got)
		case <-time.After(10 * time.Second):
			t.Fatalf("%q never done: the room's next job waits for a job its worker never saw", want)
		}
	}
}
