package kvmanager

import (
	"context"
	"errors"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/nixl"
	"github.com/kvbridge/kvbridge/transfer"
)

func newTestPrefill(t *testing.T) *Prefill {
	t.Helper()
	cfg := DefaultConfig(RolePrefill)
	cfg.Auth = testauth.Auth()
	cfg.Instance, cfg.Compat = "shell-test", "v1:test"
	cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
	cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: 64, Regions: []nixl.Desc{{Len: 8 * 64}, {Len: 8 * 64}}}
	p, err := NewPrefill(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestManagerWait: the shell's Wait returns at the room's terminal status,
// at Clear, with a clear error for unknown, cleared and early-aborted ids,
// at the caller's deadline, and when the rank closes.
func TestManagerWait(t *testing.T) {
	p := newTestPrefill(t)
	parked := make(chan uint64, 1)
	p.parked = func(room uint64) { parked <- room }
	type result struct {
		st  Poll
		err error
	}
	wait := func(ctx context.Context, room uint64) chan result {
		out := make(chan result, 1)
		go func() {
			st, err := p.Wait(ctx, room)
			out <- result{st, err}
		}()
		if got := <-parked; got != room {
			t.Fatalf("parked on %d", got)
		}
		return out
	}
	within := func(what string, ch chan result) result {
		t.Helper()
		select {
		case r := <-ch:
			return r
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Wait did not return", what)
			return result{}
		}
	}
	for id := uint64(1); id <= 3; id++ {
		p.CreateSender(id)
	}
	w1 := wait(context.Background(), 1)
	p.AbortSender(1, "operator")
	if r := within("abort", w1); r.st != Failed || r.err != nil {
		t.Fatalf("Wait after abort = %v, %v", r.st, r.err)
	}
	w2 := wait(context.Background(), 2)
	p.ClearSender(2)
	if r := within("clear", w2); !errors.Is(r.err, ErrRoomCleared) {
		t.Fatalf("Wait on a room cleared meanwhile: %v", r.err)
	}
	if _, err := p.Wait(context.Background(), 2); !errors.Is(err, ErrRoomCleared) {
		t.Fatalf("Wait after Clear: %v", err)
	}
	p.step(func(c *Core, now time.Time) {
		c.OnAbort(now, &bootstrap.Abort{From: decodeFrom, Room: 4, Reason: "early"})
	})
	if _, err := p.Wait(context.Background(), 4); !errors.Is(err, ErrRoomAborted) {
		t.Fatalf("Wait on an early-aborted id: %v", err)
	}
	if _, err := p.Wait(context.Background(), 5); !errors.Is(err, ErrUnknownRoom) {
		t.Fatalf("Wait on an unknown id: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w3 := wait(ctx, 3)
	cancel()
	if r := within("cancel", w3); !errors.Is(r.err, context.Canceled) || r.st != Bootstrapping {
		t.Fatalf("Wait with a cancelled context = %v, %v", r.st, r.err)
	}
	w3 = wait(context.Background(), 3)
	p.Close() // fails every live room first
	if r := within("close", w3); r.st != Failed && !errors.Is(r.err, ErrManagerClosed) {
		t.Fatalf("Wait across Close = %v, %v", r.st, r.err)
	}
}
