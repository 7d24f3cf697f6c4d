package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/discovery"
	"github.com/kvbridge/kvbridge/internal/etcdtest"
	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/rankhooks"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/require"
)

// Faults in a room with several prefill ranks (prefill TP 2 → decode TP 1,
// one process per rank, ucx over shared memory). The test binary runs as a
// rank with KVBRIDGE_E2E_TOPO=prefill|decode and KVBRIDGE_E2E_TP/_TP_RANK,
// driven by lines on stdin:
//
//	prefill: HOLD <room> <src pages> <chunk> → HELD <room> (first chunk landed), then DONE <room> <status> <reason>
//	decode:  RECV <room> <dst pages>          → REQUESTED <room>, DONE <room> <status> <reason>, RELEASED <room> forced=<n>
//	         ABORT <room>

const topoPages = 256

func init() {
	if role := os.Getenv("KVBRIDGE_E2E_TOPO"); role != "" {
		os.Exit(runTopoRank(role))
	}
}

func topoConfig(role kvmanager.Role, boot string, par transfer.Parallel) (kvmanager.Config, error) {
	m := kvmodel.Presets["tiny"]
	cfg := kvmanager.DefaultConfig(role)
	cfg.Auth = testauth.Auth()
	metered(&cfg)
	cfg.Instance = map[kvmanager.Role]string{kvmanager.RolePrefill: "topo-prefill", kvmanager.RoleDecode: "topo-decode"}[role]
	cfg.Compat, cfg.BootstrapURL = m.Compat(), boot
	cfg.Engine = engines["ucx-shm"]
	cfg.Parallel, cfg.Model = par, m.Mapping(transfer.NHD)
	var err error
	cfg.Layout, err = m.RankLayout(nixl.DRAM, transfer.NHD, par, topoPages, 16)
	cfg.HeartbeatInterval, cfg.MaxMisses, cfg.SweepInterval = 200*time.Millisecond, 2, 50*time.Millisecond
	cfg.Registry.StallTimeout, cfg.QuarantineTimeout = 2*time.Second, 3*time.Second
	cfg.Etcd.LeaseTTL = 2 * time.Second
	return cfg, err
}

func runTopoRank(role string) int {
	tp, _ := strconv.Atoi(os.Getenv("KVBRIDGE_E2E_TP"))
	rank, _ := strconv.Atoi(os.Getenv("KVBRIDGE_E2E_TP_RANK"))
	pp, _ := strconv.Atoi(os.Getenv("KVBRIDGE_E2E_PP"))
	r := kvmanager.RolePrefill
	if role == "decode" {
		r = kvmanager.RoleDecode
	}
	cfg, err := topoConfig(r, os.Getenv("KVBRIDGE_E2E_BOOT"), transfer.Parallel{TPSize: tp, TPRank: rank, PPSize: pp})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	m, p, d, err := newRank(r, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer m.Close()
	out := make(chan string, 64)
	go func() {
		for l := range out {
			fmt.Println(l)
		}
	}()
	fmt.Println("READY")
	rooms := map[uint64]*receiver.Receiver{}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		room, _ := strconv.ParseUint(f[1], 10, 64)
		switch f[0] {
		case "HOLD":
			src := pageList(f[2])
			chunk, _ := strconv.Atoi(f[3])
			go func() {
				s, err := sender.New(p, room)
				if err != nil {
					out <- fmt.Sprintf("DONE %d error %v", room, err)
					return
				}
				s.Init()
				if st, _ := s.WaitReady(context.Background()); st == kvmanager.WaitingForInput {
					if err := s.Send(src[:chunk], false, -1); err == nil {
						for s.Poll() != kvmanager.Transferring || m.InFlight(room) != 0 {
							time.Sleep(100 * time.Microsecond)
						}
						out <- fmt.Sprintf("HELD %d", room)
					}
				}
				st, _ := s.Wait(context.Background())
				out <- fmt.Sprintf("DONE %d %v %s", room, st, strings.ReplaceAll(s.Failure(), " ", "_"))
			}()
		case "RECV":
			dst := pageList(f[2])
			rc, err := receiver.NewFor(d, room, "", kvmanager.AutoDP)
			if err == nil {
				rooms[room] = rc
				err = rc.Init(context.Background(), kvmanager.RequestSpec{DstPages: dst, AuxIndex: -1})
			}
			if err != nil {
				out <- fmt.Sprintf("DONE %d error %v", room, err)
				continue
			}
			out <- fmt.Sprintf("REQUESTED %d", room)
			go func() {
				st, _ := rc.Wait(context.Background())
				out <- fmt.Sprintf("DONE %d %v %s", room, st, strings.ReplaceAll(rc.Failure(), " ", "_"))
				<-rc.Released()
				out <- fmt.Sprintf("RELEASED %d forced=%d", room, counter(m, "kvbridge_quarantine_expired_total"))
			}()
		case "ABORT":
			rooms[room].Abort("test: abort while several prefill ranks write")
		}
	}
	return 0
}

