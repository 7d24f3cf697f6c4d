package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/cpustat"
	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/rankhooks"
	"github.com/kvbridge/kvbridge/internal/rawagent"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/require"
)

// Llama-3-8B-shaped KV: 32 layers × K/V, 8 KV heads × 128, bf16, 16-token
// pages = 32 KiB per page per region.
const (
	llamaLayers = 32
	llamaPage   = 16 * 8 * 128 * 2
	llamaPages  = 1024
)

type benchCluster struct {
	srv          *bootstrap.Server
	prefill      *kvmanager.Prefill
	decode       *kvmanager.Decode
	pFree, dFree *kvmodel.Pages
	traces       traceTab
	// early: the prefill application hands each room's chunks over right
	// after Init, before the decode rank's REQUEST is sent (docs/PROTOCOL.md
	// "Chunks handed over early"), as an engine whose KV is computed
	// before the decode rank asks.
	early bool
}

// appReady is the benchmark's own trace point: the application saw the
// prefill room WaitingForInput (WaitReady returned, or its poll said so)
// and hands over its chunk.
const appReady rankhooks.Event = 200

// firstKept: the events of which a room's trace keeps the first (its
// first bytes landed, its first chunk handed to and taken by the pool).
func firstKept(ev rankhooks.Event) bool {
	return ev == rankhooks.Landed || ev == rankhooks.Submitted || ev == rankhooks.Taken || ev == rankhooks.Woken
}

// mark records an application-side trace point of the room.
func (c *benchCluster) mark(room uint64, ev rankhooks.Event) {
	c.traces.record(room, ev, time.Now(), false)
}

func newBenchCluster(b *testing.B, layers, pagesPer int, page uint64, mut ...func(*kvmanager.Config)) *benchCluster {
	c := &benchCluster{srv: testauth.Server(), pFree: newPagePool(pagesPer), dFree: newPagePool(pagesPer)}
	require.NoError(b, c.srv.Start("127.0.0.1:0"))
	b.Cleanup(func() { c.srv.Close(context.Background()) })
	trace := func(room uint64, ev rankhooks.Event, at time.Time) {
		c.traces.record(room, ev, at, firstKept(ev)) // a room's first Landed: its first bytes
	}
	id := uniq()
	mk := func(role kvmanager.Role) kvmanager.Config {
		cfg := kvmanager.DefaultConfig(role)
		cfg.Auth = testauth.Auth()
		cfg.Instance = fmt.Sprintf("bench-%d", id)
		cfg.Compat = "v1:llama3-8b"
		cfg.BootstrapURL = c.srv.URL()
		cfg.Engine = nixl.Config{Engine: nixl.EngineUCX, UCX: shm}
		cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: page, AuxItemBytes: auxItem, Aux: nixl.Desc{Len: auxItem * 4096}}
		for i := 0; i < 2*layers; i++ {
			cfg.Layout.Regions = append(cfg.Layout.Regions, nixl.Desc{Len: uint64(pagesPer) * page})
		}
		rankhooks.Set(&cfg, rankhooks.Hooks{Trace: trace})
		cfg.WarmMemory = true // as the example ranks: page faults at start-up, not in the figures
		for _, f := range mut {
			f(&cfg)
		}
		metered(&cfg)
		return cfg
	}
	var err error
	c.prefill, err = kvmanager.NewPrefill(mk(kvmanager.RolePrefill))
	require.NoError(b, err)
	b.Cleanup(func() { c.prefill.Close() })
	c.decode, err = kvmanager.NewDecode(mk(kvmanager.RoleDecode))
	require.NoError(b, err)
	b.Cleanup(func() { c.decode.Close() })
	return c
}

