package core

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/wire"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is the deterministic clock the registry tests inject.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// testConfig has distinct timeouts so a failure reason shows which fired.
func testConfig(clk *fakeClock) RegistryConfig {
	return RegistryConfig{
		BootstrapTimeout:  10 * time.Second,
		WaitingTimeout:    20 * time.Second,
		StallTimeout:      5 * time.Second,
		PendingTimeout:    15 * time.Second,
		TombstoneTTL:      100 * time.Second,
		MaxPendingRooms:   1000,
		MaxTombstones:     1000,
		MaxPendingPerPeer: 1000,
		MaxReasonBytes:    512,
	}
}

func newTestRegistry(t testing.TB) (*testReg, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	r, err := newTestReg(testConfig(clk), clk)
	if err != nil {
		t.Fatal(err)
	}
	return r, clk
}

func peer(name string, required int) PeerRequest { return PeerRequest{Peer: name, Required: required} }

func expect(t *testing.T, what string, got Result, outcome Outcome, status Poll) {
	t.Helper()
	if got.Outcome != outcome || got.Status != status {
		t.Fatalf("%s: got %v/%v (err %v), want %v/%v", what, got.Outcome, got.Status, got.Err, outcome, status)
	}
}

func expectErr(t *testing.T, what string, got Result, target error) {
	t.Helper()
	if got.Outcome != Rejected || !errors.Is(got.Err, target) {
		t.Fatalf("%s: got %v (err %v), want Rejected with %v", what, got.Outcome, got.Err, target)
	}
}

