package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/discovery"
	"github.com/kvbridge/kvbridge/internal/etcdtest"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Restarts of real rank processes on a new endpoint (issue 20): a pod
// restart brings the rank back on another port while its bootstrap record
// still names the dead process for the rest of its lease.

// testLease is the bootstrap server's lease in these tests: a restarted
// prefill process gets its record back within it.
const testLease = 2 * time.Second

// restartBound is how long a survivor may take to reach a restarted rank:
// the lease, the REGISTER retries before a lookup (0.5 + 1 + 2 + 4 s at
// the default RegisterRetry), heartbeats, and scheduling slack on a busy
// two-core machine.
const restartBound = testLease + 8*time.Second + bound

// onRestartEngines runs a restart test on the ucx engine and on a real
// NIXL (libnixl-real: skipped without KVBRIDGE_NIXL_LIB; make test-nixl
// runs it): the restart handling is the core's, but a rank must also
// survive its peer's death on every engine.
func onRestartEngines(t *testing.T, body func(t *testing.T, engine string)) {
	for _, engine := range []string{"ucx-tcp", "libnixl-real"} {
		t.Run(engine, func(t *testing.T) {
			if engine == "libnixl-real" {
				needRealNIXL(t)
			}
			body(t, engine)
		})
	}
}

func startBootLease(t *testing.T, lease time.Duration) string {
	t.Helper()
	srv, err := bootstrap.NewServer(bootstrap.ServerConfig{Token: testauth.Auth().BootstrapToken(), LeaseTTL: lease})
	require.NoError(t, err)
	require.NoError(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { srv.Close(context.Background()) })
	return srv.URL()
}

// kill sends SIGKILL and waits until the process is gone.
func (p *rankProc) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	for range p.lines { // stdout closes once the process is gone
	}
}

// runRoom moves one room through decode and prefill and checks both sides.
func runRoom(t *testing.T, decode, prefill *rankProc, room uint64, src, dst []uint32) {
	t.Helper()
	decode.do(fmt.Sprintf("RECV %d %s %s", room, csv(dst), csv(src)))
	prefill.do(fmt.Sprintf("SEND %d %s 16", room, csv(src)))
	require.Equal(t, fmt.Sprintf("DONE %d Success verified", room), decode.expect(t, fmt.Sprintf("DONE %d", room)), "decode")
	got := prefill.expect(t, fmt.Sprintf("DONE %d", room))
	require.True(t, strings.HasPrefix(got, fmt.Sprintf("DONE %d Success", room)), "prefill: %s", got)
}

// Case 1: a decode rank whose first room needs a prefill rank inside the
// dead process's lease looked up the dead endpoint and retried its
// REGISTER there forever ("waiting for the prefill ranks' REGISTER_ACK").
// It must look the rank up again and reach the new process.
func TestFirstRoomAfterPrefillRestartElsewhere(t *testing.T) {
	t.Parallel() // its own processes, ports and discovery: mostly waiting (kills, restarts, leases)
	onRestartEngines(t, func(t *testing.T, engine string) {
		boot := startBootLease(t, testLease)
		startRank(t, "prefill", engine, boot).kill(t)
		decode := startRank(t, "decode", engine, boot)
		src, dst := newPagePool(pages).Get(32), newPagePool(pages).Get(32)
		// The lookup this starts finds the dead process's record.
		decode.do(fmt.Sprintf("RECV 1 %s %s", csv(dst), csv(src)))
		prefill := startRank(t, "prefill", engine, boot) // a new port, once the lease lapsed
		restarted := time.Now()
		prefill.do(fmt.Sprintf("SEND 1 %s 16", csv(src)))
		require.Equal(t, "DONE 1 Success verified", decode.expect(t, "DONE 1"), "decode")
		took := time.Since(restarted)
		t.Logf("the room succeeded %v after the new prefill process started", took)
		require.LessOrEqual(t, took, restartBound, "took, bound")
		prefill.expect(t, "DONE 1 Success")
	})
}