func startTopoRank(t *testing.T, role, boot string, tp, rank int) *rankProc {
	t.Helper()
	return startChild(t, "KVBRIDGE_E2E_TOPO="+role, "KVBRIDGE_E2E_BOOT="+boot,
		"KVBRIDGE_E2E_TP="+strconv.Itoa(tp), "KVBRIDGE_E2E_TP_RANK="+strconv.Itoa(rank))
}

// TestRefusedRoomFailsPrefill (issue 27): a decode rank that refuses a
// room because the rank mapping does not support the pair (prefill PP 1 →
// decode PP 2) told nobody, and every prefill room waited for its whole
// bootstrap deadline (300 s by default). It tells the instance's ranks
// (ABORT, code refused), which fail their rooms at once.
func TestRefusedRoomFailsPrefill(t *testing.T) {
	t.Parallel() // its own processes and ports
	boot := startBoot(t)
	p := startTopoRank(t, "prefill", boot, 1, 0)
	d := startChild(t, "KVBRIDGE_E2E_TOPO=decode", "KVBRIDGE_E2E_BOOT="+boot, "KVBRIDGE_E2E_PP=2")
	p.do("HOLD 1 " + csv([]uint32{0, 1, 2, 3}) + " 4") // the router created the room on prefill first
	start := time.Now()
	d.do("RECV 1 " + csv([]uint32{10, 11, 12, 13}))
	dgot := d.expect(t, "DONE 1")
	require.True(t, strings.Contains(dgot, "decode_PP_must_equal_prefill_PP") || strings.Contains(dgot, "decode PP must equal prefill PP"), "decode: %s", dgot)
	got := p.expect(t, "DONE 1")
	took := time.Since(start)
	t.Logf("prefill failed the refused room %v after the decode rank refused it: %s", took, got)
	require.True(t, strings.HasPrefix(got, "DONE 1 Failed"), "prefill: %s", got)
	require.Contains(t, got, "refused", "prefill")
	require.LessOrEqual(t, took, time.Second+bound, "took")
}

// twoToOne starts prefill TP 2 and decode TP 1, and a room whose first
// chunk has landed from both prefill ranks (both held mid-transfer).
func twoToOne(t *testing.T) (p0, p1, d *rankProc) {
	return twoToOneAt(t, startBoot(t))
}

func twoToOneAt(t *testing.T, boot string) (p0, p1, d *rankProc) {
	p0 = startTopoRank(t, "prefill", boot, 2, 0)
	p1 = startTopoRank(t, "prefill", boot, 2, 1)
	d = startTopoRank(t, "decode", boot, 1, 0)
	d.do("RECV 1 " + csv([]uint32{10, 11, 12, 13, 14, 15, 16, 17}))
	d.expect(t, "REQUESTED 1")
	p0.do("HOLD 1 " + csv([]uint32{0, 1, 2, 3, 4, 5, 6, 7}) + " 4")
	p1.do("HOLD 1 " + csv([]uint32{0, 1, 2, 3, 4, 5, 6, 7}) + " 4")
	p0.expect(t, "HELD 1")
	p1.expect(t, "HELD 1")
	return p0, p1, d
}

