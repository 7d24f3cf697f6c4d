package control

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/ident"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/internal/wire/wiretest"
	"golang.org/x/crypto/chacha20poly1305"

	zmq "github.com/pebbe/zmq4"
	"github.com/stretchr/testify/require"
)

// bareZMQ is the reference: PUSH/PULL over tcp loopback with pebbe/zmq4
// and nothing else (no codec, no hand-off, no handler), carrying the same
// three frames kvbridge sends. With shared false each end has its own
// context (its own I/O thread), as two ranks, in two processes or in this
// benchmark, do; shared puts all four sockets on one context (one I/O
// thread for both ends), the reference's setup before issue 24.
type bareZMQ struct {
	ctxA, ctxB *zmq.Context
	push, pull *zmq.Socket
	// echo side
	backPush, backPull *zmq.Socket
}

func newBare(tb testing.TB, shared bool) *bareZMQ {
	ctxA, err := zmq.NewContext()
	require.NoError(tb, err)
	ctxB := ctxA
	if !shared {
		ctxB, err = zmq.NewContext()
		require.NoError(tb, err)
	}
	z := &bareZMQ{ctxA: ctxA, ctxB: ctxB}
	mk := func(ctx *zmq.Context, t zmq.Type) *zmq.Socket {
		s, err := ctx.NewSocket(t)
		require.NoError(tb, err)
		s.SetLinger(0)
		s.SetSndhwm(100000)
		s.SetRcvhwm(100000)
		return s
	}
	// A sends on push and receives on backPull; B the other way round.
	z.pull, z.backPull = mk(ctxB, zmq.PULL), mk(ctxA, zmq.PULL)
	z.pull.Bind("tcp://127.0.0.1:*")
	z.backPull.Bind("tcp://127.0.0.1:*")
	ep1, _ := z.pull.GetLastEndpoint()
	ep2, _ := z.backPull.GetLastEndpoint()
	z.push, z.backPush = mk(ctxA, zmq.PUSH), mk(ctxB, zmq.PUSH)
	z.push.Connect(ep1)
	z.backPush.Connect(ep2)
	return z
}

func (z *bareZMQ) close() {
	for _, s := range []*zmq.Socket{z.push, z.pull, z.backPush, z.backPull} {
		s.Close()
	}
	z.ctxA.Term()
	if z.ctxB != z.ctxA {
		z.ctxB.Term()
	}
}

func benchFrames(tb testing.TB) [][]byte {
	f, err := wire.Encode(&wire.Abort{From: wiretest.SampleFrom(wire.RoleDecode), Room: 123456, Reason: "benchmark"})
	require.NoError(tb, err)
	return f
}

// bareThroughput sends n messages one way and returns the time until the
// last one is received.
func (z *bareZMQ) throughput(n int, frames [][]byte) time.Duration {
	start := time.Now()
	done := make(chan struct{})
	go func() {
		for i := 0; i < n; i++ {
			z.pull.RecvMessageBytes(0)
		}
		close(done)
	}()
	for i := 0; i < n; i++ {
		z.push.SendMessage(frames)
	}
	<-done
	return time.Since(start)
}

// bareRoundTrip runs n sequential round trips through an echo goroutine.
func (z *bareZMQ) roundTrip(n int, frames [][]byte) time.Duration {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < n; i++ {
			m, _ := z.pull.RecvMessageBytes(0)
			z.backPush.SendMessage(m)
		}
	}()
	start := time.Now()
	for i := 0; i < n; i++ {
		z.push.SendMessage(frames)
		z.backPull.RecvMessageBytes(0)
	}
	d := time.Since(start)
	wg.Wait()
	return d
}