// Case 2: a decode room aborted while its prefill rank restarts elsewhere,
// before heartbeats notice, sent its ABORT to the old endpoint only; the
// new process's room then waited for its own bootstrap deadline (the
// seed's silent pin, through discovery). The ABORT must reach the new
// process too.
func TestAbortReachesPrefillRestartedElsewhere(t *testing.T) {
	t.Parallel() // its own processes, ports and discovery: mostly waiting (kills, restarts, leases)
	onRestartEngines(t, func(t *testing.T, engine string) {
		boot := startBootLease(t, testLease)
		old := startRank(t, "prefill", engine, boot)
		decode := startRank(t, "decode", engine, boot)
		pp, dp := newPagePool(pages), newPagePool(pages)
		runRoom(t, decode, old, 1, pp.Get(8), dp.Get(8)) // registered with the old process
		src, dst := pp.Get(32), dp.Get(32)
		// The kill and the ABORT come once the room's REQUEST is out: an
		// ABORT that came before the decode created the room would be a
		// tombstone there, with no prefill rank to tell.
		decode.do(fmt.Sprintf("RECV+ 2 %s %s", csv(dst), csv(src)))
		decode.expect(t, "REQUESTED 2")
		old.kill(t)
		decode.do("ABORT 2") // before heartbeats report the old process dead
		dgot := decode.expect(t, "DONE 2")
		require.True(t, strings.HasPrefix(dgot, "DONE 2 Failed"), "decode: %s", dgot)
		prefill := startRank(t, "prefill", engine, boot)
		restarted := time.Now()
		prefill.do(fmt.Sprintf("SEND 2 %s 16", csv(src))) // the router's retry lands on the new process
		got := prefill.expect(t, "DONE 2")
		took := time.Since(restarted)
		t.Logf("the new process's room ended %v after it started: %s", took, got)
		require.True(t, strings.HasPrefix(got, "DONE 2 Failed"), "prefill: %s", got)
		require.Contains(t, got, "aborted", "prefill")
		require.LessOrEqual(t, took, restartBound, "took, bound")
	})
}

// Case 3: the first room after a prefill rank restarted elsewhere, from a
// decode rank that had registered with the old process, must succeed.
func TestRoomAfterPrefillRestartElsewhere(t *testing.T) {
	t.Parallel() // its own processes and ports
	onRestartEngines(t, func(t *testing.T, engine string) {
		boot := startBootLease(t, testLease)
		old := startRank(t, "prefill", engine, boot)
		decode := startRank(t, "decode", engine, boot)
		pp, dp := newPagePool(pages), newPagePool(pages)
		runRoom(t, decode, old, 1, pp.Get(8), dp.Get(8))
		old.kill(t)
		prefill := startRank(t, "prefill", engine, boot)
		runRoom(t, decode, prefill, 2, pp.Get(32), dp.Get(32))
	})
}

// Case 3c: a prefill process that closes its rank (its application's
// SIGTERM path: Close, then a drain before it exits) and a new process of
// the rank started elsewhere. The decode rank's probe is off
// (KVBRIDGE_E2E_PROBE_IDLE=-1s), so only the closing notice (docs/
// PROTOCOL.md "A rank that closes") can keep the next room from the closed
// process: before it, that room's REQUEST went there unanswered and the
// room failed at the heartbeat bound (found by a fault hunt). On ucx-tcp
// and, where installed, a real NIXL.
func TestRoomAfterPrefillClosedAndRestartedElsewhere(t *testing.T) {
	t.Parallel() // its own processes and ports
	onRestartEngines(t, func(t *testing.T, engine string) {
		boot := startBootLease(t, testLease)
		env := func(role string) []string {
			return []string{"KVBRIDGE_E2E_ROLE=" + role, "KVBRIDGE_E2E_ENGINE=" + engine, "KVBRIDGE_E2E_BOOT=" + boot, "KVBRIDGE_E2E_PROBE_IDLE=-1s"}
		}
		old := startChild(t, env("prefill")...)
		decode := startChild(t, env("decode")...)
		pp, dp := newPagePool(pages), newPagePool(pages)
		runRoom(t, decode, old, 1, pp.Get(8), dp.Get(8)) // registered with the old process
		old.do("CLOSE 0")
		require.Equal(t, "CLOSED <nil>", old.expect(t, "CLOSED"))
		prefill := startChild(t, env("prefill")...) // a new port; the old process still runs, closed
		runRoom(t, decode, prefill, 2, pp.Get(32), dp.Get(32))
	})
}

