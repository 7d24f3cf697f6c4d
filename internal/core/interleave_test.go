package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// This file is a small explicit-state model checker for one room. From the
// empty registry it applies every event in every reachable state, keeps each
// distinct state once (breadth first, deduplicated by a fingerprint of the
// registry and of the checker's own history), and checks the registry's
// invariants on every transition and in every state. Events may repeat
// without bound; the only constraint is the natural one that at most two
// writes are in flight. Time moves only by "sweep past deadline X" events,
// and the fingerprint holds times relative to now, so the state space is
// finite.

const mcRoom = 42

// mcState is one node of the search: a registry, its clock and the checker's
// memory of what happened on the path that reached it.
type mcState struct {
	reg *testReg
	clk *fakeClock
	// aborted: an abort was applied (or pending requests expired) for the
	// current incarnation of the room, at abortAt.
	aborted bool
	abortAt time.Time
	// cleared: the room was cleared at clearedAt.
	cleared   bool
	clearedAt time.Time
}

type mcEvent struct {
	name  string
	apply func(s *mcState) (Result, []Expiry)
}

func mcEvents(role Role, peers int) []mcEvent {
	ev := func(name string, f func(r *testReg) Result) mcEvent {
		return mcEvent{name, func(s *mcState) (Result, []Expiry) { return f(s.reg), nil }}
	}
	sweep := func(name string, d func(c RegistryConfig) time.Duration) mcEvent {
		return mcEvent{"sweep past " + name, func(s *mcState) (Result, []Expiry) {
			now := s.clk.Advance(d(s.reg.cfg) + time.Millisecond)
			return Result{}, s.reg.Sweep(now)
		}}
	}
	events := []mcEvent{
		ev("create", func(r *testReg) Result { return r.Create(mcRoom, role) }),
		ev("init", func(r *testReg) Result { return r.Init(mcRoom) }),
		ev("abort", func(r *testReg) Result { return r.Abort(mcRoom, "test abort") }),
		ev("clear", func(r *testReg) Result { return r.Clear(mcRoom) }),
		sweep("bootstrap", func(c RegistryConfig) time.Duration { return c.BootstrapTimeout }),
		sweep("waiting", func(c RegistryConfig) time.Duration { return c.WaitingTimeout }),
		sweep("stall", func(c RegistryConfig) time.Duration { return c.StallTimeout }),
		sweep("pending", func(c RegistryConfig) time.Duration { return c.PendingTimeout }),
		sweep("tombstone TTL", func(c RegistryConfig) time.Duration { return c.TombstoneTTL }),
	}
	if role == RoleDecode {
		return append(events,
			ev("data arrived", func(r *testReg) Result { return r.Progress(mcRoom) }),
			ev("success", func(r *testReg) Result { return r.Update(mcRoom, Success, "") }),
			ev("failure", func(r *testReg) Result { return r.Update(mcRoom, Failed, "transport error") }),
		)
	}
	for p := 1; p <= peers; p++ {
		name := fmt.Sprintf("d%d", p)
		events = append(events, ev("request from "+name, func(r *testReg) Result {
			return r.Request(mcRoom, PeerRequest{Peer: name, Required: peers})
		}))
	}
	return append(events,
		ev("chunk posted", func(r *testReg) Result {
			if r.InFlight(mcRoom) >= 2 {
				return Result{} // natural bound: at most two writes in flight
			}
			return r.Posted(mcRoom)
		}),
		ev("transfer done", func(r *testReg) Result { return r.WriteDone(mcRoom, false, nil) }),
		ev("last transfer done", func(r *testReg) Result { return r.WriteDone(mcRoom, true, nil) }),
		ev("transfer error", func(r *testReg) Result { return r.WriteDone(mcRoom, false, errors.New("remote error")) }),
	)
}

func (s *mcState) clone() *mcState {
	c := *s
	c.clk = &fakeClock{t: s.clk.Now()}
	c.reg = s.reg.clone(c.clk)
	return &c
}