// TestTopologyPrefillRankKilled: one of a room's two prefill ranks is
// SIGKILLed mid-transfer. The decode room fails within the heartbeat bound
// (200 ms × 2 misses; the test's deadline is a deadlock guard), the
// surviving prefill rank gets the ABORT and fails its room, and the decode
// pages are released — by the quarantine deadline, since the dead rank can
// never acknowledge: nothing stays pinned.
func TestTopologyPrefillRankKilled(t *testing.T) {
	t.Parallel() // its own processes, ports and discovery: mostly waiting (kills, restarts, leases)
	p0, p1, d := twoToOne(t)
	killed := time.Now()
	p1.cmd.Process.Signal(syscall.SIGKILL)
	got := d.expect(t, "DONE 1")
	t.Logf("decode room failed %v after the kill: %s", time.Since(killed).Round(time.Millisecond), got)
	require.True(t, strings.HasPrefix(got, "DONE 1 Failed"), "decode: %s", got)
	require.Contains(t, got, "unreachable", "decode")
	got = p0.expect(t, "DONE 1")
	require.True(t, strings.HasPrefix(got, "DONE 1 Failed"), "surviving prefill rank: %s (want Failed by the decode rank's ABORT)", got)
	require.Contains(t, got, "abort", "surviving prefill rank: want Failed by the decode rank's ABORT")
	require.Equal(t, "RELEASED 1 forced=1", d.expect(t, "RELEASED 1"), "decode pages: want released by the quarantine deadline")
}

// TestTopologyAbortWhileSeveralWrite: the decode rank aborts a room while
// both prefill ranks are mid-transfer; both fail it, both acknowledge the
// abort as drained, and the pages are released by those ACKs (not forced).
func TestTopologyAbortWhileSeveralWrite(t *testing.T) {
	t.Parallel() // its own processes and ports
	p0, p1, d := twoToOne(t)
	d.do("ABORT 1")
	got := d.expect(t, "DONE 1")
	require.True(t, strings.HasPrefix(got, "DONE 1 Failed"), "decode: %s", got)
	for i, p := range []*rankProc{p0, p1} {
		got := p.expect(t, "DONE 1")
		require.True(t, strings.HasPrefix(got, "DONE 1 Failed"), "prefill rank %d: %s", i, got)
		require.Contains(t, got, "abort", "prefill rank %d", i)
	}
	require.Equal(t, "RELEASED 1 forced=0", d.expect(t, "RELEASED 1"), "decode pages: want released by both drained ACKs")
}

// loopbackRank starts an in-process rank of the topology tests on the
// loopback engine; mod adjusts its config.
func loopbackRank(t *testing.T, role kvmanager.Role, boot string, par transfer.Parallel, mod func(*kvmanager.Config)) (*kvmanager.Prefill, *kvmanager.Decode) {
	t.Helper()
	cfg, err := topoConfig(role, boot, par)
	require.NoError(t, err)
	cfg.Engine = engines["loopback"]
	if mod != nil {
		mod(&cfg)
	}
	_, p, d, err := newRank(role, cfg)
	require.NoError(t, err)
	if p != nil {
		t.Cleanup(func() { p.Close() })
	} else {
		t.Cleanup(func() { d.Close() })
	}
	return p, d
}

