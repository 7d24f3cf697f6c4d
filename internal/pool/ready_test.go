package pool

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestWaitReady: the readiness poll a caller waits in (a pull room's PAGES
// held until its data is in place) is the pool's: ready after a few asks,
// a Ready error wrapped, ErrNotReady past the stall bound, ErrClosed when
// the caller closes.
func TestWaitReady(t *testing.T) {
	asks := 0
	assert.NoError(t, WaitReady(func() (bool, error) { asks++; return asks == 3, nil }, time.Minute, nil))
	assert.Equal(t, 3, asks, "asked until ready, not after")
	assert.NoError(t, WaitReady(nil, time.Minute, nil), "no Ready: in place")

	bad := errors.New("event failed")
	assert.ErrorIs(t, WaitReady(func() (bool, error) { return false, bad }, time.Minute, nil), bad)

	res := make(chan error, 1)
	go func() { res <- WaitReady(func() (bool, error) { return false, nil }, 20*time.Millisecond, nil) }()
	select {
	case err := <-res:
		assert.ErrorIs(t, err, ErrNotReady)
	case <-time.After(10 * time.Second): // (500 × the stall bound: a wait that never ends)
		t.Fatal("data never ready: no ErrNotReady 10 s into a 20 ms stall bound")
	}

	closing := make(chan struct{})
	close(closing)
	assert.ErrorIs(t, WaitReady(func() (bool, error) { return false, nil }, time.Minute, closing), ErrClosed)
}