// fingerprint identifies the state for deduplication. Times are relative to
// now; the checker's history times are clipped at the TTL, past which they
// no longer matter.
func (s *mcState) fingerprint() string {
	now := s.clk.Now()
	ttl := s.reg.cfg.TombstoneTTL
	age := func(t time.Time) time.Duration { return min(now.Sub(t), ttl) }
	var b strings.Builder
	if rm, ok := s.reg.rooms[mcRoom]; ok {
		fmt.Fprintf(&b, "R%v/%v/%q/i%v/r%d/", rm.role, rm.status, rm.reason, rm.initialised, rm.required)
		for _, q := range rm.requests {
			b.WriteString(q.Peer + ",")
		}
		fmt.Fprintf(&b, "/f%d/l%v/x%v", rm.inflight, rm.lastDone, rm.drainExpired)
		if !rm.status.Terminal() || (rm.inflight > 0 && !rm.drainExpired) {
			fmt.Fprintf(&b, "/d%v@%v", rm.kind, rm.deadline.Sub(now))
		}
	}
	if p, ok := s.reg.pending[mcRoom]; ok {
		fmt.Fprintf(&b, "P%d/", p.required)
		for _, q := range p.requests {
			b.WriteString(q.Peer + ",")
		}
		fmt.Fprintf(&b, "@%v", p.deadline.Sub(now))
	}
	if t, ok := s.reg.tombs[mcRoom]; ok {
		fmt.Fprintf(&b, "T%v/%q@%v", t.kind, t.reason, t.expires.Sub(now))
	}
	if s.aborted {
		fmt.Fprintf(&b, "|a%v", age(s.abortAt))
	}
	if s.cleared {
		fmt.Fprintf(&b, "|c%v", age(s.clearedAt))
	}
	return b.String()
}

// step applies ev to s (in place) and checks the invariants that concern one
// transition.
func (s *mcState) step(ev mcEvent) error {
	cfg := s.reg.cfg
	preStatus, preKnown := s.reg.Status(mcRoom)
	preFP := s.fingerprint()
	res, expired := ev.apply(s)
	now := s.clk.Now()
	status, known := s.reg.Status(mcRoom)

	// Every event returns an explicit outcome (sweeps report expiries; the
	// bounded post that was skipped returns nothing).
	if res.Outcome == 0 && !strings.HasPrefix(ev.name, "sweep") && ev.name != "chunk posted" {
		return fmt.Errorf("no outcome: %+v", res)
	}
	if res.Outcome == Rejected && res.Err == nil {
		return errors.New("rejected without an error")
	}
	if res.Outcome != 0 && res.Outcome != Rejected && known && res.Status != status {
		return fmt.Errorf("result says %v, registry says %v", res.Status, status)
	}
	if res.Drained && known && (status != Failed || s.reg.rooms[mcRoom].inflight != 0) {
		return fmt.Errorf("drained reported for %v with %d in flight", status, s.reg.rooms[mcRoom].inflight)
	}

	switch ev.name {
	case "create":
		if preKnown {
			// Invariant 6: a second live handle is refused, and nothing changes.
			if !errors.Is(res.Err, ErrRoomInUse) || s.fingerprint() != preFP {
				return fmt.Errorf("second create on a live room: %+v", res)
			}
			break
		}
		if res.Outcome != Applied {
			// Invariant 3: refused only while a Cleared tombstone stands.
			if !errors.Is(res.Err, ErrRoomCleared) || !s.cleared || now.Sub(s.clearedAt) >= cfg.TombstoneTTL {
				return fmt.Errorf("create refused: %+v", res)
			}
			break
		}
		if s.cleared && now.Sub(s.clearedAt) < cfg.TombstoneTTL {
			return fmt.Errorf("cleared room recreated %v after clear, inside the TTL", now.Sub(s.clearedAt))
		}
		switch status {
		case Failed:
			// Invariant 2: born failed only because of an early abort.
			if !s.aborted {
				return errors.New("room born failed without an abort")
			}
		case Bootstrapping:
			// Invariant 2: an abort inside the TTL is never forgotten.
			if s.aborted && now.Sub(s.abortAt) < cfg.TombstoneTTL {
				return errors.New("early abort lost: room created fresh")
			}
			s.aborted = false
		default:
			return fmt.Errorf("created in %v", status)
		}
		s.cleared = false
	case "abort":
		if res.Outcome == Applied || res.Outcome == Tombstoned {
			s.aborted, s.abortAt = true, now
		}
	case "clear":
		if res.Outcome == Applied {
			s.cleared, s.clearedAt = true, now
		}
	case "chunk posted":
		// Invariant 2: once an abort is applied, no write is posted.
		if res.Outcome == Applied && s.aborted {
			return errors.New("chunk posted after an applied abort")
		}
	}
	for _, e := range expired {
		if e.Deadline == DeadlinePending {
			s.aborted, s.abortAt = true, now
		}
	}

	if !preKnown && known && ev.name != "create" {
		return errors.New("a room appeared without create")
	}
	if preKnown && !known && ev.name != "clear" {
		return errors.New("a live room vanished without clear")
	}
	if preKnown && known {
		// Invariant 4: terminal sticky, non-terminal monotonic.
		if preStatus.Terminal() && status != preStatus {
			return fmt.Errorf("terminal %v became %v", preStatus, status)
		}
		if status < preStatus && status != Failed {
			return fmt.Errorf("went back from %v to %v", preStatus, status)
		}
	}
	// Progress refreshes the stall deadline.
	if res.Outcome == Applied && status == Transferring && s.reg.rooms[mcRoom].deadline != now.Add(cfg.StallTimeout) {
		return fmt.Errorf("%s did not refresh the stall deadline", ev.name)
	}
	if s.aborted && known && status != Failed {
		return fmt.Errorf("aborted room is %v", status)
	}
	return s.check()
}

