package e2e

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/rankhooks"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/require"
)

// Cluster-scale settings: a heartbeat interval short enough that a run
// holds many, and a miss bound wide enough that 64 ranks on two cores are
// never declared dead while the rooms run.
const (
	clusterBeat   = 250 * time.Millisecond
	clusterMisses = 8
	clusterIdle   = 2 * time.Second // the idle window a rank's background CPU is measured over
	clusterFlight = 4               // rooms in flight per decode rank
)

// BenchmarkCluster: N prefill × M decode ranks in this process, each its
// own Manager with its own control loop (real ZeroMQ sockets on loopback,
// authenticated), the loopback engine, and one HTTP bootstrap server per
// prefill instance. Each decode rank runs zero-payload rooms (as
// BenchmarkControlRooms: a dummy REQUEST, a chunk with no data) against
// every prefill rank in turn, clusterFlight at a time, driven by one
// polling goroutine for the whole cluster (PollRooms on every rank per
// iteration, no goroutine per room). The ranks idle for clusterIdle, then
// a warm-up room on every pair (REGISTER, sockets, engine connections)
// right before the measured rooms:
//
//   - idle-cpu-ms/s/rank: the CPU the ranks spend with no room in flight
//     (their timers: sweeps, backlog retries), per rank per second, over
//     clusterIdle;
//   - rooms/s and cpu-µs/room over b.N rooms (at least 2 per pair): the
//     whole process's CPU (every rank, server and the driver, whose
//     iterations poll all N + M ranks), and net-cpu-µs/room, the same
//     less the idle CPU at its rate;
//   - ctl-msgs/room: the ranks' control messages per room, PING and PONG
//     excluded; ping-msgs/room and hb-msgs/rank/beat: the PINGs and PONGs
//     (counted as received) per room, and per rank per heartbeat interval,
//     while the rooms run — heartbeats (a rank heartbeats only the peers it
//     shares a live room with) and the probe a decode rank sends before a
//     REQUEST to a prefill rank it has not heard from lately;
//   - rechecks/room: REQUESTs that waited for a registration looked up
//     and made again, the prefill rank not heard from for longer than
//     the heartbeat bound (RecheckIdle);
//   - heap-B/rank and rss-B/rank: what a rank costs started (the Go heap
//     after a GC, and the resident set, before and after the ranks start,
//     over N + M); heap-B/pair and rss-B/pair: what connecting a pair
//     costs (before and after the warm-up, over N × M pairs: the peer
//     tables, sockets and engine connections of both ends, and the
//     warm-up rooms' tombstones), from the first run in the process
//     (run each size in a process of its own: KVBRIDGE_CLUSTER=NxM).
//
// Sizes: KVBRIDGE_CLUSTER="1x1,4x4,8x8,16x16,32x32" (the default).
func BenchmarkCluster(b *testing.B) {
	sizes := os.Getenv("KVBRIDGE_CLUSTER")
	if sizes == "" {
		sizes = "1x1,4x4,8x8,16x16,32x32"
	}
	for _, sz := range strings.Split(sizes, ",") {
		n, m, ok := strings.Cut(sz, "x")
		np, err1 := strconv.Atoi(n)
		nd, err2 := strconv.Atoi(m)
		require.True(b, ok && err1 == nil && err2 == nil && np >= 1 && nd >= 1, "KVBRIDGE_CLUSTER: %q is not NxM", sz)
		b.Run(fmt.Sprintf("%dx%d", np, nd), func(b *testing.B) { runCluster(b, np, nd) })
	}
}

type rankCluster struct {
	servers  []*bootstrap.Server
	prefills []*kvmanager.Prefill
	decodes  []*kvmanager.Decode
	next     uint64        // the next room id: room ids are the deployment's
	beats    atomic.Uint64 // PINGs and PONGs received by every rank
}