// Case 3b: a room posted right after its prefill rank was killed and
// started again on a new port — inside the heartbeat bound, with the
// default heartbeat (5 s), so neither heartbeats nor the idle re-check
// (15 s) have noticed — failed: its REQUEST went to the dead process, the
// decode side learned at its heartbeat bound and the new process's room
// waited for it. The decode rank probes a process it has not heard from
// within ProbeIdle (a PING before the REQUEST), finds it gone, looks the
// rank up and registers with the new process: the room succeeds. Over the
// HTTP bootstrap server (found by the probe) and over etcd (its watch).
// KVBRIDGE_E2E_PROBE_IDLE=-1s turns the probe off: the room then fails.
// On ucx-tcp and, where installed, a real NIXL.
func TestRoomPostedRightAfterPrefillRestartElsewhere(t *testing.T) {
	t.Parallel() // its own processes, ports and discovery: mostly waiting (kills, restarts, leases)
	onRestartEngines(t, func(t *testing.T, engine string) {
		roomPostedRightAfterPrefillRestartElsewhere(t, engine)
	})
}

func roomPostedRightAfterPrefillRestartElsewhere(t *testing.T, engine string) {
	for _, disc := range []string{"http", "etcd"} {
		t.Run(disc, func(t *testing.T) {
			boot := ""
			if disc == "http" {
				boot = startBootLease(t, testLease)
			} else {
				srv, err := etcdtest.Start()
				require.NoError(t, err)
				t.Cleanup(srv.Close)
				boot = "etcd://" + srv.Endpoint + "/proc"
			}
			env := func(role string) []string {
				e := []string{"KVBRIDGE_E2E_ROLE=" + role, "KVBRIDGE_E2E_ENGINE=" + engine, "KVBRIDGE_E2E_BOOT=" + boot, "KVBRIDGE_E2E_HEARTBEAT=5s"}
				if v := os.Getenv("KVBRIDGE_E2E_PROBE_IDLE"); v != "" {
					e = append(e, "KVBRIDGE_E2E_PROBE_IDLE="+v)
				}
				return e
			}
			old := startChild(t, env("prefill")...)
			decode := startChild(t, env("decode")...)
			pp, dp := newPagePool(pages), newPagePool(pages)
			runRoom(t, decode, old, 1, pp.Get(8), dp.Get(8)) // registered with the old process
			old.kill(t)
			prefill := startChild(t, env("prefill")...) // a new port, its record once the old lease lapsed
			posted := time.Now()
			src, dst := pp.Get(32), dp.Get(32)
			decode.do(fmt.Sprintf("RECV 2 %s %s", csv(dst), csv(src)))
			prefill.do(fmt.Sprintf("SEND 2 %s 16", csv(src)))
			got := decode.expect(t, "DONE 2")
			took := time.Since(posted)
			t.Logf("the room posted right after the restart ended %v later: %s", took, got)
			require.Equal(t, "DONE 2 Success verified", got, "decode: the room went to the dead process")
			got = prefill.expect(t, "DONE 2")
			require.True(t, strings.HasPrefix(got, "DONE 2 Success"), "prefill: %s", got)
		})
	}
}

