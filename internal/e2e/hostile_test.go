package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvbridge/kvbridge/internal/control"
	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/internal/wire"
)

// Issue 49, 3 on real processes: a room is one decode instance's.

// procCounter is a rank process's metric, summed over the series the
// label pairs select (COUNTER).
func procCounter(t *testing.T, r *rankProc, name string, labels ...string) uint64 {
	t.Helper()
	r.do(strings.Join(append([]string{"COUNTER", "0", name}, labels...), " "))
	v, err := strconv.ParseUint(strings.TrimPrefix(r.expect(t, "COUNTER "), "COUNTER "), 10, 64)
	require.NoError(t, err)
	return v
}

// events is a rank process's count of core events of kind and outcome
// (kvbridge_registry_events_total).
func events(t *testing.T, r *rankProc, kind core.EventKind, o core.Outcome) uint64 {
	t.Helper()
	return procCounter(t, r, "kvbridge_registry_events_total", "event", kind.String(), "outcome", o.String())
}

// requestsHeld counts the REQUESTs a prefill rank process accepted (for a
// live room, or kept pending).
func requestsHeld(t *testing.T, r *rankProc) uint64 {
	t.Helper()
	return events(t, r, core.EventRequest, core.Applied) + events(t, r, core.EventRequest, core.Pending)
}

// TestRoomAskedForBySecondInstance: a prefill rank process, a decode rank
// process of instance "proc" (the genuine one) and one of instance
// "attacker", each with its own certificate (per-rank identity), both
// registered and served. The genuine instance asks for room 5; once its
// REQUEST is in, the attacker — who read the id on the wire — asks for
// room 5 too. The prefill rank refuses it (the attacker's room fails,
// naming the instance that asked first), answers the ABORT that follows
// without touching the room, counts both, and then serves room 5 to the
// genuine instance byte-exact. Before issue 49 the attacker's REQUEST
// joined the room (a second decode rank of it), and its ABORT failed it.
func TestRoomAskedForBySecondInstance(t *testing.T) {
	t.Parallel() // its own processes and ports
	_, envs, _ := identityFiles(t,
		wire.From{Role: wire.RolePrefill, Instance: "proc", Rank: 0},
		wire.From{Role: wire.RoleDecode, Instance: "proc", Rank: 0},
		wire.From{Role: wire.RoleDecode, Instance: "attacker", Rank: 0})
	boot := startBoot(t)
	base := []string{"KVBRIDGE_E2E_ENGINE=ucx-tcp", "KVBRIDGE_E2E_BOOT=" + boot}
	prefill := startChild(t, append(append([]string{"KVBRIDGE_E2E_ROLE=prefill"}, base...), envs[0]...)...)
	genuine := startChild(t, append(append([]string{"KVBRIDGE_E2E_ROLE=decode"}, base...), envs[1]...)...)
	attacker := startChild(t, append(append([]string{"KVBRIDGE_E2E_ROLE=decode", "KVBRIDGE_E2E_INSTANCE=attacker"}, base...), envs[2]...)...)
	pp, gp, ap := newPagePool(pages), newPagePool(pages), newPagePool(pages)
	pdRoom(t, prefill, genuine, 1, pp, gp)  // both instances registered
	pdRoom(t, prefill, attacker, 2, pp, ap) // and served

	held := requestsHeld(t, prefill)
	src, dst, adst := pp.Get(64), gp.Get(64), ap.Get(64)
	genuine.do(fmt.Sprintf("RECV 5 %s %s", csv(dst), csv(src)))
	require.Eventually(t, func() bool { return requestsHeld(t, prefill) > held }, 30*time.Second, 10*time.Millisecond,
		"the genuine instance's REQUEST for room 5 never reached the prefill rank")

	attacker.do(fmt.Sprintf("RECV 5 %s %s", csv(adst), csv(src)))
	got := attacker.expect(t, "DONE")
	assert.True(t, strings.HasPrefix(got, "DONE 5 Failed"), "the attacker's room 5: %s", got)
	assert.Contains(t, got, `decode_instance_"proc"_asked_for_it_first`, "the refusal names the instance that asked first")
	require.Eventually(t, func() bool { return procCounter(t, prefill, "kvbridge_foreign_room_refused_total") >= 2 }, 30*time.Second, 10*time.Millisecond,
		"the attacker's REQUEST and the ABORT after its room failed, counted as refused")

	prefill.do(fmt.Sprintf("SEND 5 %s 16", csv(src)))
	assert.Equal(t, "DONE 5 Success verified", genuine.expect(t, "DONE"), "the genuine instance's room 5")
	assert.True(t, strings.HasPrefix(prefill.expect(t, "DONE"), "DONE 5 Success"))
	pdRoom(t, prefill, attacker, 6, pp, ap) // the attacker's own rooms still work
}