func newRankCluster(b *testing.B, np, nd int) *rankCluster {
	c := &rankCluster{next: 100}
	id := uniq()
	mk := func(role kvmanager.Role, name, boot string) kvmanager.Config {
		cfg := kvmanager.DefaultConfig(role)
		cfg.Auth = testauth.Auth()
		metered(&cfg)
		cfg.Instance = name
		cfg.Compat = "v1:llama3-8b"
		cfg.BootstrapURL = boot
		cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
		cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: 1024, AuxItemBytes: auxItem, Aux: nixl.Desc{Len: auxItem * 16},
			Regions: []nixl.Desc{{Len: 16 * 1024}, {Len: 16 * 1024}}}
		cfg.WarmMemory = false
		cfg.Workers = 1
		cfg.HeartbeatInterval, cfg.MaxMisses = clusterBeat, clusterMisses
		cfg.Registry.MaxPendingPerPeer = 1 << 12
		rankhooks.Set(&cfg, rankhooks.Hooks{ControlTap: func(frames [][]byte) {
			if len(frames) > 1 && (string(frames[1]) == "PING" || string(frames[1]) == "PONG") {
				c.beats.Add(1)
			}
		}})
		return cfg
	}
	for i := 0; i < np; i++ {
		srv := testauth.Server()
		require.NoError(b, srv.Start("127.0.0.1:0"))
		b.Cleanup(func() { srv.Close(context.Background()) })
		c.servers = append(c.servers, srv)
		p, err := kvmanager.NewPrefill(mk(kvmanager.RolePrefill, fmt.Sprintf("cluster-%d-p%d", id, i), srv.URL()))
		require.NoError(b, err)
		b.Cleanup(func() { p.Close() })
		c.prefills = append(c.prefills, p)
	}
	for j := 0; j < nd; j++ {
		d, err := kvmanager.NewDecode(mk(kvmanager.RoleDecode, fmt.Sprintf("cluster-%d-d%d", id, j), c.servers[0].URL()))
		require.NoError(b, err)
		b.Cleanup(func() { d.Close() })
		c.decodes = append(c.decodes, d)
	}
	return c
}

// sum adds f over every rank, prefill and decode.
func (c *rankCluster) sum(f func(*kvmanager.Manager) uint64) uint64 {
	var n uint64
	for _, p := range c.prefills {
		n += f(p.Manager)
	}
	for _, d := range c.decodes {
		n += f(d.Manager)
	}
	return n
}

// sent sums the messages every rank handed to ZeroMQ.
func (c *rankCluster) sent() uint64 {
	return c.sum(func(m *kvmanager.Manager) uint64 { return controlStats(m).Sent })
}

// dead sums the peers every rank's heartbeats declared dead.
func (c *rankCluster) dead() uint64 {
	return c.sum(func(m *kvmanager.Manager) uint64 { return controlStats(m).PeersDead })
}

// rechecks sums the idle registrations looked up and registered again
// before a REQUEST (a decode rank's count; a prefill rank's is 0).
func (c *rankCluster) rechecks() uint64 {
	return c.sum(func(m *kvmanager.Manager) uint64 { return counter(m, "kvbridge_registration_rechecks_total") })
}

// clusterRoom is one room in flight: decode rank j, prefill rank i; dAt
// and pAt are its places in this iteration's poll of each.
type clusterRoom struct {
	id       uint64
	i, j     int
	r        *receiver.Receiver
	s        *sender.Sender
	sent     bool
	dAt, pAt int
}

