package pool

import (
	"errors"
	"fmt"
	"time"
)

// The readiness poll: a write (or a pull room's PAGES) whose data is not
// in place yet (a Ready func: a CUDA event not reached) is asked again
// with a back-off from readyPollMin to readyPollMax, and fails with
// ErrNotReady once it has waited the stall bound. One policy: the pool's
// workers ask between their other events (Pool.ready), a caller with
// nothing else to do waits in WaitReady.

// Backoff of the poll of data that is not ready yet.
const (
	readyPollMin = 10 * time.Microsecond
	readyPollMax = 500 * time.Microsecond
)

// errWaitReady: not ready yet, ask again after the back-off.
var errWaitReady = errors.New("transfer: not ready yet")

// readiness is one item's wait for its data.
type readiness struct {
	since time.Time // when it was first found not ready (zero: not waiting)
}

// check takes one answer of Ready (ok, err): nil when the data is in
// place, errWaitReady to ask again later, or the error that fails the item
// — Ready's own (wrapped), or ErrNotReady past stall.
func (r *readiness) check(ok bool, err error, stall time.Duration, now time.Time) error {
	switch {
	case err != nil:
		err = fmt.Errorf("transfer: the data: %w", err)
	case ok:
	case r.since.IsZero():
		r.since = now
		return errWaitReady
	case now.Sub(r.since) < stall:
		return errWaitReady
	default:
		err = fmt.Errorf("%w (%v)", ErrNotReady, stall)
	}
	r.since = time.Time{}
	return err
}

// WaitReady polls ready (nil: ready at once) with the pool's back-off
// until it reports the data in place (nil), fails (its error, wrapped),
// the data is not ready within stall (ErrNotReady), or closing is closed
// (ErrClosed).
func WaitReady(ready func() (bool, error), stall time.Duration, closing <-chan struct{}) error {
	if ready == nil {
		return nil
	}
	var r readiness
	wait := readyPollMin
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		ok, err := ready()
		err = r.check(ok, err, stall, time.Now())
		if !errors.Is(err, errWaitReady) {
			return err
		}
		resetTimer(t, wait)
		select {
		case <-closing:
			return ErrClosed
		case <-t.C:
		}
		wait = min(2*wait, readyPollMax)
	}
}