// cpuTime is the process's CPU time so far (user + system, every thread).
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	require.NoError(tb, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measure runs f and returns its wall and CPU time.
func measure(tb testing.TB, f func()) (wall, cpu time.Duration) {
	c0, t0 := cpuTime(tb), time.Now()
	f()
	return time.Since(t0), cpuTime(tb) - c0
}

// interleave runs n iterations of each path in rounds of n/rounds (every
// path once per round, in turn), so that the machine's load drifting
// during the benchmark weighs on every path alike, and returns each path's
// total wall and CPU time.
func interleave(tb testing.TB, n int, paths ...func(n int)) (wall, cpu []time.Duration) {
	const rounds = 10
	wall, cpu = make([]time.Duration, len(paths)), make([]time.Duration, len(paths))
	for r := 0; r < rounds; r++ {
		k := n/rounds + boolInt(r < n%rounds)
		if k == 0 {
			continue
		}
		for i, f := range paths {
			w, c := measure(tb, func() { f(k) })
			wall[i] += w
			cpu[i] += c
		}
	}
	return wall, cpu
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// reportCPU adds CPU µs per message (or round trip) of the paths.
func reportCPU(b *testing.B, kvb, bare, shared time.Duration, unit string) {
	b.ReportMetric(float64(kvb.Nanoseconds())/1e3/float64(b.N), "kvbridge-cpu-µs/"+unit)
	b.ReportMetric(float64(bare.Nanoseconds())/1e3/float64(b.N), "zmq-cpu-µs/"+unit)
	b.ReportMetric(float64(shared.Nanoseconds())/1e3/float64(b.N), "zmq1ctx-cpu-µs/"+unit)
}

type benchPair struct {
	a, b *Loop
	// onA and onB are what each rank's handler does with a message (set
	// before a phase starts, read on the receive goroutines).
	onA, onB atomic.Pointer[func(wire.Message)]
}

// benchMode is how a control benchmark's ranks authenticate: the shared
// secret (auth, the default), per-rank identity (each rank its certificate,
// messages keyed by the pair's key), or not at all (Insecure).
type benchMode int

const (
	benchAuth benchMode = iota
	benchIdentity
	benchInsecure
)

// benchIDs are the two ranks' identities in benchIdentity mode.
var benchIDs = sync.OnceValues(func() ([2]*ident.RankIdentity, error) {
	var ids [2]*ident.RankIdentity
	ca, err := ident.NewCA()
	if err != nil {
		return ids, err
	}
	for i, role := range []string{wire.RoleDecode, wire.RolePrefill} {
		if ids[i], err = ca.Issue(role, []string{"a", "b"}[i], 0, time.Now().Add(time.Hour)); err != nil {
			return ids, err
		}
	}
	return ids, nil
})

// newBenchPair starts two loops in the given mode. Like the bare
// reference, the handlers do the benchmark's work on the receive goroutine
// (count, answer), with no hand-off to another goroutine.
func newBenchPair(b *testing.B, mode benchMode) *benchPair {
	p := &benchPair{}
	var err error
	auth, insecure := testAuth(), mode == benchInsecure
	if insecure {
		auth = nil
	}
	var ids [2]*ident.RankIdentity
	if mode == benchIdentity {
		ids, err = benchIDs()
		require.NoError(b, err)
	}
	call := func(f *atomic.Pointer[func(wire.Message)]) func(wire.Message) {
		return func(m wire.Message) {
			if h := f.Load(); h != nil {
				(*h)(m)
			}
		}
	}
	p.a, err = NewLoop(LoopConfig{Identity: wire.From{Role: wire.RoleDecode, Instance: "a"}, Bind: "tcp://127.0.0.1:*",
		Handler: call(&p.onA), SendHWM: 100000, Auth: auth, Insecure: insecure, RankIdentity: ids[0]})
	require.NoError(b, err)
	p.b, err = NewLoop(LoopConfig{Identity: wire.From{Role: wire.RolePrefill, Instance: "b"}, Bind: "tcp://127.0.0.1:*",
		SendHWM: 100000, Auth: auth, Insecure: insecure, Handler: call(&p.onB), RankIdentity: ids[1]})
	require.NoError(b, err)
	return p
}

func (p *benchPair) close() { p.a.Close(); p.b.Close() }

// countTo returns a handler that closes done at the n-th ABORT.
func countTo(n int, done chan struct{}) func(wire.Message) {
	var got int
	return func(m wire.Message) {
		if _, ok := m.(*wire.Abort); !ok {
			return
		}
		if got++; got == n {
			close(done)
		}
	}
}

// modes runs a control benchmark authenticated with the secret (the
// default), under per-rank identity, and Insecure.
func modes(b *testing.B, f func(b *testing.B, mode benchMode)) {
	b.Run("auth", func(b *testing.B) { f(b, benchAuth) })
	b.Run("identity", func(b *testing.B) { f(b, benchIdentity) })
	b.Run("insecure", func(b *testing.B) { f(b, benchInsecure) })
}

// peerOf addresses the loop l (under per-rank identity, with its
// certificate).
func peerOf(l *Loop, epoch bool) wire.Peer {
	p := wire.Peer{Endpoint: l.Endpoint(), Cert: string(l.Cert())}
	if epoch {
		p.Epoch = l.Identity().Epoch
	}
	return p
}

// BenchmarkControlThroughput: one-way message rate between two ranks on
// loopback, kvbridge (encode, tag, send, receive, check, decode, handler)
// against bare ZeroMQ in the same run, with the CPU time of each. The
// reference (zmq, ratio) gives each end its own context as the two ranks
// have; zmq1ctx and ratio1ctx are the same with one context for both;
// thin and ratio-thin are the reference on kvbridge's own binding with
// the frames a rank sends (sealed with Auth), one context per end.
func BenchmarkControlThroughput(b *testing.B) { modes(b, controlThroughput) }

func controlThroughput(b *testing.B, mode benchMode) {
	frames, sealed := benchFrames(b), thinFrames(b, mode)
	z, z1, zt := newBare(b, false), newBare(b, true), newThin(b)
	defer z.close()
	defer z1.close()
	defer zt.close()
	p := newBenchPair(b, mode)
	defer p.close()
	to := peerOf(p.b, true)
	run := func(n int) {
		done := make(chan struct{})
		h := countTo(n, done)
		p.onB.Store(&h)
		for i := 0; i < n; i++ {
			if err := p.a.Send(to, &wire.Abort{Room: uint64(i), Reason: "benchmark"}); err != nil {
				b.Fatal(err)
			}
		}
		<-done
	}
	// Warm every path (connections, allocations).
	z.throughput(1000, frames)
	z1.throughput(1000, frames)
	zt.throughput(b, 1000, sealed)
	run(1000)
	b.ResetTimer()
	wall, cpu := interleave(b, b.N, func(n int) { z.throughput(n, frames) }, func(n int) { z1.throughput(n, frames) }, run,
		func(n int) { zt.throughput(b, n, sealed) })
	bare, shared, kvb, thin := wall[0], wall[1], wall[2], wall[3]
	bareCPU, sharedCPU, kvbCPU := cpu[0], cpu[1], cpu[2]
	b.StopTimer()
	b.ReportMetric(float64(b.N)/thin.Seconds(), "thin-msgs/s")
	b.ReportMetric(thin.Seconds()/kvb.Seconds(), "ratio-thin")
	b.ReportMetric(float64(cpu[3].Nanoseconds())/1e3/float64(b.N), "thin-cpu-µs/msg")
	require.Zero(b, p.a.Stats().Dropped[DropPeerBusy], "messages dropped as peer_busy")
	b.ReportMetric(float64(b.N)/kvb.Seconds(), "kvbridge-msgs/s")
	b.ReportMetric(float64(b.N)/bare.Seconds(), "zmq-msgs/s")
	b.ReportMetric(float64(b.N)/shared.Seconds(), "zmq1ctx-msgs/s")
	b.ReportMetric(bare.Seconds()/kvb.Seconds(), "ratio")
	b.ReportMetric(shared.Seconds()/kvb.Seconds(), "ratio1ctx")
	reportCPU(b, kvbCPU, bareCPU, sharedCPU, "msg")
}

// BenchmarkControlRoundTrip: sequential request/answer latency, kvbridge
// against a bare ZeroMQ echo in the same run, with the CPU time of each
// (the references as in BenchmarkControlThroughput). Each answer's handler
// sends the next request, as the bare reference's loop does.
func BenchmarkControlRoundTrip(b *testing.B) { modes(b, controlRoundTrip) }

func controlRoundTrip(b *testing.B, mode benchMode) {
	frames, sealed := benchFrames(b), thinFrames(b, mode)
	z, z1, zt := newBare(b, false), newBare(b, true), newThin(b)
	defer z.close()
	defer z1.close()
	defer zt.close()
	p := newBenchPair(b, mode)
	defer p.close()
	to, back := peerOf(p.b, true), peerOf(p.a, false)
	echo := func(m wire.Message) {
		if a, ok := m.(*wire.Abort); ok {
			p.b.Send(back, &wire.Abort{Room: a.Room, Reason: "benchmark"})
		}
	}
	p.onB.Store(&echo)
	run := func(n int) {
		done := make(chan struct{})
		var got int
		next := func(m wire.Message) {
			if _, ok := m.(*wire.Abort); !ok {
				return
			}
			if got++; got == n {
				close(done)
				return
			}
			p.a.Send(to, &wire.Abort{Room: uint64(got), Reason: "benchmark"})
		}
		p.onA.Store(&next)
		require.NoError(b, p.a.Send(to, &wire.Abort{Reason: "benchmark"}))
		<-done
	}
	z.roundTrip(200, frames)
	z1.roundTrip(200, frames)
	zt.roundTrip(b, 200, sealed)
	run(200)
	b.ResetTimer()
	wall, cpu := interleave(b, b.N, func(n int) { z.roundTrip(n, frames) }, func(n int) { z1.roundTrip(n, frames) }, run,
		func(n int) { zt.roundTrip(b, n, sealed) })
	bare, shared, kvb, thin := wall[0], wall[1], wall[2], wall[3]
	bareCPU, sharedCPU, kvbCPU := cpu[0], cpu[1], cpu[2]
	b.StopTimer()
	b.ReportMetric(float64(thin.Nanoseconds())/1e3/float64(b.N), "thin-µs/rtt")
	b.ReportMetric(thin.Seconds()/kvb.Seconds(), "ratio-thin")
	b.ReportMetric(float64(cpu[3].Nanoseconds())/1e3/float64(b.N), "thin-cpu-µs/rtt")
	b.ReportMetric(float64(kvb.Nanoseconds())/1e3/float64(b.N), "kvbridge-µs/rtt")
	b.ReportMetric(float64(bare.Nanoseconds())/1e3/float64(b.N), "zmq-µs/rtt")
	b.ReportMetric(float64(shared.Nanoseconds())/1e3/float64(b.N), "zmq1ctx-µs/rtt")
	b.ReportMetric(bare.Seconds()/kvb.Seconds(), "ratio")
	b.ReportMetric(shared.Seconds()/kvb.Seconds(), "ratio1ctx")
	reportCPU(b, kvbCPU, bareCPU, sharedCPU, "rtt")
}

func BenchmarkDecode(b *testing.B) {
	for _, m := range []wire.Message{wiretest.SampleMessages()[0], wiretest.SampleMessages()[2]} {
		frames, _ := wire.Encode(m)
		b.Run(m.Type().String(), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(frames[2])))
			for i := 0; i < b.N; i++ {
				if _, err := wire.Decode(frames); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	m := wiretest.SampleMessages()[2]
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := wire.Encode(m); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAuth: tagging and checking one ABORT's frames.
func BenchmarkAuth(b *testing.B) {
	a := testSealer()
	frames := benchFrames(b)
	b.ReportAllocs()
	to := wire.From{Role: wire.RolePrefill, Instance: "p", Rank: 3, Epoch: 7}
	for i := 0; i < b.N; i++ {
		now := time.Now()
		if _, _, why := a.open(a.seal(nil, frames[:3:3], Envelope{Sent: now, Seq: uint64(i + 1), To: to}), now, nil); why != "" {
			b.Fatal(why)
		}
	}
}

// BenchmarkTagCandidates: what tagging the bytes an HMAC covers for an
// ABORT (its three frames, each with its length, and its envelope) costs
// with the HMAC-SHA256 kvbridge uses and with the candidates to replace it
// (issue 52, item 3): XChaCha20-Poly1305 over them as associated data, as
// the sealed bodies' cipher, and AES-256-GCM as a MAC (GMAC). One tag per
// op, nothing checked: the primitives alone.
func BenchmarkTagCandidates(b *testing.B) {
	frames := Seal(testAuth(), benchFrames(b)[:3:3], Envelope{Sent: time.Now(), Seq: 1, To: wiretest.SampleFrom(wire.RolePrefill)})
	var msg []byte
	for _, f := range frames[:3] {
		msg = binary.LittleEndian.AppendUint32(msg, uint32(len(f)))
		msg = append(msg, f...)
	}
	msg = append(msg, frames[3][:len(frames[3])-tagBytes]...)
	key := make([]byte, 32)
	b.Run(fmt.Sprintf("hmac-sha256/%dB", len(msg)), func(b *testing.B) {
		h := hmac.New(sha256.New, key)
		var sum [sha256.Size]byte
		for range b.N {
			h.Reset()
			h.Write(msg)
			h.Sum(sum[:0])
		}
	})
	aead := func(b *testing.B, c cipher.AEAD) {
		nonce := make([]byte, c.NonceSize())
		out := make([]byte, 0, c.Overhead())
		for i := range b.N {
			binary.LittleEndian.PutUint64(nonce, uint64(i))
			out = c.Seal(out[:0], nonce, nil, msg)
		}
	}
	b.Run(fmt.Sprintf("xchacha20poly1305/%dB", len(msg)), func(b *testing.B) {
		c, err := chacha20poly1305.NewX(key)
		require.NoError(b, err)
		aead(b, c)
	})
	b.Run(fmt.Sprintf("gmac-aes256/%dB", len(msg)), func(b *testing.B) {
		blk, err := aes.NewCipher(key)
		require.NoError(b, err)
		c, err := cipher.NewGCM(blk)
		require.NoError(b, err)
		aead(b, c)
	})
}

// BenchmarkAuthPair: the same ABORT tagged with a pair key under per-rank
// identity and checked by the receiver (its certificate cache warm, as
// for every message after a peer's first), with the receiver's replay
// window: the cost per message next to BenchmarkAuth's, in the same run.
func BenchmarkAuthPair(b *testing.B) {
	a := testSealer()
	ca, err := ident.NewCA()
	require.NoError(b, err)
	dec, _ := ca.Issue(wire.RoleDecode, "d", 0, time.Now().Add(time.Hour))
	pre, _ := ca.Issue(wire.RolePrefill, "p", 3, time.Now().Add(time.Hour))
	send := newAddressing(a, dec, wire.RoleDecode)
	recv := newAddressing(a, pre, wire.RolePrefill)
	frames := benchFrames(b)
	m, err := wire.Decode(frames)
	require.NoError(b, err)
	self := wire.From{Role: wire.RolePrefill, Instance: "p", Rank: 3, Epoch: 7}
	to := wire.Peer{Endpoint: "tcp://127.0.0.1:1", Cert: string(pre.Cert.Raw()), Epoch: 7}
	env, key, err := send.envelope(to)
	require.NoError(b, err)
	m.(*wire.Abort).From = wire.From{Role: wire.RoleDecode, Instance: "d", Rank: 0, Endpoint: "tcp://127.0.0.1:2", Epoch: 9}
	frames, _ = wire.Encode(m)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now := time.Now()
		env.Sent, env.Seq = now, send.nextSeq()
		opened, e, why := a.open(a.seal(key, frames[:3:3], env), now, recv.keyFor(now))
		if why != "" {
			b.Fatal(why)
		}
		if why, _ := recv.check(self, m, e, now); why != "" {
			b.Fatal(why)
		}
		_ = opened
	}
}

// BenchmarkEd25519PerMessage: what signing every message instead would
// cost (sign at the sender, verify at the receiver), the alternative
// PROTOCOL.md "Per-rank identity" sets aside.
func BenchmarkEd25519PerMessage(b *testing.B) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	frames := benchFrames(b)
	msg := bytes.Join(frames, nil)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if !ed25519.Verify(pub, msg, ed25519.Sign(priv, msg)) {
			b.Fatal("verify")
		}
	}
}

// BenchmarkMessagePath: the Go side of one message without the sockets:
// the sender's encode, address and seal, the receiver's open, decode,
// checks and handler (both loops real, their sockets idle), authenticated
// and Insecure. What the control benchmarks spend besides ZeroMQ.
func BenchmarkMessagePath(b *testing.B) {
	modes(b, func(b *testing.B, mode benchMode) {
		p := newBenchPair(b, mode)
		defer p.close()
		to := peerOf(p.b, true)
		var got int
		h := func(wire.Message) { got++ }
		p.onB.Store(&h)
		var limiter logLimiter
		var sc scratch
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			m := &wire.Abort{Room: uint64(i), Reason: "benchmark"}
			wire.SetFrom(m, p.a.id)
			o, err := p.a.encode(to, m)
			if err != nil {
				b.Fatal(err)
			}
			if _, it, ok := p.b.admit(p.a.wire(o, &sc, o.at), time.Now(), &limiter); ok {
				p.b.handle(it) // as the receive goroutine does with nothing waiting
			}
			o.release() // as a send does (the handler kept nothing of the body)
		}
		b.StopTimer()
		require.EqualValues(b, b.N, got, "messages reached the handler, of %d", b.N)
	})
}