// run moves perDecode rooms through each decode rank, clusterFlight at a
// time per rank; a decode rank's k-th room goes to prefill rank
// (j + k) mod N, so every pair is used once N rooms of a rank ran.
func (c *rankCluster) run(b *testing.B, perDecode int) {
	np, nd := len(c.prefills), len(c.decodes)
	started, inflight, done := make([]int, nd), make([]int, nd), 0
	var live []*clusterRoom
	dIDs, dSt := make([][]uint64, nd), make([][]kvmanager.Poll, nd)
	pIDs, pSt := make([][]uint64, np), make([][]kvmanager.Poll, np)
	for done < perDecode*nd {
		for j := range c.decodes {
			for inflight[j] < clusterFlight && started[j] < perDecode {
				i := (j + started[j]) % np
				cr := &clusterRoom{id: c.next, i: i, j: j}
				c.next++
				var err error
				if cr.r, err = receiver.NewFor(c.decodes[j], cr.id, c.servers[i].URL(), kvmanager.AutoDP); err != nil {
					b.Fatal(err)
				}
				if cr.s, err = sender.New(c.prefills[i], cr.id); err != nil {
					b.Fatal(err)
				}
				if err := cr.s.Init(); err != nil {
					b.Fatal(err)
				}
				if err := cr.r.Init(context.Background(), kvmanager.RequestSpec{AuxIndex: -1, Dummy: true}); err != nil {
					b.Fatal(err)
				}
				live = append(live, cr)
				started[j]++
				inflight[j]++
			}
		}
		for j := range dIDs {
			dIDs[j] = dIDs[j][:0]
		}
		for i := range pIDs {
			pIDs[i] = pIDs[i][:0]
		}
		for _, cr := range live {
			cr.dAt, cr.pAt = len(dIDs[cr.j]), len(pIDs[cr.i])
			dIDs[cr.j] = append(dIDs[cr.j], cr.id)
			pIDs[cr.i] = append(pIDs[cr.i], cr.id)
		}
		for j, d := range c.decodes {
			dSt[j] = slices.Grow(dSt[j][:0], len(dIDs[j]))[:len(dIDs[j])]
			d.PollRooms(dIDs[j], dSt[j])
		}
		for i, p := range c.prefills {
			pSt[i] = slices.Grow(pSt[i][:0], len(pIDs[i]))[:len(pIDs[i])]
			p.PollRooms(pIDs[i], pSt[i])
		}
		progressed, keep := false, 0
		for _, cr := range live {
			dst, src := dSt[cr.j][cr.dAt], pSt[cr.i][cr.pAt]
			switch {
			case dst == kvmanager.Failed || src == kvmanager.Failed:
				b.Fatalf("room %d (prefill %d, decode %d): decode %v %s, prefill %v %s", cr.id, cr.i, cr.j, dst, cr.r.Failure(), src, cr.s.Failure())
			case !cr.sent && src == kvmanager.WaitingForInput:
				if err := cr.s.Send(nil, true, -1); err != nil {
					b.Fatal(err)
				}
				cr.sent, progressed = true, true
			case dst == kvmanager.Success && src == kvmanager.Success:
				cr.r.Clear()
				cr.s.Clear()
				inflight[cr.j]--
				done++
				progressed = true
				continue
			}
			live[keep] = cr
			keep++
		}
		clear(live[keep:])
		live = live[:keep]
		if !progressed {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// procMemory is the Go heap in use after a GC, and the resident set,
// once the heap stops shrinking.
func procMemory(b *testing.B) (heap, rss uint64) {
	var ms runtime.MemStats
	for try := 0; try < 50; try++ {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		if try > 0 && ms.HeapAlloc+64<<10 >= heap {
			break
		}
		heap = ms.HeapAlloc
		time.Sleep(20 * time.Millisecond) // polled: nothing signals the last of them
	}
	heap = ms.HeapAlloc
	f, err := os.ReadFile("/proc/self/statm")
	require.NoError(b, err)
	fields := strings.Fields(string(f))
	pages, err := strconv.ParseUint(fields[1], 10, 64)
	require.NoError(b, err)
	return heap, pages * uint64(os.Getpagesize())
}

// clusterMem holds each size's memory figures from the benchmark's first
// run in this process (the b.N = 1 run the testing package makes first,
// with no earlier cluster's memory still being let go): heap and RSS per
// rank, per pair.
var clusterMem = map[string][4]float64{}

func runCluster(b *testing.B, np, nd int) {
	pairs, ranks := float64(np*nd), float64(np+nd)
	heap0, rss0 := procMemory(b)
	c := newRankCluster(b, np, nd)
	heapR, rssR := procMemory(b)

	// The ranks' background cost, no room in flight.
	m := cpuMeter(b)
	time.Sleep(clusterIdle)                             // the window idle CPU is measured over, not a synchronisation
	idle := float64(cpuOf(b, m)) / float64(clusterIdle) // CPU seconds per second

	c.run(b, np) // warm-up: every pair once, right before the measured rooms
	heap1, rss1 := procMemory(b)
	key := fmt.Sprintf("%dx%d", np, nd)
	if _, ok := clusterMem[key]; !ok {
		clusterMem[key] = [4]float64{(float64(heapR) - float64(heap0)) / ranks, (float64(rssR) - float64(rss0)) / ranks,
			(float64(heap1) - float64(heapR)) / pairs, (float64(rss1) - float64(rssR)) / pairs}
	}
	mem := clusterMem[key]

	perDecode := max(2*np, (b.N+nd-1)/nd)
	rooms := float64(perDecode * nd)
	sent0, beats0, re0 := c.sent(), c.beats.Load(), c.rechecks()
	m = cpuMeter(b)
	start := time.Now()
	b.ResetTimer()
	c.run(b, perDecode)
	el := time.Since(start)
	b.StopTimer()
	cpu := cpuOf(b, m)
	beats := float64(c.beats.Load() - beats0)
	require.Zero(b, c.dead(), "peers declared dead: the heartbeat bound is too tight for this machine")
	b.ReportMetric(float64(el.Nanoseconds())/rooms, "ns/op") // per room: a run moves at least 2 per pair, not b.N
	b.ReportMetric(rooms/el.Seconds(), "rooms/s")
	b.ReportMetric(float64(cpu.Microseconds())/rooms, "cpu-µs/room")
	b.ReportMetric((float64(cpu.Microseconds())-idle*float64(el.Microseconds()))/rooms, "net-cpu-µs/room")
	b.ReportMetric(idle*1e3/ranks, "idle-cpu-ms/s/rank")
	b.ReportMetric((float64(c.sent()-sent0)-beats)/rooms, "ctl-msgs/room")
	b.ReportMetric(beats/rooms, "ping-msgs/room")
	b.ReportMetric(float64(c.rechecks()-re0)/rooms, "rechecks/room")
	b.ReportMetric(beats/ranks/(el.Seconds()/clusterBeat.Seconds()), "hb-msgs/rank/beat")
	b.ReportMetric(mem[0], "heap-B/rank")
	b.ReportMetric(mem[1], "rss-B/rank")
	b.ReportMetric(mem[2], "heap-B/pair")
	b.ReportMetric(mem[3], "rss-B/pair")
}
