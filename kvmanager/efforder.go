package kvmanager

import (
	"sync"
	"sync/atomic"

	"github.com/kvbridge/kvbridge/internal/core"
)

// effOrder carries out the steps' ordered effects (sends, wakes, watches,
// lookups) one step at a time in the order the steps ran, and no one
// waits for that order holding the core's lock. A step takes a ticket
// under the Manager's mu (so tickets follow the steps' order) and queues
// its effects with it; once mu is let go, carry returns when the
// ticket's effects are carried out. One goroutine at a time carries the
// queue out, whoever comes first: a step whose turn comes while another
// goroutine carries does not wait to be scheduled for its turn, and its
// effects do not wait for it (a goroutine handing each turn to the next,
// each one woken in turn, made a convoy at a thousand goroutines). A
// carrier carries at most carryMore tickets past its own and then hands
// the queue to the owner of the earliest ticket still queued who waits (a
// carrier is a caller: the control loop's receive goroutine among them;
// one that panics inside an effect hands the queue on as it unwinds:
// run). mu (a leaf lock) guards the
// fields below; it is held for a few instructions, never across an
// effect.
type effOrder struct {
	mu       sync.Mutex
	next     uint64          // tickets handed out
	served   uint64          // tickets whose effects are carried out
	queue    [][]core.Effect // the effects of tickets served … next−1, in order
	carrying bool            // a goroutine carries the queue out
	// done[t] is closed when ticket t's effects are carried out, or when
	// a carrier hands the queue to t's owner; made by its waiter.
	done map[uint64]chan struct{}
	// at[v] is closed when served reaches v (a barrier), made by its
	// first waiter.
	at   map[uint64]chan struct{}
	free [][]core.Effect // effect buffers to reuse (at most maxFreeEffBufs)
	// parked (tests) is called as a ticket's owner waits.
	parked atomic.Pointer[func(t uint64)]
}

// carryMore bounds the tickets a carrier carries past its own before it
// hands the queue on.
const carryMore = 32

// maxFreeEffBufs bounds the effect buffers kept for reuse, maxKeptEffBuf
// the effects one kept buffer holds (a step failing every room of a rank
// at Close makes one of thousands).
const (
	maxFreeEffBufs = 64
	maxKeptEffBuf  = 64
)

// take hands out the next ticket and queues a copy of effects (those
// ordered: see ordered) with it. The caller holds the Manager's mu.
func (o *effOrder) take(effects []core.Effect) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	t := o.next
	o.next++
	var buf []core.Effect
	if n := len(o.free); n > 0 {
		buf, o.free[n-1] = o.free[n-1], nil
		o.free = o.free[:n-1]
	}
	for _, e := range effects {
		if ordered(e.Kind) {
			buf = append(buf, e)
		}
	}
	o.queue = append(o.queue, buf)
	return t
}

// carry returns once ticket t's effects are carried out, by do: on this
// goroutine if no other carries the queue, else by that carrier.
func (o *effOrder) carry(t uint64, do func([]core.Effect)) {
	o.mu.Lock()
	for o.served <= t {
		if o.carrying {
			ch := o.done[t]
			if ch == nil {
				if o.done == nil {
					o.done = map[uint64]chan struct{}{}
				}
				ch = make(chan struct{})
				o.done[t] = ch
			}
			o.mu.Unlock()
			if f := o.parked.Load(); f != nil {
				(*f)(t)
			}
			<-ch
			o.mu.Lock()
			continue // carried out, or handed the queue
		}
		o.carrying = true
		for o.served < o.next && o.served <= t+carryMore {
			buf := o.queue[0]
			o.queue[0] = nil
			o.queue = o.queue[1:]
			o.mu.Unlock()
			o.run(do, buf)
			clear(buf) // drop the messages and channels
			o.mu.Lock()
			o.serve()
			if len(o.free) < maxFreeEffBufs && cap(buf) <= maxKeptEffBuf {
				o.free = append(o.free, buf[:0])
			}
		}
		o.stopCarrying()
	}
	o.mu.Unlock()
}

// serve counts the ticket at the queue's head carried out and wakes its
// owner and the barriers it completes. o.mu is held.
func (o *effOrder) serve() {
	o.served++
	o.wake(o.done, o.served-1)
	o.wake(o.at, o.served)
}

// stopCarrying ends a carrier's hold of the queue: the owner of the
// earliest ticket still queued who waits carries on (handOn); the queue
// empty, its burst's array goes. o.mu is held.
func (o *effOrder) stopCarrying() {
	o.carrying = false
	if len(o.queue) == 0 {
		o.queue = o.queue[:0:0] // let a burst's array go
	} else {
		o.handOn()
	}
}

// run carries out one ticket's effects with do. A panic inside an effect
// (a bug, or a hook's) goes on up the carrier's stack — an application
// that recovers it (net/http does) goes on — but the ticket is counted
// carried out, its waiters woken, and the queue handed on, so the rank's
// later steps do not wait for ever on a carrier that is gone. The
// ticket's effects after the one that panicked are lost, as a control
// message may be. o.mu is not held.
func (o *effOrder) run(do func([]core.Effect), buf []core.Effect) {
	carried := false
	defer func() {
		if carried {
			return
		}
		o.mu.Lock()
		o.serve()
		o.stopCarrying()
		o.mu.Unlock()
	}()
	do(buf)
	carried = true
}

// handOn wakes the owner of the earliest ticket still queued who waits,
// to carry on from served: the next ticket's owner may not have come to
// carry yet (descheduled between its step and its turn), and the owners
// waiting behind it must not wait for it to be run. None waiting: the
// next owner to come carries on. o.mu is held.
func (o *effOrder) handOn() {
	for k := o.served; k < o.next; k++ {
		if ch := o.done[k]; ch != nil {
			close(ch)
			delete(o.done, k)
			return
		}
	}
}

// wake closes and forgets chans[k], if made.
func (o *effOrder) wake(chans map[uint64]chan struct{}, k uint64) {
	if ch := chans[k]; ch != nil {
		close(ch)
		delete(chans, k)
	}
}

// barrier returns a channel closed once every ticket handed out before
// the call is carried out (closed already when none is pending).
func (o *effOrder) barrier() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.served >= o.next {
		return closedChan
	}
	ch := o.at[o.next]
	if ch == nil {
		if o.at == nil {
			o.at = map[uint64]chan struct{}{}
		}
		ch = make(chan struct{})
		o.at[o.next] = ch
	}
	return ch
}

// ordered says whether an effect is carried out in its step's turn (the
// kinds carryOutOrdered carries: hand-offs that never step the core); the
// others (posts, reads, loads, challenges: each may step the core) are
// the step's own goroutine's, after the turn. A kind listed nowhere is
// not ordered: a carrier of the queue never steps the core (it would wait
// for itself). TestEveryEffectKindCarried checks that every kind the core
// has is carried by exactly the carrier this says.
func ordered(k core.EffectKind) bool {
	switch k {
	case core.EffectSend, core.EffectWake, core.EffectResolve, core.EffectWatch, core.EffectReleased,
		core.EffectUnwatch, core.EffectKeepProgress, core.EffectUnload, core.EffectTimer:
		return true
	}
	return false
}