// TestCreateReceiverForRefusesUnsupportedTopology: a decode rank refuses a
// room from a prefill instance whose shape the rank mapping does not
// support, or whose model differs, with a reason naming the instance — it
// never registers (the prefill side refuses the same pairs at REGISTER:
// core.TestCheckRegisterTopology).
func TestCreateReceiverForRefusesUnsupportedTopology(t *testing.T) {
	boot := startBoot(t)
	pcfg, err := topoConfig(kvmanager.RolePrefill, boot, transfer.Parallel{})
	require.NoError(t, err)
	pcfg.Engine = engines["loopback"]
	p, err := kvmanager.NewPrefill(pcfg)
	require.NoError(t, err)
	defer p.Close()
	for _, tc := range []struct {
		name string
		mod  func(*kvmanager.Config)
		want string
	}{
		{"decode PP 2 from prefill PP 1", func(c *kvmanager.Config) {
			c.Parallel = transfer.Parallel{PPSize: 2}
			c.Layout, _ = kvmodel.Presets["tiny"].RankLayout(nixl.DRAM, transfer.NHD, c.Parallel, topoPages, 16)
		}, "prefill PP 1 → decode PP 2 (decode PP must equal prefill PP, or be 1)"},
		{"another page layout", func(c *kvmanager.Config) { c.Model.Layout = transfer.HND }, "PageLayout:NHD} with 16-token pages, this decode rank {Layers:2 KVHeads:2 HeadBytes:128 MLA:false PageLayout:HND}"},
		{"pages of a size that does not divide", func(c *kvmanager.Config) {
			m := kvmodel.Presets["tiny"]
			m.PageTokens = 12
			c.Model, c.PageTokens = m.Mapping(transfer.NHD), 12
			c.Layout, _ = m.RankLayout(nixl.DRAM, transfer.NHD, c.Parallel, topoPages, 16)
		}, "with 16-token pages, this decode rank {Layers:2 KVHeads:2 HeadBytes:128 MLA:false PageLayout:NHD} with 12 (the models must match; the page sizes may differ when one divides the other)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dcfg, _ := topoConfig(kvmanager.RoleDecode, boot, transfer.Parallel{})
			dcfg.Engine = engines["loopback"]
			tc.mod(&dcfg)
			d, err := kvmanager.NewDecode(dcfg)
			require.NoError(t, err)
			defer d.Close()
			_, err = receiver.NewFor(d, 1, "", kvmanager.AutoDP)
			require.ErrorContains(t, err, tc.want, "want an error naming the instance with %q", tc.want)
			require.ErrorContains(t, err, `"topo-prefill"`, "want an error naming the instance with %q", tc.want)
		})
	}
}

// TestDPGroupLookedUp: with DP attention the prefill instance's scheduler,
// not the room id, may pick the DP group; the group's first rank publishes
// it to the bootstrap server and the decode rank looks it up (LookupDP).
// Rooms are placed against room % dp, so the default rule would miss them.
func TestDPGroupLookedUp(t *testing.T) {
	boot := startBoot(t)
	var groups [2]*kvmanager.Prefill
	for dp := range groups {
		groups[dp], _ = loopbackRank(t, kvmanager.RolePrefill, boot, transfer.Parallel{DPSize: 2, DPRank: dp},
			func(c *kvmanager.Config) { c.PublishRoomDP = true })
	}
	_, d := loopbackRank(t, kvmanager.RoleDecode, boot, transfer.Parallel{}, nil)
	ctx := context.Background()
	for room := uint64(1); room <= 4; room++ {
		p := groups[(room+1)%2] // never room % 2
		s, err := sender.New(p, room)
		require.NoError(t, err)
		s.Init()
		r, err := receiver.NewFor(d, room, "", kvmanager.LookupDP)
		require.NoError(t, err)
		require.NoError(t, r.Init(ctx, kvmanager.RequestSpec{DstPages: []uint32{5, 6}, AuxIndex: -1}))
		st, err := s.WaitReady(ctx)
		require.Equal(t, kvmanager.WaitingForInput, st, "room %d: the published group got no REQUEST: %v", room, err)
		require.NoError(t, s.Send([]uint32{1, 2}, true, -1))
		st, err = r.Wait(ctx)
		require.Equal(t, kvmanager.Success, st, "room %d: %v %s", room, err, r.Failure())
		s.Clear()
		r.Clear()
	}
}