// peerOf is how a test's own control loop addresses rank process r (its
// READY line: endpoint and epoch) under certificate cert.
func peerOf(t *testing.T, r *rankProc, cert string) wire.Peer {
	t.Helper()
	f := strings.Fields(r.ready)
	require.Len(t, f, 3, "%q", r.ready)
	epoch, err := strconv.ParseUint(f[2], 10, 64)
	require.NoError(t, err)
	return wire.Peer{Endpoint: f[1], Cert: cert, Epoch: epoch}
}

// floodRanks starts a prefill rank process (with prefillEnv) and an honest
// decode rank process of instance "proc" over ucx-tcp, each with its own
// certificate, and a control loop of a decode rank of instance "attacker"
// with a certificate of its own, addressed at the prefill rank (to).
func floodRanks(t *testing.T, prefillEnv ...string) (prefill, genuine *rankProc, loop *control.Loop, to wire.Peer) {
	t.Helper()
	attackerID := wire.From{Role: wire.RoleDecode, Instance: "attacker", Rank: 0}
	_, envs, ids := identityFiles(t,
		wire.From{Role: wire.RolePrefill, Instance: "proc", Rank: 0},
		wire.From{Role: wire.RoleDecode, Instance: "proc", Rank: 0},
		attackerID)
	boot := startBoot(t)
	base := []string{"KVBRIDGE_E2E_ENGINE=ucx-tcp", "KVBRIDGE_E2E_BOOT=" + boot}
	prefill = startChild(t, append(append(append([]string{"KVBRIDGE_E2E_ROLE=prefill"}, prefillEnv...), base...), envs[0]...)...)
	genuine = startChild(t, append(append([]string{"KVBRIDGE_E2E_ROLE=decode"}, base...), envs[1]...)...)
	loop, err := control.NewLoop(control.LoopConfig{Identity: attackerID, Bind: "tcp://127.0.0.1:*",
		Auth: testauth.Auth(), RankIdentity: ids[2], Handler: func(wire.Message) {}})
	require.NoError(t, err)
	t.Cleanup(func() { loop.Close() })
	return prefill, genuine, loop, peerOf(t, prefill, string(ids[0].Cert.Raw()))
}

// TestAbortFloodDelaysNoOne (issue 49, 3): a decode rank with its own
// certificate floods a prefill rank process with ABORTs for rooms that
// are not its (as fast as its socket takes them) while an honest decode
// rank process runs rooms with the same prefill rank, heartbeats every
// 200 ms and a peer declared dead after 2 missed. Every honest room
// succeeds byte-exact, neither honest rank declares the other dead, and
// the flood reached the prefill rank (received or dropped from the
// flooder's own backlog, counted). Before issue 49 the prefill rank's
// receive goroutine handled every message before it read the next, so a
// PING waited behind the flood (18.8 s round trips under 100,000 ABORTs,
// measured from outside). The round trips are logged, not asserted.
func TestAbortFloodDelaysNoOne(t *testing.T) {
	t.Parallel() // its own processes and ports
	prefill, genuine, loop, to := floodRanks(t)
	pp, gp := newPagePool(pages), newPagePool(pages)
	pdRoom(t, prefill, genuine, 1, pp, gp) // registered, served

	pBefore, gBefore := prefill.stats(t), genuine.stats(t)
	stop, flooded := make(chan struct{}), make(chan int)
	go func() {
		n := 0
		defer func() { flooded <- n }()
		for ; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			// Rooms no one else uses: the ABORTs are the attacker's own
			// early aborts (tombstones, bounded), each one handled.
			if err := loop.Send(to, &wire.Abort{Room: 1<<40 + uint64(n), Reason: "flood"}); err != nil {
				return
			}
		}
	}()
	start := time.Now()
	const rooms = 20
	for id := uint64(100); id < 100+rooms; id++ {
		pdRoom(t, prefill, genuine, id, pp, gp) // Success, verified: else it fails the test
	}
	elapsed := time.Since(start)
	close(stop)
	sent := <-flooded
	pAfter, gAfter := prefill.stats(t), genuine.stats(t)
	reached := (pAfter.Received - pBefore.Received) + (pAfter.Backlogged - pBefore.Backlogged)
	// (ABORTs still in the flooder's socket or on the wire when it stops
	// reach the prefill rank after: waited for, up to the bound below.)
	for deadline := time.Now().Add(10 * time.Second); reached < uint64(rooms*100) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // polls the prefill process's counters
		pAfter = prefill.stats(t)
		reached = (pAfter.Received - pBefore.Received) + (pAfter.Backlogged - pBefore.Backlogged)
	}
	assert.Equal(t, pBefore.PeersDead, pAfter.PeersDead, "the prefill rank declared a peer dead during the flood")
	assert.Equal(t, gBefore.PeersDead, gAfter.PeersDead, "the honest decode rank declared the prefill rank dead during the flood")
	assert.GreaterOrEqual(t, reached, uint64(rooms*100), "the flood did not reach the prefill rank: %d of %d sent", reached, sent)
	t.Logf("%d ABORTs sent in %v, %d received or dropped by the prefill rank (%d dropped from the flooder's backlog); %d honest rooms, %v each",
		sent, elapsed.Round(time.Millisecond), reached, pAfter.Backlogged-pBefore.Backlogged, rooms, (elapsed / rooms).Round(time.Millisecond))
}

