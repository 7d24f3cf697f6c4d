package control

import (
	"syscall"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/stretchr/testify/require"
)

// A receive loop paces itself through errors (issue 24's review: a socket
// that kept failing was retried at once, a silent loop at 100 % of a core):
// EINTR retries at once, other errors back off from 1 ms to 100 ms, a
// received message resets the pace.
func TestRecvPace(t *testing.T) {
	var p recvPace
	p.fail(zmq.Errno(syscall.EINTR))
	require.Zero(t, p.d, "EINTR paced")
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 100, 100}
	for i, w := range want {
		p.fail(zmq.Errno(syscall.ENOTSOCK))
		require.Equal(t, w*time.Millisecond, p.d, "error %d: paced", i+1)
	}
	p.ok()
	require.Zero(t, p.d, "a message did not reset the pace")
}
