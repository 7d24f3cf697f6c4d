package core

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	require.NoError(t, err)
	return r, clk
}

func peer(name string, required int) PeerRequest { return PeerRequest{Peer: name, Required: required} }

func expect(t *testing.T, what string, got Result, outcome Outcome, status Poll) {
	t.Helper()
	require.Equal(t, outcome, got.Outcome, "%s: got %v/%v (err %v), want %v/%v", what, got.Outcome, got.Status, got.Err, outcome, status)
	require.Equal(t, status, got.Status, "%s: got %v/%v (err %v), want %v/%v", what, got.Outcome, got.Status, got.Err, outcome, status)
}

func expectErr(t *testing.T, what string, got Result, target error) {
	t.Helper()
	require.Equal(t, Rejected, got.Outcome, "%s: got %v (err %v), want Rejected with %v", what, got.Outcome, got.Err, target)
	require.ErrorIs(t, got.Err, target, "%s: want Rejected with %v", what, target)
}

func TestPollOrderAndMin(t *testing.T) {
	order := []Poll{Failed, Bootstrapping, WaitingForInput, Transferring, Success}
	for i := 1; i < len(order); i++ {
		require.Less(t, order[i-1], order[i], "%v must be below %v", order[i-1], order[i])
	}
	var zero Poll
	require.False(t, zero.Valid(), "zero Poll must be invalid")
	require.Equal(t, "Poll(0)", zero.String(), "zero Poll's String")
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
		assert.Equal(t, tc.want, MinPoll(tc.in...), "MinPoll(%v)", tc.in)
	}
	require.Equal(t, "Transferring", Transferring.String(), "generated String() is out of date: run go generate")
	require.Equal(t, "Tombstoned", Tombstoned.String(), "generated String() is out of date: run go generate")
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, DefaultRegistryConfig().Validate(), "defaults must validate")
	for name, mut := range map[string]func(*RegistryConfig){
		"zero stall":     func(c *RegistryConfig) { c.StallTimeout = 0 },
		"short ttl":      func(c *RegistryConfig) { c.TombstoneTTL = c.BootstrapTimeout },
		"ttl < pending":  func(c *RegistryConfig) { c.PendingTimeout = c.TombstoneTTL + time.Second },
		"no pending cap": func(c *RegistryConfig) { c.MaxPendingRooms = 0 },
	} {
		c := DefaultRegistryConfig()
		mut(&c)
		_, err := NewRegistry(c, nil)
		assert.Error(t, err, "%s: NewRegistry accepted an invalid config", name)
	}
}

// The bug this project exists to fix: ABORT processed before the sender.
func TestAbortBeforeSender(t *testing.T) {
	r, _ := newTestRegistry(t)
	expect(t, "abort", r.Abort(7, "client disconnected"), Tombstoned, 0)
	_, known := r.Status(7)
	require.False(t, known, "a tombstone must not read as a room")
	res := r.Create(7, RolePrefill)
	expect(t, "create", res, Applied, Failed)
	require.True(t, res.Drained, "a room born failed has nothing in flight")
	st, _ := r.Status(7)
	require.Equal(t, Failed, st, "room 7's status")
	reason, _ := r.Failure(7)
	require.Contains(t, reason, "client disconnected", "reason lost the abort's reason")
	st, err := r.Wait(context.Background(), 7)
	require.NoError(t, err, "Wait = %v, %v; want Failed at once", st, err)
	require.Equal(t, Failed, st, "Wait = %v, %v; want Failed at once", st, err)
	expect(t, "posted after abort", r.Posted(7), IgnoredTerminal, Failed)
	expectErr(t, "request after abort", r.Request(7, peer("d0", 1)), ErrRoomFailed)
}

func TestAbortDropsPendingRequests(t *testing.T) {
	r, _ := newTestRegistry(t)
	expect(t, "request", r.Request(3, peer("d0", 2)), Pending, 0)
	res := r.Abort(3, "x")
	expect(t, "abort", res, Tombstoned, 0)
	require.Len(t, res.Peers, 1, "abort must hand back the dropped request, got %v", res.Peers)
	require.Equal(t, "d0", res.Peers[0].Peer, "abort must hand back the dropped request, got %v", res.Peers)
	expectErr(t, "request after early abort", r.Request(3, peer("d1", 2)), ErrRoomAborted)
	s := r.Sizes()
	require.Zero(t, s.Pending, "sizes %+v", s)
	require.Equal(t, 1, s.Tombstones, "sizes %+v", s)
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
	_, known := r.Status(1)
	require.False(t, known, "a cleared room came back")
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
	reason, _ := r.Failure(1)
	require.Equal(t, "first", reason, "room 1's reason")
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
	s := r.Sizes()
	require.Zero(t, s.Total(), "events on an unknown room left %+v", s)
	_, known := r.Status(5)
	require.False(t, known, "Status invented a room")
	_, err := r.Wait(context.Background(), 5)
	require.ErrorIs(t, err, ErrUnknownRoom, "Wait on unknown room")
}