// TestAbortFloodKeepsAnotherRanksEarlyAbort (issue 49, 3): an honest decode
// rank process asks for room 50 and aborts it before the prefill rank
// process created the room's sender (an early abort: a tombstone). Then a
// decode rank with its own certificate floods the prefill rank with 2,000
// ABORTs for room ids no one uses, past the tombstone bound (64 here, so a
// rank's share is 8). The flooder's own early aborts are forgotten, never
// the honest rank's: room 50's sender, created after the flood, starts
// Failed at once (before, the flood made the prefill rank forget room
// 50's tombstone, and the sender waited out its bootstrap deadline, 300 s).
func TestAbortFloodKeepsAnotherRanksEarlyAbort(t *testing.T) {
	t.Parallel() // its own processes and ports
	prefill, genuine, loop, to := floodRanks(t, "KVBRIDGE_E2E_MAX_TOMBSTONES=64")
	pp, gp := newPagePool(pages), newPagePool(pages)
	pdRoom(t, prefill, genuine, 1, pp, gp) // registered, served

	tombstoned := func() uint64 { return events(t, prefill, core.EventAbort, core.Tombstoned) }
	before := tombstoned()
	src, dst := pp.Get(8), gp.Get(8)
	genuine.do(fmt.Sprintf("RECV+ 50 %s %s", csv(dst), csv(src)))
	genuine.expect(t, "REQUESTED 50")
	genuine.do("ABORT 50")
	require.True(t, strings.HasPrefix(genuine.expect(t, "DONE 50"), "DONE 50 Failed"), "the honest rank's room 50, aborted")
	require.Eventually(t, func() bool { return tombstoned() > before }, 30*time.Second, 10*time.Millisecond,
		"the honest rank's early ABORT of room 50 never reached the prefill rank")

	const flood = 2000
	for n := range flood {
		require.NoError(t, loop.Send(to, &wire.Abort{Room: 1<<40 + uint64(n), Reason: "flood"}))
	}
	require.Eventually(t, func() bool { return tombstoned() >= before+1+flood }, 30*time.Second, 10*time.Millisecond,
		"the flood never reached the prefill rank (each ABORT of a fresh id an early abort)")
	assert.GreaterOrEqual(t, procCounter(t, prefill, "kvbridge_tombstones_forgotten_total", "reason", "rank_share"), uint64(flood-64/8), "the flood's early aborts past the flooder's share, forgotten and counted")
	assert.Zero(t, procCounter(t, prefill, "kvbridge_tombstones_forgotten_total", "reason", "bound"), "a tombstone forgotten past the bound: the flood's were not its own share")

	prefill.do(fmt.Sprintf("SEND 50 %s 8", csv(src)))
	got := prefill.expect(t, "DONE 50")
	assert.True(t, strings.HasPrefix(got, "DONE 50 Failed"), "room 50's sender after the flood: %s", got)
	assert.Contains(t, got, "aborted", "room 50's sender failed for its early abort: %s", got)
	pdRoom(t, prefill, genuine, 51, pp, gp) // the honest pair still works
}