// oneRoom moves one request of tokens through the cluster.
// oneRoom returns the room's time once its pages were held (admission
// excluded).
func (c *benchCluster) oneRoom(b *testing.B, id uint64, tokens int, pageTokens int) time.Duration {
	n := (tokens + pageTokens - 1) / pageTokens
	var src, dst []uint32
	for {
		// Both sides' pages or neither: holding one side's while waiting
		// for the other's deadlocks two long requests.
		if src = c.pFree.Get(n); src != nil {
			if dst = c.dFree.Get(n); dst != nil {
				break
			}
			c.pFree.Put(src)
		}
		time.Sleep(10 * time.Microsecond)
	}
	defer c.pFree.Put(src)
	defer c.dFree.Put(dst)
	start := time.Now()
	r, err := receiver.New(c.decode, id)
	if err != nil {
		b.Fatal(err)
	}
	s, err := sender.New(c.prefill, id)
	if err != nil {
		b.Fatal(err)
	}
	s.Init()
	send := func() {
		for i := 0; i < len(src); i += 128 {
			end := min(i+128, len(src))
			if err := s.Send(src[i:end], end == len(src), int(id%4096)); err != nil {
				b.Fatal(err)
			}
		}
	}
	if c.early {
		send()
	}
	if err := r.Init(context.Background(), kvmanager.RequestSpec{DstPages: dst, AuxIndex: int(id % 4096)}); err != nil {
		b.Fatal(err)
	}
	if !c.early {
		if st, err := s.WaitReady(context.Background()); st != kvmanager.WaitingForInput {
			b.Fatalf("room %d: %v %v", id, st, err)
		}
		c.mark(id, appReady)
		send()
	}
	if st, err := r.Wait(context.Background()); st != kvmanager.Success {
		b.Fatalf("room %d: %v %v %s", id, st, err, r.Failure())
	}
	if st, _ := s.Wait(context.Background()); st != kvmanager.Success {
		b.Fatalf("room %d prefill: %v", id, st)
	}
	el := time.Since(start)
	s.Clear()
	r.Clear()
	return el
}

// cpuMeter starts measuring this process's CPU (every rank of these
// clusters is in it); cpuOf reads it.
func cpuMeter(b *testing.B) *cpustat.Meter {
	m, err := cpustat.Start(0)
	require.NoError(b, err)
	return m
}

func cpuOf(b *testing.B, m *cpustat.Meter) time.Duration {
	r, err := m.Read()
	require.NoError(b, err)
	return r.Total()
}

// reportCPU reports CPU per GB over bytes and per room over rooms
// (issue 24: the cost of each figure).
func reportCPU(b *testing.B, cpu time.Duration, bytes float64, rooms int) {
	if bytes > 0 {
		b.ReportMetric(cpustat.PerGB(cpu, bytes), "cpu-s/GB")
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(max(rooms, 1)), "cpu-µs/room")
}

