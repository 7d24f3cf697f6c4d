package control

import (
	"sync"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/internal/wire/wiretest"
	"github.com/stretchr/testify/require"
)

// thinZMQ is the reference on kvbridge's own ZeroMQ binding (one C call
// per message sent, a batch of messages per C call received, each copied
// to Go memory of its own, as a binding that hands its caller the
// messages must; the loop's receive goroutine, which keeps no byte of
// them, copies each into memory it reuses), one context per end as two
// ranks have, carrying the very frames a rank sends: the three message
// frames, and with Auth the envelope frame too (sealed once: the
// reference checks nothing). What kvbridge adds over it is its own work:
// encode, address, seal, open, check, decode, handler.
type thinZMQ struct {
	ctxA, ctxB                     *zctx
	push, pull, backPush, backPull *zsock
	rA, rB                         *receiver
}

func newThin(tb testing.TB) *thinZMQ {
	z := &thinZMQ{rA: newReceiver(), rB: newReceiver()}
	var err error
	z.ctxA, err = newZctx()
	require.NoError(tb, err)
	z.ctxB, err = newZctx()
	require.NoError(tb, err)
	mk := func(s *zsock, err error) *zsock {
		require.NoError(tb, err)
		for _, err := range []error{s.setInt(zLinger, 0), s.setInt(zSndhwm, 100000), s.setInt(zRcvhwm, 100000)} {
			require.NoError(tb, err)
		}
		return s
	}
	// A sends on push and receives on backPull; B the other way round.
	z.pull, z.backPull = mk(z.ctxB.socket(zPULL)), mk(z.ctxA.socket(zPULL))
	for _, s := range []*zsock{z.pull, z.backPull} {
		require.NoError(tb, s.bind("tcp://127.0.0.1:*"))
	}
	ep1, _ := z.pull.lastEndpoint()
	ep2, _ := z.backPull.lastEndpoint()
	z.push, z.backPush = mk(z.ctxA.socket(zPUSH)), mk(z.ctxB.socket(zPUSH))
	require.NoError(tb, z.push.connect(ep1))
	require.NoError(tb, z.backPush.connect(ep2))
	return z
}

func (z *thinZMQ) close() {
	for _, s := range []*zsock{z.push, z.pull, z.backPush, z.backPull} {
		s.close()
	}
	z.rA.free()
	z.rB.free()
	z.ctxA.term()
	z.ctxB.term()
}

// thinFrames are the frames a rank sends for benchFrames' message: with
// Auth sealed (an envelope addressed to a peer; under per-rank identity as
// the first bench rank to the second), else the three frames.
func thinFrames(tb testing.TB, mode benchMode) [][]byte {
	f := benchFrames(tb)
	to := wiretest.SampleFrom(wire.RolePrefill)
	switch mode {
	case benchInsecure:
		return f
	case benchIdentity:
		ids, err := benchIDs()
		require.NoError(tb, err)
		sealed, err := SealAs(testAuth(), ids[0], ids[1].Cert.Raw(), f[:3:3], Envelope{Sent: time.Now(), Seq: 1, To: certIdentity(ids[1].Cert)})
		require.NoError(tb, err)
		return sealed
	}
	return Seal(testAuth(), f[:3:3], Envelope{Sent: time.Now(), Seq: 1, To: to})
}

// recvN receives n messages on s into r, copying each out.
func recvN(tb testing.TB, r *receiver, s *zsock, n int) {
	for got := 0; got < n; {
		k, err := r.recv(s, recvBatch, 0)
		if err != nil {
			tb.Error(err)
			return
		}
		for i := 0; i < k; i++ {
			r.frames(i)
		}
		got += k
	}
}

// throughput sends n messages one way and returns when the last one is
// received.
func (z *thinZMQ) throughput(tb testing.TB, n int, frames [][]byte) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); recvN(tb, z.rB, z.pull, n) }()
	for i := 0; i < n; i++ {
		if err := z.push.send(frames, 0); err != nil {
			tb.Fatal(err)
		}
	}
	wg.Wait()
}

// roundTrip runs n sequential round trips through an echo goroutine that
// sends back what it received.
func (z *thinZMQ) roundTrip(tb testing.TB, n int, frames [][]byte) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < n; i++ {
			if _, err := z.rB.recv(z.pull, 1, 0); err != nil {
				tb.Error(err)
				return
			}
			if err := z.backPush.send(z.rB.frames(0), 0); err != nil {
				tb.Error(err)
				return
			}
		}
	}()
	for i := 0; i < n; i++ {
		if err := z.push.send(frames, 0); err != nil {
			tb.Fatal(err)
		}
		recvN(tb, z.rA, z.backPull, 1)
	}
	wg.Wait()
}