// check verifies the invariants that concern one state.
func (s *mcState) check() error {
	cfg := s.reg.cfg
	now := s.clk.Now()
	if rm, ok := s.reg.rooms[mcRoom]; ok {
		if !rm.status.Valid() {
			return fmt.Errorf("stored invalid status %v", rm.status)
		}
		// The ready waiters are woken exactly when data can move or the
		// room is over.
		if s.reg.woken[rm]&(1<<WakeReady) != 0 {
			if rm.status < WaitingForInput && rm.status != Failed {
				return fmt.Errorf("ready signalled in %v", rm.status)
			}
		} else if rm.status >= WaitingForInput || rm.status == Failed {
			return fmt.Errorf("ready not signalled in %v", rm.status)
		}
		// The done waiters are woken exactly when the room is terminal.
		if s.reg.woken[rm]&(1<<WakeDone) != 0 {
			if !rm.status.Terminal() {
				return fmt.Errorf("waiters woken in %v", rm.status)
			}
		} else if rm.status.Terminal() {
			return fmt.Errorf("waiters not woken in %v", rm.status)
		}
		if !rm.status.Terminal() {
			// Invariant 1: a live room always has a deadline no later than
			// its state's timeout.
			if want := map[Poll]Deadline{Bootstrapping: DeadlineBootstrap, WaitingForInput: DeadlineWaiting,
				Transferring: DeadlineStall}[rm.status]; rm.kind != want {
				return fmt.Errorf("%v room runs the %v deadline", rm.status, rm.kind)
			}
			left := rm.deadline.Sub(now)
			if left <= 0 || left > s.reg.timeout(rm.kind) {
				return fmt.Errorf("%v room has %v deadline in %v", rm.status, rm.kind, left)
			}
		}
		if rm.role == RolePrefill {
			ready := rm.initialised && rm.required > 0 && len(rm.requests) == rm.required
			if rm.status == Bootstrapping && ready {
				return errors.New("ready but still Bootstrapping")
			}
			if rm.status >= WaitingForInput && !ready {
				return fmt.Errorf("%v without init and every request", rm.status)
			}
		}
		if rm.status.Terminal() {
			st, err := s.reg.Wait(context.Background(), mcRoom)
			if err != nil || st != rm.status {
				return fmt.Errorf("Wait on a %v room: %v, %v", rm.status, st, err)
			}
		}
	}
	if p, ok := s.reg.pending[mcRoom]; ok {
		if left := p.deadline.Sub(now); left <= 0 || left > cfg.PendingTimeout {
			return fmt.Errorf("pending deadline in %v", left)
		}
	}

	// Invariant 1: sweeping past every deadline leaves no live non-terminal
	// room and no pending requests.
	c := s.clone()
	horizon := max(cfg.BootstrapTimeout, cfg.WaitingTimeout, cfg.StallTimeout, cfg.PendingTimeout)
	c.reg.Sweep(c.clk.Advance(horizon + time.Millisecond))
	if st, known := c.reg.Status(mcRoom); known && !st.Terminal() {
		return fmt.Errorf("still %v after every deadline", st)
	}
	if c.reg.Sizes().Pending != 0 {
		return errors.New("pending requests survived their deadline")
	}
	// Invariant 5: after clear and the TTL the registry is empty.
	c = s.clone()
	c.reg.Clear(mcRoom)
	c.reg.Sweep(c.clk.Advance(cfg.TombstoneTTL + time.Millisecond))
	if sz := c.reg.Sizes(); sz.Total() != 0 {
		return fmt.Errorf("registry holds %+v after clear and TTL", sz)
	}
	return nil
}

