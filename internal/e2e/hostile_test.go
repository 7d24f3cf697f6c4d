package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/core"
)

// Issue 49, 3 on real processes: a room is one decode instance's.

// coreStats is a rank process's core counters (CORESTATS).
func coreStats(t *testing.T, r *rankProc) core.CoreStats {
	t.Helper()
	r.do("CORESTATS 0")
	var s core.CoreStats
	require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(r.expect(t, "CORESTATS "), "CORESTATS ")), &s))
	return s
}

// requestsHeld counts the REQUESTs a prefill rank process accepted (for a
// live room, or kept pending).
func requestsHeld(s core.CoreStats) uint64 {
	return s.Events[core.EventRequest][core.Applied] + s.Events[core.EventRequest][core.Pending]
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
		bootstrap.From{Role: bootstrap.RolePrefill, Instance: "proc", Rank: 0},
		bootstrap.From{Role: bootstrap.RoleDecode, Instance: "proc", Rank: 0},
		bootstrap.From{Role: bootstrap.RoleDecode, Instance: "attacker", Rank: 0})
	boot := startBoot(t)
	base := []string{"KVBRIDGE_E2E_ENGINE=ucx-tcp", "KVBRIDGE_E2E_BOOT=" + boot}
	prefill := startChild(t, append(append([]string{"KVBRIDGE_E2E_ROLE=prefill"}, base...), envs[0]...)...)
	genuine := startChild(t, append(append([]string{"KVBRIDGE_E2E_ROLE=decode"}, base...), envs[1]...)...)
	attacker := startChild(t, append(append([]string{"KVBRIDGE_E2E_ROLE=decode", "KVBRIDGE_E2E_INSTANCE=attacker"}, base...), envs[2]...)...)
	pp, gp, ap := newPagePool(pages), newPagePool(pages), newPagePool(pages)
	pdRoom(t, prefill, genuine, 1, pp, gp)  // both instances registered
	pdRoom(t, prefill, attacker, 2, pp, ap) // and served

	held := requestsHeld(coreStats(t, prefill))
	src, dst, adst := pp.Get(64), gp.Get(64), ap.Get(64)
	genuine.do(fmt.Sprintf("RECV 5 %s %s", csv(dst), csv(src)))
	require.Eventually(t, func() bool { return requestsHeld(coreStats(t, prefill)) > held }, 30*time.Second, 10*time.Millisecond,
		"the genuine instance's REQUEST for room 5 never reached the prefill rank")

	attacker.do(fmt.Sprintf("RECV 5 %s %s", csv(adst), csv(src)))
	got := attacker.expect(t, "DONE")
	assert.True(t, strings.HasPrefix(got, "DONE 5 Failed"), "the attacker's room 5: %s", got)
	assert.Contains(t, got, `decode_instance_"proc"_asked_for_it_first`, "the refusal names the instance that asked first")
	require.Eventually(t, func() bool { return coreStats(t, prefill).ForeignRefused >= 2 }, 30*time.Second, 10*time.Millisecond,
		"the attacker's REQUEST and the ABORT after its room failed, counted as refused")

	prefill.do(fmt.Sprintf("SEND 5 %s 16", csv(src)))
	assert.Equal(t, "DONE 5 Success verified", genuine.expect(t, "DONE"), "the genuine instance's room 5")
	assert.True(t, strings.HasPrefix(prefill.expect(t, "DONE"), "DONE 5 Success"))
	pdRoom(t, prefill, attacker, 6, pp, ap) // the attacker's own rooms still work
}