// Case 4: a decode process paused (SIGSTOP) longer than the heartbeat
// bound; both prefill ranks failed their rooms, but the decode rank kept
// them Transferring until their stall deadline once it resumed. The
// prefill rank tells the peer it declared dead, so the resumed decode
// rank settles the room from that.
func TestPausedDecodeLearnsItsRoomsFailed(t *testing.T) {
	t.Parallel() // its own processes and ports
	onRestartEngines(t, func(t *testing.T, engine string) {
		boot := startBoot(t)
		prefill := startRank(t, "prefill", engine, boot)
		decode := startRank(t, "decode", engine, boot)
		src, dst := newPagePool(pages).Get(256), newPagePool(pages).Get(256)
		decode.do(fmt.Sprintf("RECV 3 %s %s", csv(dst), csv(src)))
		prefill.do(fmt.Sprintf("HOLD 3 %s 16", csv(src)))
		prefill.expect(t, "HELD 3")
		decode.cmd.Process.Signal(syscall.SIGSTOP)
		got := prefill.expect(t, "DONE 3") // heartbeats declared the decode rank dead
		failedUnreachable := strings.HasPrefix(got, "DONE 3 Failed") && strings.Contains(got, "unreachable")
		if !failedUnreachable {
			decode.cmd.Process.Signal(syscall.SIGCONT)
		}
		require.True(t, failedUnreachable, "prefill: %s", got)
		decode.cmd.Process.Signal(syscall.SIGCONT)
		resumed := time.Now()
		got = decode.expect(t, "DONE 3")
		took := time.Since(resumed)
		t.Logf("the resumed decode rank failed the room %v after SIGCONT: %s", took, got)
		require.True(t, strings.HasPrefix(got, "DONE 3 Failed"), "decode: %s (want the prefill rank's report, not a deadline)", got)
		require.Contains(t, got, "unreachable", "decode: want the prefill rank's report, not a deadline")
		require.LessOrEqual(t, took, bound, "took, bound (the stall deadline is %v)", rankConfig(0, "", "").Registry.StallTimeout)
	})
}

// Case 5: in etcd mode a prefill rank never restored its own record after
// someone else deleted it, put garbage there (its renewal spun on a failing
// transaction) or put another endpoint's record; rooms recovered only when
// the record was written back by hand. A real prefill process must put its
// record back at its next renewal (a third of its 2 s lease).
func TestEtcdPrefillRestoresItsRecord(t *testing.T) {
	t.Parallel() // its own processes, ports and discovery: mostly waiting (kills, restarts, leases)
	srv, err := etcdtest.Start()
	require.NoError(t, err)
	defer srv.Close()
	target := "etcd://" + srv.Endpoint + "/topo-prefill"
	startTopoRank(t, "prefill", target, 1, 0)
	watcher, err := discovery.DialEtcd(target, bootstrap.EtcdConfig{})
	require.NoError(t, err)
	defer watcher.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	mine, err := watcher.Rank(ctx, 0, 0, 0)
	require.NoError(t, err)
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}})
	require.NoError(t, err)
	defer raw.Close()
	events := watcher.Watch(ctx)
	key := "/kvbridge/topo-prefill/ranks/0/0/0"
	good, err := raw.Get(ctx, key)
	require.NoError(t, err, "the rank's record: %v", good)
	require.Len(t, good.Kvs, 1, "the rank's record: %v", good)
	other := strings.Replace(string(good.Kvs[0].Value), mine.Endpoint, "tcp://127.0.0.1:9", 1)
	for _, damage := range []struct {
		name string
		do   func() error
	}{
		{"deleted", func() error { _, err := raw.Delete(ctx, key); return err }},
		{"garbage", func() error { _, err := raw.Put(ctx, key, "{not json"); return err }},
		{"another endpoint", func() error { _, err := raw.Put(ctx, key, other); return err }},
	} {
		require.NoError(t, damage.do())
		at := time.Now()
		for restored := false; !restored; {
			select {
			case ev := <-events:
				restored = !ev.Deleted && ev.TP == 0 && ev.Endpoint == mine.Endpoint
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: the rank did not restore its record within 10 s", damage.name)
			}
		}
		t.Logf("%s: record restored %v later", damage.name, time.Since(at).Round(time.Millisecond))
	}
}