func TestDuplicateRooms(t *testing.T) {
	r, clk := newTestRegistry(t)
	r.Create(1, RolePrefill)
	res := r.Create(1, RolePrefill)
	expectErr(t, "live duplicate", res, ErrRoomInUse)
	require.ErrorContains(t, res.Err, "room 1", "the error must name the room")
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
			require.Empty(t, r.Sweep(clk.Advance(tc.advance)), "swept at the deadline itself")
			now := clk.Advance(time.Millisecond)
			require.Equal(t, 1, r.Overdue(now), "Overdue must count the room past its deadline")
			exp := r.Sweep(now)
			require.Len(t, exp, 1, "expiry %+v, want %v", exp, tc.kind)
			require.Equal(t, tc.kind, exp[0].Deadline, "expiry %+v, want %v", exp, tc.kind)
			require.Contains(t, exp[0].Reason, tc.want, "expiry %+v, want %v", exp, tc.kind)
			st, _ := r.Status(1)
			require.Equal(t, Failed, st, "room 1's status after deadline")
			require.Zero(t, r.Overdue(now), "Overdue must be 0 after Sweep")
		})
	}
}

func TestPendingExpiry(t *testing.T) {
	r, clk := newTestRegistry(t)
	r.Request(4, peer("d0", 2))
	r.Request(4, peer("d1", 2))
	exp := r.Sweep(clk.Advance(16 * time.Second))
	require.Len(t, exp, 1, "expiry %+v, want the two pending requests reported", exp)
	require.Equal(t, DeadlinePending, exp[0].Deadline, "expiry %+v, want the two pending requests reported", exp)
	require.Len(t, exp[0].Peers, 2, "expiry %+v, want the two pending requests reported", exp)
	res := r.Create(4, RolePrefill)
	expect(t, "create after expiry", res, Applied, Failed)
	reason, _ := r.Failure(4)
	require.Contains(t, reason, "pending deadline", "room 4's reason")
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
	require.False(t, res.Drained, "a write is in flight: not drained")
	expect(t, "no post after abort", r.Posted(1), IgnoredTerminal, Failed)
	res = r.WriteDone(1, false, nil)
	require.True(t, res.Drained, "the completion drains the room: %+v", res)
	require.Len(t, res.Peers, 1, "the completion drains the room: %+v", res)

	// A write that never completes is reported once, not drained.
	r.Create(2, RolePrefill)
	r.Init(2)
	r.Request(2, peer("d0", 1))
	r.Posted(2)
	r.Abort(2, "stop")
	exp := r.Sweep(clk.Advance(6 * time.Second))
	require.Len(t, exp, 1, "want one undrained stall expiry, got %+v", exp)
	require.False(t, exp[0].Drained, "want one undrained stall expiry, got %+v", exp)
	require.Equal(t, DeadlineStall, exp[0].Deadline, "want one undrained stall expiry, got %+v", exp)
	require.Empty(t, r.Sweep(clk.Advance(6*time.Second)), "reported twice")
}

func TestWriteErrorFails(t *testing.T) {
	r, _ := newTestRegistry(t)
	r.Create(1, RolePrefill)
	r.Init(1)
	r.Request(1, peer("d0", 1))
	r.Posted(1)
	res := r.WriteDone(1, false, errors.New("remote gone"))
	expect(t, "write error", res, Applied, Failed)
	reason, _ := r.Failure(1)
	require.Contains(t, reason, "remote gone", "room 1's reason")
}

func TestClearPending(t *testing.T) {
	r, _ := newTestRegistry(t)
	r.Request(1, peer("d0", 1))
	res := r.Clear(1)
	require.Equal(t, Applied, res.Outcome, "clear of a pending room: %+v", res)
	require.Len(t, res.Peers, 1, "clear of a pending room: %+v", res)
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
	s := r.Sizes()
	require.Zero(t, s.Live, "sizes %+v", s)
	require.Zero(t, s.Pending, "sizes %+v", s)
	r.Sweep(clk.Advance(100 * time.Second))
	s = r.Sizes()
	require.Zero(t, s.Total(), "registry not empty after TTL: %+v", s)
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
	require.NoError(t, err)
	r.SetNow(t0)
	peer := PeerRequest{Peer: "decode/decode/0", Epoch: 1, Required: 1}
	for _, id := range []uint64{7, 8} {
		r.Create(id, RolePrefill)
		r.Request(id, peer)
		r.Init(id)
		r.Progress(id)
	}
	res := r.Posted(8)
	require.Equal(t, Applied, res.Outcome, "room 8's post: %v", res.Err)
	r.Abort(8, "aborted", &wire.Peer{Endpoint: "tcp://decode"})
	r.Clear(8) // its write is in flight: the tombstone owes the drained ACK
	r.Clear(7) // over the bound: 8 cannot be forgotten yet
	require.Equal(t, 2, r.Sizes().Tombstones, "tombstones, want 2 (one kept past the bound while it owes)")
	r.WriteDone(8, false, nil, true) // 8 settles: its ACK goes, it may go too
	require.Equal(t, 1, r.Sizes().Tombstones, "tombstones after the owing one settled, want 1 (MaxTombstones)")
}
