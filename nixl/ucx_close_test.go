package nixl

import (
	"bytes"
	"testing"
	"time"
)

// TestUCXCloseInFlightTargetStalled: an initiator closed with a 64 MiB
// write in flight over tcp while its target does not progress (a busy or
// briefly paused peer) must not crash the target when it resumes. A put
// over tcp is emulated with active messages, and UCX aborts the process
// that handles one after the initiator's socket has closed (ucp_put_handler
// sends the completion through ucp_request_send, which calls ucs_fatal on
// the send error). kvb_ep_close gave the flush a count of progress calls
// (well under a second), then closed by force: the target, resuming,
// aborted in ucp_put_handler ("unexpected error: Endpoint timeout"; seen
// in CI as 1 run in ~100 of TestContract/ucx-tcp/close_in_flight). The
// close now waits for the flush, bounded by ucxCloseWait, so the writes
// land before the socket closes.
func TestUCXCloseInFlightTargetStalled(t *testing.T) {
	ec := engines()[2]
	if ec.name != "ucx-tcp" {
		t.Fatalf("engines()[2] is %s, want ucx-tcp", ec.name)
	}
	// The stall is the fault injected, not a synchronisation: the target
	// sits still past the old close's bound, then resumes.
	const stall = 2 * time.Second
	for round := 0; round < 2; round++ {
		p := newPair(t, ec)
		const size = 64 << 20
		_, src, _ := p.ini.Alloc(size)
		_, dst, _ := p.tgt.Alloc(size)
		p.remote = exchange(t, p.ini, p.tgt)
		fill(src, uint64(round))
		tgt := p.tgt.b.(*ucx)
		stalled, resume := make(chan struct{}), make(chan struct{})
		go tgt.do(func() error { close(stalled); <-resume; return nil })
		<-stalled
		x := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, nil)
		closed := make(chan error, 1)
		go func() { closed <- p.ini.Close() }()
		timer := time.NewTimer(stall)
		select {
		case err := <-closed:
			// A close that returns while the target cannot progress has
			// cut its writes short.
			close(resume)
			timer.Stop()
			t.Fatalf("round %d: the initiator's Close returned (%v) while its target was stalled with a write in flight", round, err)
		case <-timer.C:
		}
		close(resume)
		if err := <-closed; err != nil {
			t.Fatalf("round %d: Close: %v", round, err)
		}
		if st, _ := p.ini.Status(x); st == InProgress {
			t.Fatalf("round %d: a transfer still in progress after Close", round)
		}
		// The target is alive and serves a new initiator.
		ini2 := open(t, ec, "ini")
		remote := exchange(t, ini2, p.tgt)
		_, src2, _ := ini2.Alloc(4096)
		fill(src2, uint64(round+100))
		q := pair{ini: ini2, tgt: p.tgt, remote: remote}
		y := write(t, q, []Desc{BytesDesc(src2)}, []Desc{BytesDesc(dst[:4096])}, nil)
		if st, err := wait(t, ini2, y, time.Minute); st != Done {
			t.Fatalf("round %d: a write to the target after the stall: %v %v", round, st, err)
		}
		if !bytes.Equal(src2, dst[:4096]) {
			t.Fatalf("round %d: the target's memory after the stall is not the new write's", round)
		}
	}
}
