package control

import (
	"fmt"
	"runtime"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A receive batch stops taking messages once it holds 1 MiB (review of
// issue 24: 32 messages of up to 16 MiB per frame were held at once before
// authentication); what it leaves is taken by the next call, in order.
func TestReceiveBatchBytesCapped(t *testing.T) {
	ctx, err := newZctx()
	require.NoError(t, err)
	pull, err := ctx.socket(zPULL)
	require.NoError(t, err)
	push, err := ctx.socket(zPUSH)
	require.NoError(t, err)
	require.NoError(t, pull.bind("inproc://batch-cap"))
	require.NoError(t, push.connect("inproc://batch-cap"))
	big := make([]byte, 600<<10)
	for i := range 3 {
		big[0] = byte(i)
		require.NoError(t, push.send([][]byte{big, []byte(fmt.Sprint(i))}, 0))
	}
	small := [][]byte{[]byte("a"), []byte("b")}
	require.NoError(t, push.send(small, 0))
	r := newReceiver()
	got := []int{}
	for seen := 0; seen < 4; {
		n, err := r.recv(pull, recvBatch, 0)
		require.NoError(t, err)
		got = append(got, n)
		for i := 0; i < n; i++ {
			if f := r.frames(i); seen < 3 {
				require.Len(t, f, 2, "message %d out of order or cut", seen)
				require.Equal(t, byte(seen), f[0][0], "message %d out of order or cut: %d frames", seen, len(f))
			}
			seen++
		}
	}
	r.free()
	push.close()
	pull.close()
	require.NoError(t, ctx.term())
	// All four were queued (inproc) before the first call: 600 KiB, then
	// 1.2 MiB ≥ 1 MiB stops it at two; the third and the small one follow.
	require.Equal(t, []int{2, 2}, got, "batches, want [2 2]: a batch went on past 1 MiB")
}

// A signal landing on the thread in zmq_bind makes it fail with EINTR (CI:
// "control: bind tcp://127.0.0.1:* (rank decode/decode-0/0): interrupted
// system call"; Go's runtime sends SIGURG to preempt). Binding, connecting
// and setting options retry, as every other ZeroMQ call here does.
func TestSocketCallsRetryAfterSignal(t *testing.T) {
	ctx, err := newZctx()
	require.NoError(t, err)
	defer ctx.term()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pid, tid := syscall.Getpid(), syscall.Gettid()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				_ = syscall.Tgkill(pid, tid, syscall.SIGURG)
			}
		}
	}()
	defer func() { close(stop); <-done }()
	for i := range 300 {
		s, err := ctx.socket(zPULL)
		require.NoError(t, err, "socket %d", i)
		if !assert.NoError(t, s.setInt(zLinger, 0), "setsockopt %d", i) {
			s.close()
			t.FailNow()
		}
		if !assert.NoError(t, s.bind("tcp://127.0.0.1:*"), "bind %d", i) {
			s.close()
			t.FailNow()
		}
		if _, err := s.lastEndpoint(); !assert.NoError(t, err, "last endpoint %d", i) {
			s.close()
			t.FailNow()
		}
		// More binds without a descriptor each: more chances for a
		// signal to land inside one (with 30 per socket the unretried
		// bind failed 14 runs in 20, with 200 20 in 20).
		for j := range 200 {
			if !assert.NoError(t, s.bind("inproc://retry-"+strconv.Itoa(i)+"-"+strconv.Itoa(j)), "bind %d.%d", i, j) {
				s.close()
				t.FailNow()
			}
		}
		if !assert.NoError(t, s.connect("inproc://nobody-"+strconv.Itoa(i)), "connect %d", i) {
			s.close()
			t.FailNow()
		}
		s.close()
	}
}