type mcNode struct {
	s    *mcState
	path []string
}

// explore runs the search and returns the number of distinct states and of
// transitions checked.
func explore(t *testing.T, role Role, peers int) (states, transitions int) {
	t.Helper()
	clk := newFakeClock()
	reg, err := newTestReg(testConfig(clk), clk)
	require.NoError(t, err)
	root := &mcState{reg: reg, clk: clk}
	require.NoError(t, root.check())
	events := mcEvents(role, peers)
	seen := map[string]bool{root.fingerprint(): true}
	queue := []mcNode{{s: root}}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		for _, ev := range events {
			next := n.s.clone()
			transitions++
			if err := next.step(ev); err != nil {
				t.Fatalf("%v room, %d peers: after %s → %s: %v",
					role, peers, strings.Join(n.path, " → "), ev.name, err)
			}
			fp := next.fingerprint()
			if seen[fp] {
				continue
			}
			seen[fp] = true
			if raceOn && len(seen) > raceStates {
				return len(seen), transitions // the whole search runs without the race detector
			}
			queue = append(queue, mcNode{s: next, path: append(slices.Clip(n.path), ev.name)})
		}
	}
	return len(seen), transitions
}

// TestInterleavings explores every reachable state of one room under every
// order of its events and checks the registry's invariants (docs/ARCHITECTURE.md's 3–6) throughout.
func TestInterleavings(t *testing.T) {
	t.Parallel() // CPU-bound: alongside the other checkers
	for _, tc := range []struct {
		role  Role
		peers int
	}{{RolePrefill, 1}, {RolePrefill, 2}, {RoleDecode, 0}} {
		t.Run(fmt.Sprintf("%v/%dpeers", tc.role, tc.peers), func(t *testing.T) {
			states, transitions := explore(t, tc.role, tc.peers)
			if raceOn {
				t.Logf("%v room with %d peers, under the race detector: the first %d states and %d transitions (the whole search: make test-checkers)",
					tc.role, tc.peers, states, transitions)
				return
			}
			t.Logf("%v room with %d peers: checked %d distinct states and %d transitions (every event order reachable from the empty registry)",
				tc.role, tc.peers, states, transitions)
			require.GreaterOrEqual(t, states, 20, "only %d states: the search is not exploring", states)
		})
	}
}

// TestModelCheckerCatchesLostAbort proves the checker can fail: a registry
// with the Python connectors' bug (abort on an unknown room ignored) must be
// caught.
func TestModelCheckerCatchesLostAbort(t *testing.T) {
	clk := newFakeClock()
	reg, _ := newTestReg(testConfig(clk), clk)
	s := &mcState{reg: reg, clk: clk}
	buggyAbort := mcEvent{"abort", func(s *mcState) (Result, []Expiry) {
		if _, ok := s.reg.rooms[mcRoom]; !ok {
			// The bug: pretend the abort applied but forget it.
			return Result{Outcome: Tombstoned}, nil
		}
		return s.reg.Abort(mcRoom, "x"), nil
	}}
	require.NoError(t, s.step(buggyAbort), "the abort itself is not yet wrong")
	create := mcEvents(RolePrefill, 1)[0]
	require.ErrorContains(t, s.step(create), "early abort lost", "checker missed the lost abort")
}
