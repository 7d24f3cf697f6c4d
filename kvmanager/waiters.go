package kvmanager

import (
	"sync"

	"github.com/kvbridge/kvbridge/internal/core"
)

// The shell's waiters. The core makes no channel: it says whether a wake
// is still to come (Core.Pending, Hold, PullHold) and emits an EffectWake
// when it comes. A caller that waits asks for its channel under the core's
// lock, in the same critical section as that answer, so no wake can fall
// between them; the wake effect, carried out in step order, closes it.

// waitKey names one waited-for event of one room.
type waitKey struct {
	room uint64
	wake core.Wake
}

// waiters holds the channels callers wait on. mu is a leaf lock: taken
// under the Manager's mu (to make a channel) or in a step's turn (to close one).
type waiters struct {
	mu    sync.Mutex
	chans map[waitKey]chan struct{}
}

// on returns the channel closed when room's wake is carried out, making it
// on the first ask. The caller holds the Manager's mu and saw the core say
// the wake is still to come.
func (w *waiters) on(room uint64, wake core.Wake) chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := waitKey{room, wake}
	ch := w.chans[k]
	if ch == nil {
		if w.chans == nil {
			w.chans = map[waitKey]chan struct{}{}
		}
		ch = make(chan struct{})
		w.chans[k] = ch
	}
	return ch
}

// wake closes room's channel for wake, if anyone asked for it.
func (w *waiters) wake(room uint64, wake core.Wake) {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := waitKey{room, wake}
	if ch := w.chans[k]; ch != nil {
		close(ch)
		delete(w.chans, k)
	}
}

// size is the number of channels held (a bounded table: one per waited
// event of a live room or a held page set).
func (w *waiters) size() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.chans)
}

// woken returns a channel closed once the effects of the steps before this
// call are carried out: the wait for a wake the core already emitted, whose
// effect may still be on its way (waits in step order, as a channel
// closed by that effect would).
func (m *Manager) woken() <-chan struct{} { return m.eff.barrier() }