// bulkGBps measures the engine's write bandwidth between the same two
// agents: streams goroutines at once, each writing descs descriptors of
// size/descs bytes (region i to region i, contiguous), iters times. It
// returns GB/s and CPU s/GB. It writes to the decode agent the prefill
// rank loaded at its REGISTER, under the name it loaded it: loading the
// metadata again would replace the rank's own connection, and the first
// room measured after it would pay for a new one.
func (c *benchCluster) bulkGBps(b *testing.B, size uint64, descs, streams, iters int) (float64, float64) {
	a := rawagent.Of(c.prefill)
	remote := c.decode.Config().Engine.Name
	src, dst := c.prefill.Config().Layout.Regions, c.decode.Config().Layout.Regions
	each := size / uint64(descs)
	var wg sync.WaitGroup
	m := cpuMeter(b)
	start := time.Now()
	for s := 0; s < streams; s++ {
		var ls, rs []nixl.Desc
		idx := make([]int, descs)
		off := uint64(s) * each % (src[0].Len - each + 1)
		for i := 0; i < descs; i++ {
			ls = append(ls, nixl.Desc{Addr: src[i%len(src)].Addr + uintptr(off), Len: each})
			rs = append(rs, nixl.Desc{Addr: dst[i%len(dst)].Addr + uintptr(off), Len: each})
			idx[i] = i
		}
		l, err := a.PrepLocal(nixl.DRAM, ls)
		if err != nil {
			b.Fatal(err)
		}
		defer l.Release()
		r, err := a.PrepRemote(remote, nixl.DRAM, rs)
		if err != nil {
			b.Fatalf("the decode agent as the prefill rank loaded it (%s): %v", remote, err)
		}
		defer r.Release()
		x, err := a.NewXfer(nixl.Write, l, idx, r, idx, []byte("bulk"))
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer a.Release(x)
			for i := 0; i < iters; i++ {
				if err := a.Post(x); err != nil {
					b.Error(err)
					return
				}
				if st, err := a.Wait(context.Background(), x); st != nixl.Done || err != nil {
					b.Errorf("bulk write ended %v: %v", st, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	bytes := float64(size) * float64(streams) * float64(iters)
	return bytes / time.Since(start).Seconds() / 1e9, cpustat.PerGB(cpuOf(b, m), bytes)
}

// BenchmarkEndToEnd: Llama-3-8B-shaped requests over ucx shared memory,
// sequential and sustained, each next to the engine's bulk write bandwidth
// measured between the same agents in the same run.
func BenchmarkEndToEnd(b *testing.B) {
	c := newBenchCluster(b, llamaLayers, llamaPages, llamaPage)
	c.oneRoom(b, 1, 16, 16) // connect
	room := uint64(10)
	perRoom := func(tokens int) float64 {
		return float64((tokens+15)/16) * llamaPage * 2 * llamaLayers
	}
	// Each case next to a bulk write of the same bytes per request (one
	// contiguous descriptor per region), at the same concurrency.
	for _, tokens := range []int{128, 4096, 8192} {
		b.Run(fmt.Sprintf("sequential-%dtok-random", tokens), func(b *testing.B) {
			// The same parallelism as a room: oneRoom sends chunks of 128
			// pages, and the pool posts up to RoomInFlight (2) of a
			// room's writes at once.
			chunks := ((tokens+15)/16 + 127) / 128
			par := min(chunks, 2)
			bulk, bulkCPU := c.bulkGBps(b, uint64(perRoom(tokens))/uint64(par), 2*llamaLayers, par, 10)
			m := cpuMeter(b)
			start := time.Now()
			for i := 0; i < b.N; i++ {
				room++
				c.oneRoom(b, room, tokens, 16)
			}
			el := time.Since(start)
			cpu := cpuOf(b, m)
			gbps := perRoom(tokens) * float64(b.N) / el.Seconds() / 1e9
			b.ReportMetric(float64(el.Microseconds())/float64(b.N), "µs/request")
			b.ReportMetric(gbps, "GB/s")
			b.ReportMetric(bulk, "bulk-GB/s")
			b.ReportMetric(gbps/bulk, "ratio")
			reportCPU(b, cpu, perRoom(tokens)*float64(b.N), b.N)
			b.ReportMetric(bulkCPU, "bulk-cpu-s/GB")
			b.ReportMetric(cpustat.PerGB(cpu, perRoom(tokens)*float64(b.N))/bulkCPU, "cpu-ratio")
		})
	}
	b.Run("sustained-8streams-2048tok", func(b *testing.B) {
		const streams, tokens = 8, 2048
		bulk, bulkCPU := c.bulkGBps(b, uint64(perRoom(tokens)), 2*llamaLayers, streams, 5)
		var wg sync.WaitGroup
		var next sync.Mutex
		m := cpuMeter(b)
		start := time.Now()
		for s := 0; s < streams; s++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := s; i < b.N; i += streams {
					next.Lock()
					room++
					id := room
					next.Unlock()
					c.oneRoom(b, id, tokens, 16)
				}
			}()
		}
		wg.Wait()
		el := time.Since(start)
		cpu := cpuOf(b, m)
		gbps := perRoom(tokens) * float64(b.N) / el.Seconds() / 1e9
		b.ReportMetric(gbps, "GB/s")
		b.ReportMetric(bulk, "bulk-GB/s")
		b.ReportMetric(gbps/bulk, "ratio")
		reportCPU(b, cpu, perRoom(tokens)*float64(b.N), b.N)
		b.ReportMetric(bulkCPU, "bulk-cpu-s/GB")
		b.ReportMetric(cpustat.PerGB(cpu, perRoom(tokens)*float64(b.N))/bulkCPU, "cpu-ratio")
	})
}

// BenchmarkMix: 128-token requests' latency alone (8 in flight), then in a
// mix where one request in ten is an 8,192-token one: a long request must
// not hold the short ones back (p99 of the short ones in the mix against
// their p50 alone). Latency from the moment a request holds its pages
// (the page pool's admission is the harness's, not kvbridge's).
func BenchmarkMix(b *testing.B) {
	c := newBenchCluster(b, llamaLayers, llamaPages, llamaPage)
	c.oneRoom(b, 1, 16, 16)
	var room uint64 = 10
	var mu sync.Mutex
	run := func(n int, tokens func(i int) int) []time.Duration {
		var lat []time.Duration
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for i := 0; i < n; i++ {
			sem <- struct{}{}
			wg.Add(1)
			mu.Lock()
			room++
			id := room
			mu.Unlock()
			go func(i int) {
				defer wg.Done()
				defer func() { <-sem }()
				el := c.oneRoom(b, id, tokens(i), 16)
				if tokens(i) == 128 {
					mu.Lock()
					lat = append(lat, el)
					mu.Unlock()
				}
			}(i)
		}
		wg.Wait()
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		return lat
	}
	pct := func(v []time.Duration, p float64) float64 {
		return float64(v[min(len(v)-1, int(p*float64(len(v))))].Microseconds()) / 1e3
	}
	b.ResetTimer()
	m := cpuMeter(b)
	alone := run(b.N, func(int) int { return 128 })
	aloneCPU := cpuOf(b, m)
	mixed := run(b.N, func(i int) int {
		if i%10 == 9 {
			return 8192
		}
		return 128
	})
	mixCPU := cpuOf(b, m) - aloneCPU
	b.StopTimer()
	short := float64((128+15)/16) * llamaPage * 2 * llamaLayers
	long := float64(8192/16) * llamaPage * 2 * llamaLayers
	b.ReportMetric(cpustat.PerGB(aloneCPU, short*float64(b.N)), "alone-cpu-s/GB")
	b.ReportMetric(cpustat.PerGB(mixCPU, short*float64(b.N-b.N/10)+long*float64(b.N/10)), "mix-cpu-s/GB")
	b.ReportMetric(float64(aloneCPU.Microseconds())/float64(b.N), "alone-cpu-µs/room")
	b.ReportMetric(pct(alone, 0.5), "alone-p50-ms")
	b.ReportMetric(pct(mixed, 0.5), "mix-p50-ms")
	b.ReportMetric(pct(mixed, 0.99), "mix-p99-ms")
	b.ReportMetric(pct(mixed, 0.99)/pct(alone, 0.5), "mix-p99/alone-p50")
}

// BenchmarkControlOverhead: REQUEST arrival → first write posted (prefill)
// and last notification → Success (decode), p50 over many 128-token rooms
// with 1 to 1,000 of them in flight at once (small pages, loopback ucx shm).
//
// "goroutines" runs each room on a goroutine of its own (WaitReady, Send,
// Wait); "poll" runs them all from one scheduler goroutine polling both
// ranks (PollRooms), as an engine's loop does. The "-early" drives hand
// each room's chunk over before its REQUEST is sent (docs/PROTOCOL.md
// "Chunks handed over early"): the first post is then the control loop's,
// in the REQUEST's step, with no application reaction in between.
func BenchmarkControlOverhead(b *testing.B) {
	for _, drive := range []string{"goroutines", "poll", "goroutines-early", "poll-early"} {
		for _, inflight := range []int{1, 10, 100, 1000} {
			b.Run(fmt.Sprintf("%s/%d-concurrent", drive, inflight), func(b *testing.B) { controlOverheadRun(b, drive, inflight) })
		}
	}
}

// BenchmarkFirstPostPool: REQUEST → first post at 1,000 rooms in flight
// (as BenchmarkControlOverhead's goroutines/1000-concurrent and
// poll/1000-concurrent) with the transfer pool sized otherwise: more
// workers, or more writes in flight each (issue 52, item 2: where the
// first post waits).
func BenchmarkFirstPostPool(b *testing.B) {
	for _, drive := range []string{"goroutines", "poll"} {
		for _, pc := range []struct {
			name              string
			workers, inflight int
		}{{"workers-4-inflight-8", 4, 8}, {"workers-16-inflight-8", 16, 8}, {"workers-4-inflight-64", 4, 64}} {
			b.Run(drive+"/"+pc.name, func(b *testing.B) {
				controlOverheadRun(b, drive, 1000, func(cfg *kvmanager.Config) { cfg.Workers, cfg.InFlight = pc.workers, pc.inflight })
			})
		}
	}
}

// controlOverheadRun is one level of BenchmarkControlOverhead.
func controlOverheadRun(b *testing.B, drive string, inflight int, mut ...func(*kvmanager.Config)) {
	c := newBenchCluster(b, 4, 16384, 1024, mut...)
	c.oneRoom(b, 1, 16, 16)
	c.traces.reset()
	drive, c.early = strings.CutSuffix(drive, "-early")
	m := cpuMeter(b)
	start := time.Now()
	if drive == "poll" {
		c.pollRooms(b, b.N, inflight, 128/16)
	} else {
		var wg sync.WaitGroup
		sem := make(chan struct{}, inflight)
		for i := 0; i < b.N; i++ {
			sem <- struct{}{}
			wg.Add(1)
			go func(id uint64) {
				defer wg.Done()
				defer func() { <-sem }()
				c.oneRoom(b, id, 128, 16)
			}(uint64(100 + i))
		}
		wg.Wait()
	}
	pace := time.Since(start) / time.Duration(b.N) // a room's share of the run
	// Per room: both ranks' control path and 64 KiB of data (8
	// pages of 1 KiB in each of the 8 regions), so mostly control.
	reportCPU(b, cpuOf(b, m), 0, b.N)
	var a, d, whole, landed []time.Duration
	traces := c.traces.snapshot()
	for _, tr := range traces {
		r := tr[rankhooks.Request]
		if f := tr[rankhooks.FirstPost]; !r.IsZero() && !f.IsZero() {
			a = append(a, f.Sub(r))
		}
		if l := tr[rankhooks.Landed]; !r.IsZero() && !l.IsZero() {
			landed = append(landed, l.Sub(r))
		}
		if l, s := tr[rankhooks.LastNotif], tr[rankhooks.Success]; !l.IsZero() && !s.IsZero() {
			d = append(d, s.Sub(l))
		}
		if s := tr[rankhooks.Success]; !r.IsZero() && !s.IsZero() {
			whole = append(whole, s.Sub(r)) // what a change to the first post could hurt
		}
	}
	// REQUEST → first post, broken down (each room's first chunk): the
	// application's reaction (its goroutine woken, or its poll), the
	// hand-over to the pool, the wait in the worker's queue, and in its
	// turn for a slot (InFlight) until the post.
	stages := [4][]time.Duration{}
	for _, tr := range traces {
		pts := []time.Time{tr[rankhooks.Request], tr[appReady], tr[rankhooks.Submitted], tr[rankhooks.Taken], tr[rankhooks.FirstPost]}
		if slices.ContainsFunc(pts, time.Time.IsZero) {
			continue
		}
		for i := range stages {
			stages[i] = append(stages[i], pts[i+1].Sub(pts[i]))
		}
	}
	// The application's reaction, split: REQUEST → its ready waiters
	// released (kvbridge's: the REQUEST's step and its wake carried out)
	// and → WaitReady's return (its goroutine run, or its next poll); and
	// kvbridge's whole part of REQUEST → first post, per room: the wake's
	// and, from the application's Send, the first post's.
	var woken, reacted, part []time.Duration
	for _, tr := range traces {
		r, w, a, f := tr[rankhooks.Request], tr[rankhooks.Woken], tr[appReady], tr[rankhooks.FirstPost]
		if r.IsZero() || w.IsZero() || a.IsZero() || f.IsZero() {
			continue
		}
		woken, reacted = append(woken, w.Sub(r)), append(reacted, a.Sub(w))
		part = append(part, w.Sub(r)+f.Sub(a))
	}
	b.ReportMetric(p50(woken), "µs-request-to-woken-p50")
	b.ReportMetric(pctl(woken, 0.99), "µs-request-to-woken-p99")
	b.ReportMetric(p50(reacted), "µs-woken-to-app-ready-p50")
	b.ReportMetric(pctl(reacted, 0.99), "µs-woken-to-app-ready-p99")
	b.ReportMetric(p50(part), "µs-kvbridge-part-p50")
	b.ReportMetric(pctl(part, 0.99), "µs-kvbridge-part-p99")
	// kvbridge's part once the application hands the chunk over: from its
	// Send to the room's first post (summed before the stages are sorted).
	var handed []time.Duration
	for i := range stages[1] {
		handed = append(handed, stages[1][i]+stages[2][i]+stages[3][i])
	}
	for i, name := range []string{"request-to-app-ready", "app-ready-to-submitted", "submitted-to-taken", "taken-to-first-post"} {
		b.ReportMetric(p50(stages[i]), "µs-"+name+"-p50")
		b.ReportMetric(pctl(stages[i], 0.99), "µs-"+name+"-p99")
	}
	b.ReportMetric(p50(handed), "µs-app-ready-to-first-post-p50")
	b.ReportMetric(pctl(handed, 0.99), "µs-app-ready-to-first-post-p99")
	b.ReportMetric(p50(a), "µs-request-to-first-post-p50")
	b.ReportMetric(pctl(a, 0.99), "µs-request-to-first-post-p99")
	b.ReportMetric(p50(d), "µs-last-notif-to-success-p50")
	b.ReportMetric(p50(whole), "µs-request-to-success-p50")
	b.ReportMetric(pctl(whole, 0.99), "µs-request-to-success-p99")
	// kvbridge's own overhead on the time to first token (issue 52): a
	// room's REQUEST to its first bytes landed at the decode rank, less
	// the engine alone landing the same bytes with the same number of
	// writes at once (bareLanded, after the rooms, in the same run); one
	// at a time, at the rooms' pace.
	b.StopTimer()
	require.Len(b, landed, b.N, "rooms with a REQUEST and a first landing traced")
	var gap time.Duration
	if inflight == 1 {
		gap = pace
	}
	bare := bareLanded(b, 4, 16384, 1024, 128/16, inflight, b.N, gap)
	lp50, lp99, bp50, bp99 := p50(landed), pctl(landed, 0.99), p50(bare), pctl(bare, 0.99)
	b.ReportMetric(lp50, "µs-request-to-landed-p50")
	b.ReportMetric(lp99, "µs-request-to-landed-p99")
	b.ReportMetric(bp50, "µs-bare-landed-p50")
	b.ReportMetric(bp99, "µs-bare-landed-p99")
	b.ReportMetric(lp50-bp50, "µs-overhead-p50")
	b.ReportMetric(lp99-bp99, "µs-overhead-p99")
}

func p50(v []time.Duration) float64 { return pctl(v, 0.5) }

// pctl is v's p-th quantile in µs (v is sorted in place).
func pctl(v []time.Duration, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	return float64(v[min(len(v)-1, int(p*float64(len(v))))].Nanoseconds()) / 1e3
}

// BenchmarkInFlight: how many rooms' writes a prefill worker keeps posted
// (kvmanager.Config.InFlight, pool.Config.InFlight), measured on the
// sustained case (8 streams of 2,048 tokens) and on the mix's short
// requests; the default comes from here.
func BenchmarkInFlight(b *testing.B) {
	for _, k := range []int{1, 2, 4, 8, 16} {
		b.Run(fmt.Sprintf("inflight-%d", k), func(b *testing.B) {
			c := newBenchCluster(b, llamaLayers, llamaPages, llamaPage, func(cfg *kvmanager.Config) { cfg.InFlight = k })
			c.oneRoom(b, 1, 16, 16)
			var room uint64 = 10
			var mu sync.Mutex
			var short []time.Duration
			var wg sync.WaitGroup
			sem := make(chan struct{}, 8)
			m := cpuMeter(b)
			start := time.Now()
			var moved float64
			for i := 0; i < b.N; i++ {
				tokens := 2048
				if i%10 != 9 {
					tokens = 128
				}
				moved += float64((tokens+15)/16) * llamaPage * 2 * llamaLayers
				sem <- struct{}{}
				wg.Add(1)
				mu.Lock()
				room++
				id := room
				mu.Unlock()
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					el := c.oneRoom(b, id, tokens, 16)
					if tokens == 128 {
						mu.Lock()
						short = append(short, el)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			el := time.Since(start)
			sort.Slice(short, func(i, j int) bool { return short[i] < short[j] })
			b.ReportMetric(moved/el.Seconds()/1e9, "GB/s")
			reportCPU(b, cpuOf(b, m), moved, b.N)
			b.ReportMetric(float64(short[len(short)/2].Microseconds())/1e3, "short-p50-ms")
			b.ReportMetric(float64(short[min(len(short)-1, len(short)*99/100)].Microseconds())/1e3, "short-p99-ms")
		})
	}
}