func TestPollOrderAndMin(t *testing.T) {
	order := []Poll{Failed, Bootstrapping, WaitingForInput, Transferring, Success}
	for i := 1; i < len(order); i++ {
		if order[i-1] >= order[i] {
			t.Fatalf("%v must be below %v", order[i-1], order[i])
		}
	}
	var zero Poll
	if zero.Valid() || zero.String() != "Poll(0)" {
		t.Fatalf("zero Poll must be invalid, got valid=%v %q", zero.Valid(), zero.String())
	}
	for _, tc := range []struct {
		in   []Poll
		want Poll
	}{
		{nil, 0},
		{[]Poll{Success}, Success},
		{[]Poll{Success, Transferring, WaitingForInput}, WaitingForInput},
		{[]Poll{Success, Failed, Transferring}, Failed},
		{[]Poll{Success, 0}, 0},
		{[]Poll{Success, Poll(9)}, 0},
	} {
		if got := MinPoll(tc.in...); got != tc.want {
			t.Errorf("MinPoll(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	if Transferring.String() != "Transferring" || Tombstoned.String() != "Tombstoned" {
		t.Fatal("generated String() is out of date: run go generate")
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultRegistryConfig().Validate(); err != nil {
		t.Fatalf("defaults must validate: %v", err)
	}
	for name, mut := range map[string]func(*RegistryConfig){
		"zero stall":     func(c *RegistryConfig) { c.StallTimeout = 0 },
		"short ttl":      func(c *RegistryConfig) { c.TombstoneTTL = c.BootstrapTimeout },
		"ttl < pending":  func(c *RegistryConfig) { c.PendingTimeout = c.TombstoneTTL + time.Second },
		"no pending cap": func(c *RegistryConfig) { c.MaxPendingRooms = 0 },
	} {
		c := DefaultRegistryConfig()
		mut(&c)
		if _, err := NewRegistry(c, nil); err == nil {
			t.Errorf("%s: NewRegistry accepted an invalid config", name)
		}
	}
}

// The bug this project exists to fix: ABORT processed before the sender.
func TestAbortBeforeSender(t *testing.T) {
	r, _ := newTestRegistry(t)
	expect(t, "abort", r.Abort(7, "client disconnected"), Tombstoned, 0)
	if _, known := r.Status(7); known {
		t.Fatal("a tombstone must not read as a room")
	}
	res := r.Create(7, RolePrefill)
	expect(t, "create", res, Applied, Failed)
	if !res.Drained {
		t.Fatal("a room born failed has nothing in flight")
	}
	if st, _ := r.Status(7); st != Failed {
		t.Fatalf("status %v, want Failed", st)
	}
	reason, _ := r.Failure(7)
	if !strings.Contains(reason, "client disconnected") {
		t.Fatalf("reason %q lost the abort's reason", reason)
	}
	if st, err := r.Wait(context.Background(), 7); st != Failed || err != nil {
		t.Fatalf("Wait = %v, %v; want Failed at once", st, err)
	}
	expect(t, "posted after abort", r.Posted(7), IgnoredTerminal, Failed)
	expectErr(t, "request after abort", r.Request(7, peer("d0", 1)), ErrRoomFailed)
}

func TestAbortDropsPendingRequests(t *testing.T) {
	r, _ := newTestRegistry(t)
	expect(t, "request", r.Request(3, peer("d0", 2)), Pending, 0)
	res := r.Abort(3, "x")
	expect(t, "abort", res, Tombstoned, 0)
	if len(res.Peers) != 1 || res.Peers[0].Peer != "d0" {
		t.Fatalf("abort must hand back the dropped request, got %v", res.Peers)
	}
	expectErr(t, "request after early abort", r.Request(3, peer("d1", 2)), ErrRoomAborted)
	if s := r.Sizes(); s.Pending != 0 || s.Tombstones != 1 {
		t.Fatalf("sizes %+v", s)
	}
}

func TestRequestsBeforeAndAfterCreate(t *testing.T) {
	r, _ := newTestRegistry(t)
	expect(t, "req d0", r.Request(1, peer("d0", 2)), Pending, 0)
	expectErr(t, "dup d0", r.Request(1, peer("d0", 2)), ErrDuplicateRequest)
	expectErr(t, "mismatch", r.Request(1, peer("d1", 3)), ErrRequiredMismatch)
	expect(t, "create", r.Create(1, RolePrefill), Applied, Bootstrapping)
	expect(t, "init", r.Init(1), Applied, Bootstrapping)
	expect(t, "init again", r.Init(1), IgnoredStale, Bootstrapping)
	expect(t, "req d1", r.Request(1, peer("d1", 2)), Applied, WaitingForInput)
	expectErr(t, "req d2", r.Request(1, peer("d2", 2)), ErrTooManyRequests)
	expectErr(t, "bad req", r.Request(1, peer("", 2)), ErrInvalidRequest)
	expectErr(t, "bad req", r.Request(1, peer("d9", 0)), ErrInvalidRequest)
}

func TestWaitingExactlyWhenRequiredAndInitialised(t *testing.T) {
	r, _ := newTestRegistry(t)
	expect(t, "create", r.Create(1, RolePrefill), Applied, Bootstrapping)
	expect(t, "req d0", r.Request(1, peer("d0", 2)), Applied, Bootstrapping)
	expect(t, "req d1", r.Request(1, peer("d1", 2)), Applied, Bootstrapping) // not initialised
	expect(t, "init", r.Init(1), Applied, WaitingForInput)
}

func TestLifecyclePrefill(t *testing.T) {
	r, _ := newTestRegistry(t)
	expect(t, "create", r.Create(1, RolePrefill), Applied, Bootstrapping)
	expectErr(t, "posted too early", r.Posted(1), ErrNotReady)
	r.Init(1)
	r.Request(1, peer("d0", 1))
	expect(t, "post 1", r.Posted(1), Applied, Transferring)
	expect(t, "post 2", r.Posted(1), Applied, Transferring)
	expect(t, "last done first", r.WriteDone(1, true, nil), Applied, Transferring)
	expectErr(t, "post after last", r.Posted(1), ErrInvalidEvent)
	expect(t, "done", r.WriteDone(1, false, nil), Applied, Success)
	expectErr(t, "extra completion", r.WriteDone(1, false, nil), ErrNoWriteInFlight)
	expect(t, "abort after success", r.Abort(1, "late"), IgnoredTerminal, Success)
	expect(t, "fail after success", r.Update(1, Failed, "late"), IgnoredTerminal, Success)
	expect(t, "clear", r.Clear(1), Applied, Success)
	expect(t, "late abort", r.Abort(1, "late"), IgnoredCleared, 0)
	expect(t, "late update", r.Update(1, Failed, "late"), IgnoredCleared, 0)
	expect(t, "late clear", r.Clear(1), IgnoredCleared, 0)
	expectErr(t, "late request", r.Request(1, peer("d0", 1)), ErrRoomCleared)
	if _, known := r.Status(1); known {
		t.Fatal("a cleared room came back")
	}
}

func TestLifecycleDecode(t *testing.T) {
	r, _ := newTestRegistry(t)
	expect(t, "create", r.Create(2, RoleDecode), Applied, Bootstrapping)
	expectErr(t, "data before request", r.Progress(2), ErrNotReady)
	expectErr(t, "request on decode", r.Request(2, peer("d0", 1)), ErrWrongRole)
	expectErr(t, "posted on decode", r.Posted(2), ErrWrongRole)
	expect(t, "request sent", r.Init(2), Applied, WaitingForInput)
	expect(t, "data", r.Progress(2), Applied, Transferring)
	expect(t, "stale", r.Update(2, WaitingForInput, ""), IgnoredStale, Transferring)
	expect(t, "success", r.Update(2, Success, ""), Applied, Success)
	expect(t, "progress after success", r.Progress(2), IgnoredTerminal, Success)
}

func TestFirstFailureReasonWins(t *testing.T) {
	r, _ := newTestRegistry(t)
	r.Create(1, RolePrefill)
	expect(t, "fail", r.Update(1, Failed, "first"), Applied, Failed)
	expect(t, "fail again", r.Update(1, Failed, "second"), IgnoredTerminal, Failed)
	expect(t, "abort", r.Abort(1, "third"), IgnoredTerminal, Failed)
	expect(t, "success", r.Update(1, Success, ""), IgnoredTerminal, Failed)
	if reason, _ := r.Failure(1); reason != "first" {
		t.Fatalf("reason %q, want first", reason)
	}
}

func TestUpdateNeverCreatesRoom(t *testing.T) {
	r, _ := newTestRegistry(t)
	for _, ev := range []Event{
		{Kind: EventUpdate, Room: 5, Status: Failed},
		{Kind: EventUpdate, Room: 5, Status: Success},
		{Kind: EventInit, Room: 5},
		{Kind: EventPosted, Room: 5},
		{Kind: EventProgress, Room: 5},
		{Kind: EventWriteDone, Room: 5},
	} {
		expectErr(t, ev.Kind.String(), r.Apply(ev), ErrUnknownRoom)
	}
	expectErr(t, "bad kind", r.Apply(Event{Kind: 99, Room: 5}), ErrInvalidEvent)
	expectErr(t, "bad role", r.Create(5, 0), ErrInvalidEvent)
	if s := r.Sizes(); s.Total() != 0 {
		t.Fatalf("events on an unknown room left %+v", s)
	}
	if _, known := r.Status(5); known {
		t.Fatal("Status invented a room")
	}
	if _, err := r.Wait(context.Background(), 5); !errors.Is(err, ErrUnknownRoom) {
		t.Fatalf("Wait on unknown room: %v", err)
	}
}

func TestDuplicateRooms(t *testing.T) {
	r, clk := newTestRegistry(t)
	r.Create(1, RolePrefill)
	res := r.Create(1, RolePrefill)
	expectErr(t, "live duplicate", res, ErrRoomInUse)
	if !strings.Contains(res.Err.Error(), "room 1") {
		t.Fatalf("error %q must name the room", res.Err)
	}
	r.Clear(1)
	expectErr(t, "cleared duplicate", r.Create(1, RoleDecode), ErrRoomCleared)
	clk.Advance(99 * time.Second)
	expectErr(t, "still inside TTL", r.Create(1, RolePrefill), ErrRoomCleared)
	clk.Advance(time.Second)
	expect(t, "after TTL", r.Create(1, RolePrefill), Applied, Bootstrapping)
}

func TestDeadlines(t *testing.T) {
	for _, tc := range []struct {
		name    string
		setup   func(r *testReg)
		advance time.Duration
		kind    Deadline
		want    string
	}{
		{"bootstrap", func(r *testReg) { r.Create(1, RolePrefill) }, 10 * time.Second, DeadlineBootstrap, "bootstrap deadline"},
		{"waiting", func(r *testReg) { r.Create(1, RoleDecode); r.Init(1) }, 20 * time.Second, DeadlineWaiting, "waiting deadline"},
		{"stall", func(r *testReg) { r.Create(1, RoleDecode); r.Init(1); r.Progress(1) }, 5 * time.Second, DeadlineStall, "transfer stall deadline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, clk := newTestRegistry(t)
			tc.setup(r)
			if exp := r.Sweep(clk.Advance(tc.advance)); len(exp) != 0 {
				t.Fatalf("swept at the deadline itself: %+v", exp)
			}
			now := clk.Advance(time.Millisecond)
			if r.Overdue(now) != 1 {
				t.Fatal("Overdue must count the room past its deadline")
			}
			exp := r.Sweep(now)
			if len(exp) != 1 || exp[0].Deadline != tc.kind || !strings.Contains(exp[0].Reason, tc.want) {
				t.Fatalf("expiry %+v, want %v", exp, tc.kind)
			}
			if st, _ := r.Status(1); st != Failed {
				t.Fatalf("status %v after deadline", st)
			}
			if r.Overdue(now) != 0 {
				t.Fatal("Overdue must be 0 after Sweep")
			}
		})
	}
}

func TestPendingExpiry(t *testing.T) {
	r, clk := newTestRegistry(t)
	r.Request(4, peer("d0", 2))
	r.Request(4, peer("d1", 2))
	exp := r.Sweep(clk.Advance(16 * time.Second))
	if len(exp) != 1 || exp[0].Deadline != DeadlinePending || len(exp[0].Peers) != 2 {
		t.Fatalf("expiry %+v, want the two pending requests reported", exp)
	}
	res := r.Create(4, RolePrefill)
	expect(t, "create after expiry", res, Applied, Failed)
	if reason, _ := r.Failure(4); !strings.Contains(reason, "pending deadline") {
		t.Fatalf("reason %q", reason)
	}
}

func TestPendingBound(t *testing.T) {
	clk := newFakeClock()
	cfg := testConfig(clk)
	cfg.MaxPendingRooms = 2
	r, _ := newTestReg(cfg, clk)
	r.Request(1, peer("d0", 1))
	r.Request(2, peer("d0", 1))
	expectErr(t, "third pending room", r.Request(3, peer("d0", 1)), ErrTooManyPending)
}

func TestAbortDrainsInFlight(t *testing.T) {
	r, clk := newTestRegistry(t)
	r.Create(1, RolePrefill)
	r.Init(1)
	r.Request(1, peer("d0", 1))
	r.Posted(1)
	res := r.Abort(1, "stop")
	expect(t, "abort", res, Applied, Failed)
	if res.Drained {
		t.Fatal("a write is in flight: not drained")
	}
	expect(t, "no post after abort", r.Posted(1), IgnoredTerminal, Failed)
	res = r.WriteDone(1, false, nil)
	if !res.Drained || len(res.Peers) != 1 {
		t.Fatalf("the completion drains the room: %+v", res)
	}

	// A write that never completes is reported once, not drained.
	r.Create(2, RolePrefill)
	r.Init(2)
	r.Request(2, peer("d0", 1))
	r.Posted(2)
	r.Abort(2, "stop")
	exp := r.Sweep(clk.Advance(6 * time.Second))
	if len(exp) != 1 || exp[0].Drained || exp[0].Deadline != DeadlineStall {
		t.Fatalf("want one undrained stall expiry, got %+v", exp)
	}
	if exp := r.Sweep(clk.Advance(6 * time.Second)); len(exp) != 0 {
		t.Fatalf("reported twice: %+v", exp)
	}
}

func TestWriteErrorFails(t *testing.T) {
	r, _ := newTestRegistry(t)
	r.Create(1, RolePrefill)
	r.Init(1)
	r.Request(1, peer("d0", 1))
	r.Posted(1)
	res := r.WriteDone(1, false, errors.New("remote gone"))
	expect(t, "write error", res, Applied, Failed)
	if reason, _ := r.Failure(1); !strings.Contains(reason, "remote gone") {
		t.Fatalf("reason %q", reason)
	}
}

func TestClearPending(t *testing.T) {
	r, _ := newTestRegistry(t)
	r.Request(1, peer("d0", 1))
	res := r.Clear(1)
	if res.Outcome != Applied || len(res.Peers) != 1 {
		t.Fatalf("clear of a pending room: %+v", res)
	}
	expectErr(t, "create", r.Create(1, RolePrefill), ErrRoomCleared)
	expectErr(t, "clear unknown", r.Clear(2), ErrUnknownRoom)
}

func TestRegistryEmptiesAfterTTL(t *testing.T) {
	r, clk := newTestRegistry(t)
	for id := uint64(0); id < 50; id++ {
		switch id % 3 {
		case 0:
			r.Create(id, RolePrefill)
			r.Clear(id)
		case 1:
			r.Abort(id, "x")
		case 2:
			r.Request(id, peer("d0", 1))
		}
	}
	r.Sweep(clk.Advance(16 * time.Second)) // pending → tombstones
	if s := r.Sizes(); s.Live != 0 || s.Pending != 0 {
		t.Fatalf("sizes %+v", s)
	}
	r.Sweep(clk.Advance(100 * time.Second))
	if s := r.Sizes(); s.Total() != 0 {
		t.Fatalf("registry not empty after TTL: %+v", s)
	}
}

// A tombstone that still holds a write is kept past MaxTombstones (dropping
// it would lose the ABORT_ACK it owes); once its write completes it is
// trimmed at once, so the bound holds again after that step — not only at
// the next Clear. (The simulator's "tombstone bound 1" configuration found
// two tombstones left over a bound of 1.)
func TestTombstoneTrimmedWhenSettled(t *testing.T) {
	cfg := simRegistryConfig()
	cfg.MaxTombstones = 1
	r, err := NewRegistry(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.SetNow(t0)
	peer := PeerRequest{Peer: "decode/decode/0", Epoch: 1, Required: 1}
	for _, id := range []uint64{7, 8} {
		r.Create(id, RolePrefill)
		r.Request(id, peer)
		r.Init(id)
		r.Progress(id)
	}
	if res := r.Posted(8); res.Outcome != Applied {
		t.Fatalf("post: %v", res.Err)
	}
	r.Abort(8, "aborted", &wire.Peer{Endpoint: "tcp://decode"})
	r.Clear(8) // its write is in flight: the tombstone owes the drained ACK
	r.Clear(7) // over the bound: 8 cannot be forgotten yet
	if n := r.Sizes().Tombstones; n != 2 {
		t.Fatalf("%d tombstones, want 2 (one kept past the bound while it owes)", n)
	}
	r.WriteDone(8, false, nil, true) // 8 settles: its ACK goes, it may go too
	if n := r.Sizes().Tombstones; n != 1 {
		t.Fatalf("%d tombstones after the owing one settled, want 1 (MaxTombstones)", n)
	}
}