// TestEtcdPrefillRankKilled: with etcd discovery, a SIGKILLed prefill
// rank's record vanishes within its lease TTL (2 s here, seen by a watch)
// and the decode room bound to it fails; the surviving rank gets the ABORT.
func TestEtcdPrefillRankKilled(t *testing.T) {
	t.Parallel() // its own processes, ports and discovery: mostly waiting (kills, restarts, leases)
	srv, err := etcdtest.Start()
	require.NoError(t, err)
	defer srv.Close()
	target := "etcd://" + srv.Endpoint + "/topo-prefill"
	watcher, err := discovery.DialEtcd(target, bootstrap.EtcdConfig{})
	require.NoError(t, err)
	defer watcher.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := watcher.Watch(ctx)
	p0, p1, d := twoToOneAt(t, target)
	killed := time.Now()
	p1.cmd.Process.Signal(syscall.SIGKILL)
	got := d.expect(t, "DONE 1")
	require.True(t, strings.HasPrefix(got, "DONE 1 Failed"), "decode: %s", got)
	got = p0.expect(t, "DONE 1")
	require.True(t, strings.HasPrefix(got, "DONE 1 Failed"), "surviving prefill rank: %s", got)
	for {
		select {
		case ev := <-events:
			if ev.Deleted && ev.TP == 1 {
				t.Logf("the killed rank's record vanished %v after the kill (lease 2 s)", time.Since(killed).Round(10*time.Millisecond))
				return
			}
		case <-time.After(60 * time.Second):
			t.Fatal("the killed rank's record did not vanish")
		}
	}
}

// TestEtcdStoppedMidRun: etcd stops while a room is mid-transfer. The room
// finishes over the control and data paths already open; a room from an
// instance not yet discovered fails with an error naming the etcd endpoint
// (bounded by the bootstrap timeout); rooms from the known instance keep
// working from the cached topology and endpoints; once etcd is back the new
// instance is found. Nothing is left pinned.
func TestEtcdStoppedMidRun(t *testing.T) {
	t.Parallel() // its own processes, ports and discovery: mostly waiting (kills, restarts, leases)
	srv, err := etcdtest.Start()
	require.NoError(t, err)
	defer srv.Close()
	target := "etcd://" + srv.Endpoint + "/topo-prefill"
	pcfg, err := topoConfig(kvmanager.RolePrefill, target, transfer.Parallel{})
	require.NoError(t, err)
	// Stopping the embedded etcd takes seconds: the stall deadline must
	// not fire while it does.
	pcfg.Engine, pcfg.Registry.StallTimeout, pcfg.QuarantineTimeout = engines["loopback"], 30*time.Second, 40*time.Second
	p, err := kvmanager.NewPrefill(pcfg)
	require.NoError(t, err)
	defer p.Close()
	dcfg, _ := topoConfig(kvmanager.RoleDecode, target, transfer.Parallel{})
	dcfg.Engine, dcfg.Registry.StallTimeout, dcfg.QuarantineTimeout = engines["loopback"], 30*time.Second, 40*time.Second
	dcfg.Registry.BootstrapTimeout = 2 * time.Second
	d, err := kvmanager.NewDecode(dcfg)
	require.NoError(t, err)
	defer d.Close()
	ctx := context.Background()
	room := func(id uint64, boot string, dp int, stopMid bool) error {
		s, err := sender.New(p, id)
		if err != nil {
			return err
		}
		defer s.Clear()
		s.Init()
		r, err := receiver.NewFor(d, id, boot, dp)
		if err != nil {
			return err
		}
		defer r.Clear()
		if err := r.Init(ctx, kvmanager.RequestSpec{DstPages: []uint32{5, 6}, AuxIndex: -1}); err != nil {
			return err
		}
		if st, err := s.WaitReady(ctx); st != kvmanager.WaitingForInput {
			return fmt.Errorf("sender %v %v", st, err)
		}
		if err := s.Send([]uint32{1}, false, -1); err != nil {
			return err
		}
		if stopMid {
			srv.Stop()
		}
		if err := s.Send([]uint32{2}, true, -1); err != nil {
			return err
		}
		if st, _ := r.Wait(ctx); st != kvmanager.Success {
			return fmt.Errorf("room %d: %v: %s", id, st, r.Failure())
		}
		return nil
	}
	require.NoError(t, room(1, "", kvmanager.AutoDP, true), "a room mid-transfer when etcd stopped")
	require.NoError(t, room(2, "", kvmanager.AutoDP, false), "a room of the known instance with etcd down")
	other := "etcd://" + srv.Endpoint + "/another-instance"
	_, err = receiver.NewFor(d, 3, other, kvmanager.AutoDP)
	require.ErrorContains(t, err, "etcd "+srv.Endpoint, "a room of an undiscovered instance with etcd down")
	require.NoError(t, srv.Restart())
	// The new instance appears once etcd is back.
	p2cfg, _ := topoConfig(kvmanager.RolePrefill, other, transfer.Parallel{})
	p2cfg.Engine, p2cfg.Instance, p2cfg.Registry.StallTimeout, p2cfg.QuarantineTimeout = engines["loopback"], "another-instance", 30*time.Second, 40*time.Second
	p2, err := kvmanager.NewPrefill(p2cfg)
	require.NoError(t, err)
	defer p2.Close()
	_, err = receiver.NewFor(d, 4, other, kvmanager.AutoDP)
	require.NoError(t, err, "after etcd came back")
	d.Clear(4)
	require.Zero(t, counter(d.Manager, "kvbridge_rooms_past_deadline")+counter(p.Manager, "kvbridge_rooms_past_deadline"), "rooms overdue")
}

