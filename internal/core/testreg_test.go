package core

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/internal/wire"
)

// testReg is the smallest shell around a Registry, for the registry's own
// tests: a mutex (the model of the Manager's), a fake clock whose time each
// event happens at, and the wake effects carried out as the Manager does:
// recorded per room (woken) and closing the channels of Wait's waiters,
// which are the shell's. Sends (owed ABORT_ACKs) are recorded in acks.
type testReg struct {
	*Registry
	clk *fakeClock

	mu     sync.Mutex
	out    []Effect
	acks   []*wire.AbortAck
	closed chan struct{}
	once   sync.Once
	// woken: per live room, the bits (1<<Wake) of the wake effects
	// carried out; waits: Wait's done waiters, by room.
	woken map[*room]uint8
	waits map[uint64]chan struct{}
}

func newTestReg(cfg RegistryConfig, clk *fakeClock) (*testReg, error) {
	t := &testReg{clk: clk, closed: make(chan struct{}), woken: map[*room]uint8{}, waits: map[uint64]chan struct{}{}}
	r, err := NewRegistry(cfg, &t.out)
	if err != nil {
		return nil, err
	}
	t.Registry = r
	return t, nil
}

// do runs one event at the clock's time and carries out its effects.
func (t *testReg) do(f func() Result) Result {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.Registry.SetNow(t.clk.Now())
	res := f()
	t.flush()
	return res
}

func (t *testReg) flush() {
	for _, e := range t.out {
		switch e.Kind {
		case EffectWake:
			if rm := t.rooms[e.Room]; rm != nil {
				t.woken[rm] |= 1 << e.Wake
			}
			if ch := t.waits[e.Room]; ch != nil && e.Wake == WakeDone {
				close(ch)
				delete(t.waits, e.Room)
			}
		case EffectSend:
			if a, ok := e.Msg.(*wire.AbortAck); ok {
				t.acks = append(t.acks, a)
			}
		}
	}
	t.out = t.out[:0]
	if len(t.woken) > 2*len(t.rooms)+16 {
		maps.DeleteFunc(t.woken, func(rm *room, _ uint8) bool { return t.rooms[rm.id] != rm })
	}
}

func (t *testReg) Create(id uint64, role Role) Result {
	return t.do(func() Result { return t.Registry.Create(id, role) })
}
func (t *testReg) Init(id uint64) Result { return t.do(func() Result { return t.Registry.Init(id) }) }
func (t *testReg) Request(id uint64, req PeerRequest) Result {
	return t.do(func() Result { return t.Registry.Request(id, req) })
}
func (t *testReg) Posted(id uint64) Result {
	return t.do(func() Result { return t.Registry.Posted(id) })
}

// WriteDone reports a completion; a failure is one the engine quiesced.
func (t *testReg) WriteDone(id uint64, last bool, err error) Result {
	return t.do(func() Result { return t.Registry.WriteDone(id, last, err, true) })
}

// WriteMayLand reports a write that failed after its post: it may land.
func (t *testReg) WriteMayLand(id uint64, err error) Result {
	return t.do(func() Result { return t.Registry.WriteDone(id, false, err, false) })
}
func (t *testReg) Progress(id uint64) Result {
	return t.do(func() Result { return t.Registry.Progress(id) })
}
func (t *testReg) Update(id uint64, st Poll, reason string) Result {
	return t.do(func() Result { return t.Registry.Update(id, st, reason) })
}
func (t *testReg) Abort(id uint64, reason string) Result {
	return t.do(func() Result { return t.Registry.Abort(id, reason, nil) })
}

// AbortFrom is an ABORT from a peer, which is owed an ABORT_ACK.
func (t *testReg) AbortFrom(id uint64, reason, endpoint string) Result {
	return t.do(func() Result { return t.Registry.Abort(id, reason, &wire.Peer{Endpoint: endpoint}) })
}
func (t *testReg) Clear(id uint64) Result { return t.do(func() Result { return t.Registry.Clear(id) }) }
func (t *testReg) Apply(ev Event) Result  { return t.do(func() Result { return t.Registry.Apply(ev) }) }

func (t *testReg) Sweep(now time.Time) []Expiry {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.Registry.Sweep(now)
	t.flush()
	return out
}

func (t *testReg) Status(id uint64) (Poll, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.Registry.Status(id)
}

func (t *testReg) Failure(id uint64) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.Registry.Failure(id)
}

func (t *testReg) InFlight(id uint64) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.Registry.InFlight(id)
}

func (t *testReg) Sizes() Sizes {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.Registry.Sizes()
}

func (t *testReg) Overdue(now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.Registry.Overdue(now)
}

func (t *testReg) Close() { t.once.Do(func() { close(t.closed) }) }

// Wait mirrors the Manager's Wait over this shell (for the stress test's
// waiters; the Manager's own is tested in shell_test.go).
func (t *testReg) Wait(ctx context.Context, id uint64) (Poll, error) {
	t.mu.Lock()
	rm, ok := t.rooms[id]
	if !ok {
		tb, ok := t.tomb(id, t.clk.Now())
		t.mu.Unlock()
		switch {
		case !ok:
			return 0, fmt.Errorf("room %d: wait: %w", id, ErrUnknownRoom)
		case tb.kind == Cleared:
			return 0, fmt.Errorf("room %d: wait: %w", id, ErrRoomCleared)
		default:
			return 0, fmt.Errorf("room %d: wait: %w: %s", id, ErrRoomAborted, tb.reason)
		}
	}
	ch := t.waits[id]
	if ch == nil {
		ch = make(chan struct{})
		if t.woken[rm]&(1<<WakeDone) != 0 {
			close(ch)
		} else {
			t.waits[id] = ch
		}
	}
	t.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
		return 0, fmt.Errorf("room %d: wait: %w", id, ctx.Err())
	case <-t.closed:
		return 0, fmt.Errorf("room %d: wait: %w", id, errTestRegClosed)
	}
	st, known := t.Status(id)
	if !known {
		return 0, fmt.Errorf("room %d: cleared: %w", id, ErrRoomCleared)
	}
	return st, nil
}

// clone deep-copies the registry at a fresh clock (for the model checker).
func (t *testReg) clone(clk *fakeClock) *testReg {
	c, _ := newTestReg(t.cfg, clk)
	for id, rm := range t.rooms {
		cp := *rm
		cp.requests = slices.Clone(rm.requests)
		cp.acks = slices.Clone(rm.acks)
		c.woken[&cp] = t.woken[rm]
		c.rooms[id] = &cp
	}
	for id, p := range t.pending {
		cp := *p
		cp.requests = slices.Clone(p.requests)
		c.pending[id] = &cp
	}
	for id, tb := range t.tombs {
		cp := *tb
		cp.acks = slices.Clone(tb.acks)
		c.tombs[id] = &cp
	}
	c.tombQ = slices.Clone(t.tombQ)
	for id := range t.draining {
		c.draining[id] = struct{}{}
	}
	for k, n := range t.pendingBy {
		c.pendingBy[k] = n
	}
	for k, n := range t.earlyBy {
		c.earlyBy[k] = n
	}
	for k, q := range t.earlyQ {
		c.earlyQ[k] = slices.Clone(q)
	}
	c.acks = slices.Clone(t.acks)
	return c
}

// errTestRegClosed: the test registry was closed under a waiter.
var errTestRegClosed = errors.New("test registry closed")
