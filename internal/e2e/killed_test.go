package e2e

import (
	"fmt"
	"strings"
	"testing"
)

// TestDecodeKilledRepeatedly (issue 22 item 1): a decode rank process is
// killed (SIGKILL) with one room held mid-transfer and another being
// written, again and again against one prefill rank process, each time
// followed by a new decode process under the same agent name. The prefill
// rank must survive every kill (NIXL 1.4.0 with its progress thread
// crashed it: SIGSEGV in ucp_put_nbx), fail the killed decode's held room,
// and serve the next decode process byte-exact. 2 kills on the ucx
// engine here; 20 on a real NIXL (make test-nixl).
func TestDecodeKilledRepeatedly(t *testing.T) {
	onRestartEngines(t, func(t *testing.T, engine string) {
		kills := 2
		if engine == "libnixl-real" {
			kills = 20
		}
		boot := startBoot(t)
		prefill := startRank(t, "prefill", engine, boot)
		room := uint64(100)
		for k := 0; k <= kills; k++ {
			pp, dp := newPagePool(pages), newPagePool(pages)
			decode := startRank(t, "decode", engine, boot)
			room++
			runRoom(t, decode, prefill, room, pp.Get(8), dp.Get(8)) // the new process, byte-exact
			if k == kills {
				break
			}
			held, sent := room+1, room+2
			room += 2
			// The written room's request goes first, so it has reached the
			// prefill rank once the held room's first chunk is written.
			ssrc, sdst := pp.Get(256), dp.Get(256)
			decode.do(fmt.Sprintf("RECV %d %s %s", sent, csv(sdst), csv(ssrc)))
			src, dst := pp.Get(64), dp.Get(64)
			decode.do(fmt.Sprintf("RECV %d %s %s", held, csv(dst), csv(src)))
			prefill.do(fmt.Sprintf("HOLD %d %s 16", held, csv(src)))
			prefill.expect(t, fmt.Sprintf("HELD %d", held))
			prefill.do(fmt.Sprintf("SEND %d %s 16", sent, csv(ssrc)))
			decode.kill(t) // while the second room's writes are posted
			got := map[uint64]string{}
			for range 2 {
				l := prefill.expect(t, "DONE ")
				var r uint64
				fmt.Sscanf(l, "DONE %d", &r)
				got[r] = l
			}
			if !strings.HasPrefix(got[held], fmt.Sprintf("DONE %d Failed", held)) {
				t.Fatalf("kill %d: the held room: %q", k+1, got[held])
			}
			// The written room may have finished before the kill.
			if l := got[sent]; !strings.HasPrefix(l, fmt.Sprintf("DONE %d Failed", sent)) && !strings.HasPrefix(l, fmt.Sprintf("DONE %d Success", sent)) {
				t.Fatalf("kill %d: the room being written: %q", k+1, l)
			}
		}
	})
}

// TestLibNIXLTargetProgress (issue 22): libnixl agents run without NIXL's
// progress thread, so the target side of a write must be progressed by
// kvbridge too, as over UCX's tcp transport, where a put needs the target's
// worker. With the NIXL double's KVB_NIXL_DOUBLE_TARGET_PROGRESS a write
// completes only after the decode agent has progressed since the data was
// put: the decode notifier's polling while rooms are live does it, and
// rooms of every shape complete byte-exact.
func TestLibNIXLTargetProgress(t *testing.T) {
	if _, ok := engines["libnixl-double"]; !ok {
		t.Skip("KVBRIDGE_NIXL_LIB is set: target progress is the NIXL double's model")
	}
	t.Setenv("KVB_NIXL_DOUBLE_TARGET_PROGRESS", "1")
	c := newCluster(t, "libnixl-double", nil)
	for i, tokens := range []int{100, 4096, 17, 2000} {
		c.roomByteExact(t, uint64(2200+i), tokens, 16)
	}
}