// TestInstanceChangesShape: a prefill instance is replaced by one of
// another TP size under the same name while a decode rank has its old
// topology cached. The decode rank's REGISTER says which shape it mapped
// onto, so a rank of the new instance refuses it (instead of writing half
// the heads into a room that would then succeed); the refusal drops the
// cached topology and the next room maps onto the new shape and succeeds.
// The old instance goes as a killed one would: its closing notice never
// reaches the decode rank (a test hook drops it; with it, the decode rank
// looks the rank up at once and may read the new shape before any room).
func TestInstanceChangesShape(t *testing.T) {
	boot := startBoot(t)
	prefill := func(par transfer.Parallel) *kvmanager.Prefill {
		p, _ := loopbackRank(t, kvmanager.RolePrefill, boot, par, nil)
		return p
	}
	_, d := loopbackRank(t, kvmanager.RoleDecode, boot, transfer.Parallel{}, func(cfg *kvmanager.Config) {
		rankhooks.Set(cfg, rankhooks.Hooks{Drop: func(m any) bool {
			st, ok := m.(*wire.Status)
			return ok && st.Code == "closed"
		}})
	})
	ctx := context.Background()
	room := func(id uint64, ps ...*kvmanager.Prefill) error {
		// The prefill ranks serve the room until the decode side is done
		// with it (a sender whose REQUEST never comes is cancelled then).
		sctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		defer func() { stop(); wg.Wait() }()
		for _, p := range ps {
			s, err := sender.New(p, id)
			if err != nil {
				return err
			}
			s.Init()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer s.Clear()
				if st, _ := s.WaitReady(sctx); st == kvmanager.WaitingForInput {
					s.Send([]uint32{1}, true, -1)
					s.Wait(sctx)
				}
			}()
		}
		r, err := receiver.New(d, id)
		if err != nil {
			return err
		}
		defer r.Clear()
		if err := r.Init(ctx, kvmanager.RequestSpec{DstPages: []uint32{5}, AuxIndex: -1}); err != nil {
			return err
		}
		if st, _ := r.Wait(ctx); st != kvmanager.Success {
			return fmt.Errorf("room %d: %v: %s", id, st, r.Failure())
		}
		return nil
	}
	old := prefill(transfer.Parallel{})
	require.NoError(t, room(1, old))
	old.Close() // deletes its record (its notice dropped); the instance comes back at TP 2
	a, b := prefill(transfer.Parallel{TPSize: 2}), prefill(transfer.Parallel{TPSize: 2, TPRank: 1})
	// The cached endpoint is dead: heartbeats fail that room.
	require.ErrorContains(t, room(2, a, b), "unreachable", "room 2 (old endpoint)")
	// Looked up again, rank 0 of the new instance refuses the stale mapping.
	err := room(3, a, b)
	require.ErrorIs(t, err, kvmanager.ErrIncompatible, "room 3 (stale topology)")
	require.ErrorContains(t, err, "view of the instance is stale", "room 3 (stale topology)")
	require.NoError(t, room(4, a, b), "room 4 (topology read again)")
}
