package kvmanager

import (
	"sync"
	"sync/atomic"

	"github.com/kvbridge/kvbridge/internal/core"
)

// effOrder hands out the turns in which steps carry out their effects:
// a step takes a ticket under the Manager's mu (so tickets follow the
// steps' order), lets mu go, waits for its turn and carries its effects
// out, then passes the turn on. No one holds mu while waiting for a turn:
// reads, steps without effects and steps whose effects are all posts
// (carried out without a turn, see carryOut) never wait behind another
// step's sends. mu (a leaf lock) guards the fields below; it is held for
// a few instructions, never across a send.
type effOrder struct {
	mu     sync.Mutex
	next   uint64 // tickets handed out
	served uint64 // tickets whose effects are carried out: served == t is t's turn
	// at[v] is closed when served reaches v (a ticket's turn, or a
	// barrier), made by its first waiter.
	at   map[uint64]chan struct{}
	free [][]core.Effect // effect buffers to reuse (at most maxFreeEffBufs)
	// parked (tests) is called as a ticket's holder waits for its turn.
	parked atomic.Pointer[func(t uint64)]
}

// maxFreeEffBufs bounds the effect buffers kept for reuse: as many as
// steps carry out effects at once, usually one or two.
const maxFreeEffBufs = 8

// take hands out the next ticket with a buffer holding a copy of effects.
// The caller holds the Manager's mu.
func (o *effOrder) take(effects []core.Effect) (uint64, []core.Effect) {
	o.mu.Lock()
	t := o.next
	o.next++
	var buf []core.Effect
	if n := len(o.free); n > 0 {
		buf, o.free[n-1] = o.free[n-1], nil
		o.free = o.free[:n-1]
	}
	o.mu.Unlock()
	return t, append(buf, effects...)
}

// wait returns once served reaches v: ticket v's turn, or, for a barrier,
// every ticket before v carried out.
func (o *effOrder) wait(v uint64) {
	o.mu.Lock()
	if o.served >= v {
		o.mu.Unlock()
		return
	}
	ch := o.chanAt(v)
	o.mu.Unlock()
	if f := o.parked.Load(); f != nil {
		(*f)(v)
	}
	<-ch
}

// chanAt returns the channel closed when served reaches v; o.mu is held.
func (o *effOrder) chanAt(v uint64) chan struct{} {
	ch := o.at[v]
	if ch == nil {
		if o.at == nil {
			o.at = map[uint64]chan struct{}{}
		}
		ch = make(chan struct{})
		o.at[v] = ch
	}
	return ch
}

// done ends ticket t's turn (its effects carried out), keeps its buffer
// for reuse and wakes whoever waits for the next turn.
func (o *effOrder) done(t uint64, buf []core.Effect) {
	clear(buf) // drop the messages and channels
	o.mu.Lock()
	o.served = t + 1
	if ch := o.at[o.served]; ch != nil {
		close(ch)
		delete(o.at, o.served)
	}
	if len(o.free) < maxFreeEffBufs {
		o.free = append(o.free, buf[:0])
	}
	o.mu.Unlock()
}

// barrier returns a channel closed once every ticket handed out before
// the call is carried out (closed already when none is pending).
func (o *effOrder) barrier() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.served >= o.next {
		return closedChan
	}
	return o.chanAt(o.next)
}
