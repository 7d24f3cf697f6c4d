package control

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/internal/wire/wiretest"
	"go.uber.org/zap"

	zmq "github.com/pebbe/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recvTimeout bounds every wait for a message in these tests; it is a
// deadlock guard, not a performance assertion.
const recvTimeout = 10 * time.Second

type testRank struct {
	*Loop
	msgs      chan wire.Message
	down      chan PeerDown
	malformed chan MalformedReport
}

// testSecret is the shared secret of the test ranks (and of the child
// process the tests start).
var testSecret = []byte("kvbridge-test-secret-0123456789")

func testAuth() *bootstrap.Auth {
	a, err := bootstrap.NewAuth(testSecret)
	if err != nil {
		panic(err)
	}
	return a
}

// testSealer seals and opens as a loop with testAuth does.
func testSealer() *sealer { return mustSealer(testAuth()) }

// fixedSaltSealer is a testSealer whose salt is first, first+1, …
// (golden files and fuzz seeds must be the same bytes in every process).
func fixedSaltSealer(tb testing.TB, first byte) *sealer {
	a := testSealer()
	for i := range a.salt {
		a.salt[i] = first + byte(i)
	}
	var err error
	a.self, err = deriveCipher(tagLabel, a.Secret, a.salt[:])
	require.NoError(tb, err)
	return a
}

// testSeq numbers the messages the tests seal themselves, far above any
// number a real loop reaches in a test, so a test's message never
// duplicates a real rank's.
var testSeq atomic.Uint64

func init() { testSeq.Store(1 << 40) }

// sealed adds the test secret's authentication frame, addressed to the
// receiver's identity and epoch, as a rank would.
func sealed(to wire.From, frames [][]byte) [][]byte {
	return Seal(testAuth(), append([][]byte(nil), frames...), Envelope{Sent: time.Now(), Seq: testSeq.Add(1), To: to})
}

func newRank(t *testing.T, role, instance string, mut func(*LoopConfig)) *testRank {
	t.Helper()
	r := &testRank{msgs: make(chan wire.Message, 10000), down: make(chan PeerDown, 16), malformed: make(chan MalformedReport, 16)}
	cfg := LoopConfig{Identity: wire.From{Role: role, Instance: instance, Rank: 0}, Bind: "tcp://127.0.0.1:*", Auth: testAuth(),
		Handler: func(m wire.Message) {
			if _, pong := m.(*wire.Pong); !pong { // the heartbeat's; the tests look at the rest
				r.msgs <- m
			}
		},
		OnPeerDown:         func(p PeerDown) { r.down <- p },
		OnMalformedRequest: func(m MalformedReport) { r.malformed <- m }}
	if mut != nil {
		mut(&cfg)
	}
	l, err := NewLoop(cfg)
	require.NoError(t, err)
	r.Loop = l
	t.Cleanup(func() {
		assert.NoError(t, l.Close())
	})
	return r
}

func (r *testRank) peer() wire.Peer {
	return wire.Peer{Endpoint: r.Endpoint(), ServerKey: r.PublicKey(), Epoch: r.Identity().Epoch, Cert: string(r.Cert())}
}

func (r *testRank) next(t *testing.T) wire.Message {
	t.Helper()
	select {
	case m := <-r.msgs:
		return m
	case <-time.After(recvTimeout):
		t.Fatalf("%s: no message within %v", r.Identity().Peer(), recvTimeout)
		return nil
	}
}

func TestLoopExchangesEveryType(t *testing.T) {
	decode := newRank(t, wire.RoleDecode, "d", nil)
	prefill := newRank(t, wire.RolePrefill, "p", nil)
	samples := wiretest.SampleMessages()
	for _, m := range samples {
		if _, ok := m.(*wire.Ping); ok {
			continue // PING and PONG are the loop's own; see the heartbeat tests
		}
		if _, ok := m.(*wire.Pong); ok {
			continue
		}
		from, to := decode, prefill
		if m.Sender().Role == wire.RolePrefill {
			from, to = prefill, decode
		}
		require.NoError(t, from.Send(to.peer(), m))
		got := to.next(t)
		require.Equal(t, m, got, "%v", m.Type())
		require.Equal(t, from.Identity(), got.Sender(), "from")
		require.Equal(t, from.Endpoint(), got.Sender().Endpoint, "from = %+v, want %+v", got.Sender(), from.Identity())
	}
	// PING is answered with PONG by the loop itself: a watched peer stays alive.
	require.NoError(t, decode.Watch(prefill.peer()))
	s := prefill.Stats()
	require.Zero(t, s.MalformedTotal(), "malformed: %+v", s.Malformed)
}

// TestReceivedMessagesKeepTheirBytes: messages a handler keeps stay as
// they were sent while later ones arrive. The receive goroutine reads each
// message into memory it reuses for the next (receiver.reused), so nothing
// a decoded message keeps (a REGISTER's agent metadata, proof and echo, a
// name, a page list) may point into it; with the secret, and under
// per-rank identity, whose bodies are opened in place. Every message is
// sent before any is looked at, each type after another type (different
// bytes over the same memory), then an ABORT whose reason fills it.
func TestReceivedMessagesKeepTheirBytes(t *testing.T) {
	_, did, pid := identities(t)
	for _, mode := range []struct {
		name string
		d, p func(*LoopConfig)
	}{{"secret", nil, nil}, {"identity", withIdentity(did), withIdentity(pid)}} {
		t.Run(mode.name, func(t *testing.T) {
			decode := newRank(t, wire.RoleDecode, "d", mode.d)
			prefill := newRank(t, wire.RolePrefill, "p", mode.p)
			fill := strings.Repeat("z", wire.MaxReasonBytes)
			var toPrefill, toDecode []wire.Message
			var msgs []wire.Message
			for _, m := range wiretest.SampleMessages() {
				switch m := m.(type) {
				case *wire.Ping, *wire.Pong: // the loop's own
					continue
				case *wire.Register: // and one with an echo (not sealed: the decoder's bytes as they are)
					c := *m
					c.Echo = []byte("a restart probe's echo")
					msgs = append(msgs, &c)
				case *wire.RegisterAck:
					c := *m
					c.Echo = []byte("the probe's echo, answered")
					msgs = append(msgs, &c)
				}
				msgs = append(msgs, m)
			}
			for _, m := range msgs {
				from, to, list := decode, prefill, &toPrefill
				if m.Sender().Role == wire.RolePrefill {
					from, to, list = prefill, decode, &toDecode
				}
				require.NoError(t, from.Send(to.peer(), m))
				*list = append(*list, m)
			}
			for _, r := range []*testRank{decode, prefill} {
				other := prefill
				if r == prefill {
					other = decode
				}
				m := &wire.Abort{Room: 1, Reason: fill}
				require.NoError(t, r.Send(other.peer(), m))
				if r == decode {
					toPrefill = append(toPrefill, m)
				} else {
					toDecode = append(toDecode, m)
				}
			}
			var gotPrefill, gotDecode []wire.Message
			for range toPrefill {
				gotPrefill = append(gotPrefill, prefill.next(t))
			}
			for range toDecode {
				gotDecode = append(gotDecode, decode.next(t))
			}
			require.Equal(t, toPrefill, gotPrefill, "what the prefill rank's handler kept")
			require.Equal(t, toDecode, gotDecode, "what the decode rank's handler kept")
		})
	}
}

// rawPush is a bare ZeroMQ client that sends whatever frames it is given.
func rawPush(t *testing.T, endpoint string) *zmq.Socket {
	t.Helper()
	ctx, err := zmq.NewContext()
	require.NoError(t, err)
	s, err := ctx.NewSocket(zmq.PUSH)
	require.NoError(t, err)
	s.SetLinger(2 * time.Second)
	require.NoError(t, s.Connect(endpoint))
	t.Cleanup(func() { s.Close(); ctx.Term() })
	return s
}

func TestLoopSurvivesGarbage(t *testing.T) {
	prefill := newRank(t, wire.RolePrefill, "p", nil)
	decode := newRank(t, wire.RoleDecode, "d", nil)
	raw := rawPush(t, prefill.Endpoint())

	// The raw socket speaks as another process of the decode rank: its
	// message numbers are the test's, not the real loop's.
	rawFrom := decode.Identity()
	rawFrom.Epoch++
	good := func(room uint64) [][]byte {
		f, err := wire.Encode(&wire.Abort{From: rawFrom, Room: room, Reason: "ok"})
		require.NoError(t, err)
		return f
	}
	okBody := good(0)[2]
	// A REQUEST with required 0 that still names its room and sender: the
	// loop reports it, so the rank can answer (STATUS failed) at once.
	badReq := wiretest.EncodeMap(t, map[string]any{"from": map[string]any{"role": "decode", "instance": "d", "rank": 0,
		"endpoint": decode.Endpoint(), "epoch": 1}, "room": 77, "dst_pages": []byte{}, "aux_index": -1,
		"state_indices": []any{}, "required": 0, "prefix": 0, "dummy": false})
	bad := map[string][][]byte{
		"one frame":     {[]byte(wire.Magic)},
		"two frames":    {[]byte(wire.Magic), []byte("ABORT")},
		"four frames":   {[]byte(wire.Magic), []byte("ABORT"), okBody, okBody},                                         // sealed: five
		"twelve frames": {[]byte(wire.Magic), []byte("ABORT"), okBody, okBody, nil, nil, nil, nil, nil, nil, nil, nil}, // the receiver keeps 8
		"magic":         {[]byte("KVB0"), []byte("ABORT"), okBody},
		"type":          {[]byte(wire.Magic), []byte("HELLO"), okBody},
		"random bytes":  {[]byte(wire.Magic), []byte("ABORT"), []byte{0xc1, 0xff, 0x00, 0x12, 0x99}},
		"truncated":     {[]byte(wire.Magic), []byte("ABORT"), okBody[:len(okBody)/2]},
		"huge array":    {[]byte(wire.Magic), []byte("ABORT"), []byte{0x81, 0xa4, 'r', 'o', 'o', 'm', 0xdd, 0x7f, 0xff, 0xff, 0xff}},
		"deep nesting":  {[]byte(wire.Magic), []byte("ABORT"), append([]byte{0x81, 0xa1, 'x'}, bytes.Repeat([]byte{0x91}, 1<<20)...)},
		"bad REQUEST":   {[]byte(wire.Magic), []byte("REQUEST"), badReq},
		"missing field": {[]byte(wire.Magic), []byte("ABORT"), wiretest.EncodeMap(t, map[string]any{"room": 1})},
	}
	wantReasons := map[string]uint64{}
	wantRefused := uint64(0)
	room := uint64(1)
	var order []uint64
	for name, frames := range bad {
		_, err := raw.SendMessage(sealed(prefill.Identity(), good(room)))
		require.NoError(t, err)
		order = append(order, room)
		room++
		_, err = raw.SendMessage(sealed(prefill.Identity(), frames))
		require.NoError(t, err, name)
		_, err = wire.Decode(frames)
		var me *wire.MalformedError
		require.ErrorAs(t, err, &me, "%s: the test's bad message decodes", name)
		if me.Reason == wire.ReasonFrames {
			// Sealed, a wrong frame count has no authentication frame
			// where it belongs: refused before it is decoded.
			wantRefused++
			continue
		}
		wantReasons[me.Reason]++
	}
	raw.SendMessage(sealed(prefill.Identity(), good(room)))
	order = append(order, room)

	for _, want := range order {
		m := prefill.next(t)
		a, ok := m.(*wire.Abort)
		require.True(t, ok, "good traffic out of order or altered: got %+v, want ABORT room %d", m, want)
		require.Equal(t, want, a.Room, "good traffic out of order or altered: got %+v, want ABORT room", m)
	}
	st := prefill.Stats()
	for reason, n := range wantReasons {
		assert.Equal(t, n, st.Malformed[reason], "malformed[%s] (all: %v)", reason, st.Malformed)
	}
	require.Equal(t, uint64(len(bad)), st.MalformedTotal()+st.Refused[AuthMissing], "counted %d malformed and %d refused, sent %d", st.MalformedTotal(), st.Refused[AuthMissing], len(bad))
	require.Equal(t, wantRefused, st.Refused[AuthMissing], "counted %d malformed and %d refused, sent %d", st.MalformedTotal(), st.Refused[AuthMissing], len(bad))
	select {
	case r := <-prefill.malformed:
		require.EqualValues(t, 77, r.Room, "malformed REQUEST reported as %+v", r)
		require.Equal(t, decode.Endpoint(), r.Endpoint, "malformed REQUEST reported as %+v", r)
		require.Contains(t, r.Reason, "required", "malformed REQUEST reported as %+v", r)
	case <-time.After(recvTimeout):
		t.Fatal("malformed REQUEST not reported")
	}

	// A body over MaxBodySize is refused by the socket (the connection is
	// dropped) and never reaches the handler; other peers are unaffected.
	huge := rawPush(t, prefill.Endpoint())
	_, err := huge.SendMessage(wire.Magic, "ABORT", make([]byte, wire.MaxBodySize+8192))
	require.NoError(t, err)
	require.NoError(t, decode.Send(prefill.peer(), &wire.Abort{Room: 9999}))
	m := prefill.next(t)
	require.EqualValues(t, 9999, m.(*wire.Abort).Room, "after the huge body: %+v", m)
	select {
	case m := <-prefill.msgs:
		t.Fatalf("unexpected message %+v", m)
	default:
	}
}

// TestCgoCallsPerMessage: a message between two loops costs the sender one
// C call and the receiver at most one (it takes every queued message in
// one); pebbe/zmq4 made some 30 (per frame: init, receive, data, copy,
// close, RCVMORE; a send per frame; a poll). A count, not a timing.
func TestCgoCallsPerMessage(t *testing.T) {
	recv := newRank(t, wire.RolePrefill, "p", nil)
	send := newRank(t, wire.RoleDecode, "d", nil)
	to := recv.peer()
	require.NoError(t, send.Send(to, &wire.Abort{Room: 0})) // opens the socket
	recv.next(t)
	// In rounds of 500, each read before the next is sent: the receiver's
	// backlog (1,000 messages) never overflows, however fast the sender
	// (all 2,000 at once overran it without -race, after the etcd tests).
	const n, round = 2000, 500
	before := runtime.NumCgoCall()
	for r := 0; r < n; r += round {
		for i := r + 1; i <= r+round; i++ {
			require.NoError(t, send.Send(to, &wire.Abort{Room: uint64(i)}))
		}
		for i := r + 1; i <= r+round; i++ {
			m := recv.next(t).(*wire.Abort)
			require.Equal(t, uint64(i), m.Room, "room")
		}
	}
	// The slack covers the heartbeat's PINGs and PONGs, should one fire.
	calls := runtime.NumCgoCall() - before
	require.LessOrEqual(t, calls, int64(2*n+50), "%d C calls for %d messages (%.1f each), want at most 2 each", calls, n, float64(calls)/n)
}

// freeEndpoint returns a loopback endpoint nobody listens on.
func freeEndpoint(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	return "tcp://" + addr
}

func TestDeadEndpointDoesNotDelayOthers(t *testing.T) {
	decode := newRank(t, wire.RoleDecode, "d", func(c *LoopConfig) { c.SendHWM = 50 })
	prefill := newRank(t, wire.RolePrefill, "p", nil)
	nobody := wire.Peer{Endpoint: freeEndpoint(t), Epoch: 1}
	// Rounds of 100 messages to an endpoint nobody listens on, each followed
	// by 40 to a live peer (below its high-water mark): the live peer gets
	// every one, in order, while the dead peer's queue overflows and drops.
	room := uint64(0)
	for round := 0; round < 5; round++ {
		for i := 0; i < 100; i++ {
			require.NoError(t, decode.Send(nobody, &wire.Abort{Room: 1 << 40}))
		}
		first := room
		for i := 0; i < 40; i++ {
			require.NoError(t, decode.Send(prefill.peer(), &wire.Abort{Room: room}))
			room++
		}
		for want := first; want < room; want++ {
			m := prefill.next(t).(*wire.Abort)
			require.Equal(t, want, m.Room, "got room")
		}
	}
	require.NotZero(t, decode.Stats().Dropped[DropPeerBusy], "the dead peer's queue never filled: the test did not exercise the high-water mark")
}

// Sends run on the caller's goroutine: many goroutines sending to one
// peer at once (each peer's socket has one owner at a time) deliver every
// message, each goroutine's in its order.
func TestConcurrentSendersKeepOrder(t *testing.T) {
	const senders, each = 8, 500
	got := make(chan wire.Message, senders*each)
	recv := newRank(t, wire.RolePrefill, "recv", func(c *LoopConfig) { c.Handler = func(m wire.Message) { got <- m } })
	send := newRank(t, wire.RoleDecode, "send", func(c *LoopConfig) { c.SendHWM = senders * each })
	to := recv.peer()
	var wg sync.WaitGroup
	for g := 0; g < senders; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if !assert.NoError(t, send.Send(to, &wire.Abort{Room: uint64(g*each + i)})) {
					return
				}
			}
		}()
	}
	wg.Wait()
	next := make([]int, senders)
	for n := 0; n < senders*each; n++ {
		m := (<-got).(*wire.Abort)
		g, i := int(m.Room)/each, int(m.Room)%each
		require.Equal(t, next[g], i, "sender %d: message %d arrived after %d", g, i, next[g]-1)
		next[g]++
	}
}

func TestHeartbeatDetectsKilledPeer(t *testing.T) {
	const interval, misses = 200 * time.Millisecond, 2
	parent := newRank(t, wire.RoleDecode, "parent", func(c *LoopConfig) {
		c.HeartbeatInterval, c.MaxMisses = interval, misses
	})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KVBRIDGE_TEST_CHILD=peer", "KVBRIDGE_TEST_PARENT="+parent.Endpoint(),
		fmt.Sprintf("KVBRIDGE_TEST_PARENT_EPOCH=%d", parent.Identity().Epoch))
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer cmd.Wait()
	defer cmd.Process.Kill()
	hello := parent.next(t).(*wire.Abort)
	child := hello.From
	require.NoError(t, parent.Watch(wire.Peer{Endpoint: child.Endpoint}))
	// Alive: a few intervals pass with PONGs and no report. Wait for PONGs
	// to be counted before killing, so the bound starts from a live peer.
	deadline := time.Now().Add(recvTimeout)
	for parent.Stats().Received < 3 { // hello + at least two PONGs
		if time.Now().After(deadline) {
			t.Fatal("the child never answered PING")
		}
		time.Sleep(interval / 4)
	}
	select {
	case d := <-parent.down:
		t.Fatalf("live peer reported down: %+v", d)
	default:
	}
	killed := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	select {
	case d := <-parent.down:
		took := time.Since(killed)
		bound := interval * (misses + 1)
		t.Logf("killed peer reported %v after SIGKILL (bound %v)", took, bound)
		require.Equal(t, wire.ReasonPeerUnreachable, d.Reason, "report %+v", d)
		require.Equal(t, child.Endpoint, d.Endpoint, "report %+v", d)
		// The bound holds from the last PONG; the slack absorbs scheduling
		// noise on a loaded machine.
		require.LessOrEqual(t, took, bound+time.Second, "reported after %v, bound %v", took, bound)
	case <-time.After(recvTimeout):
		t.Fatal("killed peer never reported")
	}
	require.EqualValues(t, 1, parent.Stats().PeersDead, "stats %+v", parent.Stats())
}

// TestPingNeverReportsRestart: a PING is unsolicited, so one carrying a new
// epoch (forged, or from anyone) is answered by the loop and never reaches
// the handler (the core, where restarts are detected), and the loop reports
// no peer down for it.
func TestPingNeverReportsRestart(t *testing.T) {
	prefill := newRank(t, wire.RolePrefill, "p", nil)
	// One raw connection, so the three messages arrive in order: the real
	// epoch, a PING claiming a new epoch, the real epoch again.
	raw := rawPush(t, prefill.Endpoint())
	real := wire.From{Role: wire.RoleDecode, Instance: "d", Rank: 4, Endpoint: "tcp://127.0.0.1:1", Epoch: 1}
	forged := real
	forged.Epoch = 99
	for _, m := range []wire.Message{&wire.Abort{From: real, Room: 1}, &wire.Ping{From: forged, Seq: 1}, &wire.Abort{From: real, Room: 2}} {
		f, err := wire.Encode(m)
		require.NoError(t, err)
		_, err = raw.SendMessage(sealed(prefill.Identity(), f))
		require.NoError(t, err)
	}
	for want := uint64(1); want <= 2; want++ {
		m := prefill.next(t).(*wire.Abort)
		require.Equal(t, want, m.Room, "room")
	}
	select {
	case p := <-prefill.down:
		t.Fatalf("a PING reported a restart: %+v", p)
	default:
	}
}

// TestHeartbeatCountsOnlyRealMisses drives the send goroutine's heartbeat
// directly: a peer whose backlog keeps moving is alive even though no PING
// could be sent; a backlog that stands still is a miss; an unanswered PING
// is a miss; a PING ZeroMQ would not take is not.
func TestHeartbeatCountsOnlyRealMisses(t *testing.T) {
	var down []PeerDown
	l := &Loop{cfg: LoopConfig{MaxMisses: 2, PeerIdle: time.Hour, OnPeerDown: func(p PeerDown) { down = append(down, p) }},
		log: zap.NewNop()}
	s := &sender{l: l, peers: map[string]*peerConn{}}
	pc := &peerConn{endpoint: "tcp://127.0.0.1:1", watched: true, backlog: []outbound{{}}}
	s.peers[pc.endpoint] = pc
	now := time.Now()
	for i := 0; i < 10; i++ { // a slow but live peer: its backlog drains a little every interval
		pc.moved = true
		s.heartbeat(now)
	}
	require.Empty(t, down, "a peer whose backlog moves was declared dead (misses %d, down %v)", pc.misses, down)
	require.Zero(t, pc.misses, "a peer whose backlog moves was declared dead (misses %d, down %v)", pc.misses, down)
	s.heartbeat(now) // the backlog stands still: one miss
	s.heartbeat(now) // two: dead
	require.Len(t, down, 1, "a stuck backlog must count as misses: %v", down)
	require.Equal(t, wire.ReasonPeerUnreachable, down[0].Reason, "a stuck backlog must count as misses: %v", down)
}

func TestCurveAdmitsOnlyListedKeys(t *testing.T) {
	if !zmq.HasCurve() {
		t.Skip("libzmq built without CURVE")
	}
	pubs := map[string]string{} // by secret key
	keys := func() *bootstrap.Security {
		pub, sec, err := bootstrap.GenerateKeyPair()
		require.NoError(t, err)
		pubs[sec] = pub
		return &bootstrap.Security{SecretKey: sec}
	}
	good, stranger, server := keys(), keys(), keys()
	server.AllowedKeys = []string{pubs[good.SecretKey]}
	prefill := newRank(t, wire.RolePrefill, "p", func(c *LoopConfig) { c.Security = server })
	listed := newRank(t, wire.RoleDecode, "listed", func(c *LoopConfig) { c.Security = good })
	unlisted := newRank(t, wire.RoleDecode, "unlisted", func(c *LoopConfig) { c.Security = stranger })

	for i := uint64(0); i < 10; i++ {
		require.NoError(t, unlisted.Send(prefill.peer(), &wire.Abort{Room: 1000 + i}))
	}
	deadline := time.Now().Add(recvTimeout)
	for prefill.Stats().Unauthenticated == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the unlisted key was never refused")
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, listed.Send(prefill.peer(), &wire.Abort{Room: 1}))
	m := prefill.next(t).(*wire.Abort)
	require.EqualValues(t, 1, m.Room, "got %+v", m)
	require.Equal(t, "listed", m.From.Instance, "got %+v", m)
	select {
	case m := <-prefill.msgs:
		t.Fatalf("a message got through: %+v", m)
	default:
	}
	// Without a peer's server key a secure rank does not send in clear.
	require.NoError(t, listed.Send(wire.Peer{Endpoint: freeEndpoint(t), Epoch: 1}, &wire.Abort{Room: 3}))
	for listed.Stats().Dropped[DropNoKey] != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("send without a key not dropped: %v", listed.Stats().Dropped)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestLoopCloseIdempotent(t *testing.T) {
	r := newRank(t, wire.RoleDecode, "d", nil)
	require.NoError(t, r.Close())
	require.NoError(t, r.Close())
	require.ErrorIs(t, r.Send(wire.Peer{Endpoint: "tcp://127.0.0.1:1"}, &wire.Abort{}), ErrClosed, "send after close")
	require.ErrorIs(t, r.Watch(wire.Peer{Endpoint: "tcp://127.0.0.1:1"}), ErrClosed, "watch after close")
}

func TestLoopConfigValidate(t *testing.T) {
	for name, c := range map[string]LoopConfig{
		"no role":    {Identity: wire.From{Instance: "x"}, Bind: "tcp://127.0.0.1:*", Handler: func(wire.Message) {}},
		"no handler": {Identity: wire.From{Role: wire.RoleDecode, Instance: "x"}, Bind: "tcp://127.0.0.1:*"},
		"bad bind":   {Identity: wire.From{Role: wire.RoleDecode, Instance: "x"}, Bind: "bogus://", Handler: func(wire.Message) {}},
		"bad key": {Identity: wire.From{Role: wire.RoleDecode, Instance: "x"}, Bind: "tcp://127.0.0.1:*", Handler: func(wire.Message) {},
			Security: &bootstrap.Security{SecretKey: "short"}, Auth: testAuth()},
		"no secret, not insecure": {Identity: wire.From{Role: wire.RoleDecode, Instance: "x"}, Bind: "tcp://127.0.0.1:*", Handler: func(wire.Message) {}},
		"short secret": {Identity: wire.From{Role: wire.RoleDecode, Instance: "x"}, Bind: "tcp://127.0.0.1:*", Handler: func(wire.Message) {},
			Auth: &bootstrap.Auth{Secret: []byte("short")}},
		"secret and insecure": {Identity: wire.From{Role: wire.RoleDecode, Instance: "x"}, Bind: "tcp://127.0.0.1:*", Handler: func(wire.Message) {},
			Auth: testAuth(), Insecure: true},
	} {
		if l, err := NewLoop(c); !assert.Error(t, err, "%s: accepted", name) {
			l.Close()
		}
	}
}

// TestUnauthenticatedMessagesDropped: with a shared secret (the default),
// a message without a valid tag — none, another secret, altered identity
// (a captured message replayed under another name), too old — never
// reaches the handler, is not answered, and is counted by reason.
func TestUnauthenticatedMessagesDropped(t *testing.T) {
	prefill := newRank(t, wire.RolePrefill, "p", nil)
	decode := newRank(t, wire.RoleDecode, "d", nil)
	raw := rawPush(t, prefill.Endpoint())
	frames := func(m wire.Message) [][]byte {
		f, err := wire.Encode(m)
		require.NoError(t, err)
		return f
	}
	req := &wire.Request{From: decode.Identity(), Room: 5, DstPages: []uint32{1}, AuxIndex: -1, Required: 1}
	other, _ := bootstrap.NewAuth([]byte("another deployment's secret!!"))
	captured := sealed(prefill.Identity(), frames(req))
	forgedFrom := decode.Identity()
	forgedFrom.Instance = "intruder"
	replayed := append(frames(&wire.Request{From: forgedFrom, Room: 5, DstPages: []uint32{1}, AuxIndex: -1, Required: 1}), captured[3])
	old := Seal(testAuth(), frames(req), Envelope{Sent: time.Now().Add(-time.Hour), Seq: testSeq.Add(1), To: prefill.Identity()})
	cases := map[string]struct {
		frames [][]byte
		reason string
	}{
		"no tag":            {frames(req), AuthMissing},
		"other secret":      {Seal(other, frames(req), Envelope{Sent: time.Now(), Seq: testSeq.Add(1), To: prefill.Identity()}), AuthBadTag},
		"short tag":         {append(frames(req), []byte("x")), AuthBadTag},
		"replayed identity": {replayed, AuthBadTag},
		"an hour old":       {old, AuthStale},
		"PING without tag":  {frames(&wire.Ping{From: decode.Identity(), Seq: 1}), AuthMissing},
	}
	want := map[string]uint64{}
	for name, c := range cases {
		_, err := raw.SendMessage(c.frames)
		require.NoError(t, err, name)
		want[c.reason]++
	}
	// An authenticated message behind them proves they were processed.
	_, err := raw.SendMessage(sealed(prefill.Identity(), frames(&wire.Abort{From: decode.Identity(), Room: 99})))
	require.NoError(t, err)
	m := prefill.next(t)
	require.Equal(t, wire.TypeAbort, m.Type(), "an unauthenticated message reached the handler: %+v", m)
	require.EqualValues(t, 99, m.(*wire.Abort).Room, "an unauthenticated message reached the handler: %+v", m)
	for _, r := range AuthReasons {
		want[r] += 0
	}
	require.Equal(t, want, prefill.Stats().Refused, "refused")
	select {
	case m := <-decode.msgs:
		t.Fatalf("an unauthenticated message was answered: %+v", m)
	default:
	}
	require.Zero(t, prefill.Stats().Sent, "prefill sent messages (a PONG or STATUS to an unauthenticated sender)")
}

// TestForgedIdentitiesOpenNoSockets: PINGs claiming thousands of endpoints
// (issue 14: ~5,000 made a rank exhaust libzmq's sockets) open none, even
// insecure; sockets never exceed MaxPeers, evicting before creating (the
// epoch table's bound is the core's: core.TestEpochCheck (internal/core)).
func TestForgedIdentitiesOpenNoSockets(t *testing.T) {
	prefill := newRank(t, wire.RolePrefill, "p", func(c *LoopConfig) { c.Auth, c.Insecure, c.MaxPeers = nil, true, 8 })
	raw := rawPush(t, prefill.Endpoint())
	const n = 2000
	for i := 0; i < n; i++ {
		f, _ := wire.Encode(&wire.Ping{From: wire.From{Role: wire.RoleDecode, Instance: "forged", Rank: i, Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", 10000+i), Epoch: 1}, Seq: 1})
		_, err := raw.SendMessage(f)
		require.NoError(t, err)
		// ABORTs under distinct identities fill the epoch table.
		f, _ = wire.Encode(&wire.Abort{From: wire.From{Role: wire.RoleDecode, Instance: "forged", Rank: i, Endpoint: "tcp://127.0.0.1:1", Epoch: 1}, Room: uint64(i)})
		_, err = raw.SendMessage(f)
		require.NoError(t, err)
	}
	for i := 0; i < n; i++ {
		prefill.next(t)
	}
	// The loop handles messages in order: once the last ABORT is out, its
	// PING has been answered or dropped. Drops are counted on the send
	// goroutine; a marker send to a known peer orders behind them.
	decode := newRank(t, wire.RoleDecode, "d", func(c *LoopConfig) { c.Auth, c.Insecure = nil, true })
	require.NoError(t, prefill.Send(decode.peer(), &wire.Status{Room: 1, Status: wire.StatusFailed}))
	decode.next(t)
	st := prefill.Stats()
	// (Sent is counted after the marker left, so it may still read 0.)
	require.EqualValues(t, n, st.Dropped[DropUnknownPeer], "PONGs to forged endpoints: dropped (want %d), sent %d (want only the marker)", n, st.Sent)
	require.LessOrEqual(t, st.Sent, uint64(1), "PONGs to forged endpoints: dropped %d (want %d), sent %d (want only the marker)", st.Dropped[DropUnknownPeer], n, st.Sent)

	// Sockets: 8 watched peers fill MaxPeers; a ninth endpoint is refused
	// (not created); once one is unwatched it is evicted first.
	for i := 0; i < 8; i++ {
		require.NoError(t, prefill.Watch(wire.Peer{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", 20000+i)}))
	}
	require.NoError(t, prefill.Send(wire.Peer{Endpoint: "tcp://127.0.0.1:29999"}, &wire.Status{Room: 2, Status: wire.StatusFailed}))
	require.NoError(t, prefill.Unwatch("tcp://127.0.0.1:20000"))
	require.NoError(t, prefill.Send(decode.peer(), &wire.Status{Room: 3, Status: wire.StatusFailed}))
	m := decode.next(t)
	require.EqualValues(t, 3, m.(*wire.Status).Room, "got %+v", m)
	require.GreaterOrEqual(t, prefill.Stats().Dropped[DropTooManyPeers], uint64(1), "no send refused with every socket watched (too_many_peers)")
	require.LessOrEqual(t, int(prefill.Stats().Sockets), 8, "sockets open, MaxPeers 8")
}

// TestSentBodyNotKeptAlive: once a message is handed to ZeroMQ (which
// copies it), the socket's scratch no longer holds its body, so an idle
// peer's socket does not keep the last message it carried (a REGISTER's
// metadata, say) alive until the next send.
func TestSentBodyNotKeptAlive(t *testing.T) {
	got := make(chan wire.Message, 1)
	b, err := NewLoop(LoopConfig{Identity: wire.From{Role: wire.RolePrefill, Instance: "b"}, Bind: "tcp://127.0.0.1:*",
		Auth: testAuth(), Handler: func(m wire.Message) {
			if _, ok := m.(*wire.Abort); ok {
				got <- m
			}
		}})
	require.NoError(t, err)
	defer b.Close()
	a, err := NewLoop(LoopConfig{Identity: wire.From{Role: wire.RoleDecode, Instance: "a"}, Bind: "tcp://127.0.0.1:*",
		Auth: testAuth(), Handler: func(wire.Message) {}})
	require.NoError(t, err)
	defer a.Close()
	to := wire.Peer{Endpoint: b.Endpoint(), Epoch: b.Identity().Epoch}
	require.NoError(t, a.Send(to, &wire.Abort{Room: 1, Reason: strings.Repeat("r", 200)}))
	<-got
	a.snd.mu.Lock()
	pc := a.snd.peers[b.Endpoint()]
	a.snd.mu.Unlock()
	require.NotNil(t, pc, "no socket to the peer")
	pc.mu.Lock()
	defer pc.mu.Unlock()
	require.Nil(t, pc.scratch.frames[2], "the socket's scratch still holds the sent body (%d bytes)", len(pc.scratch.frames[2]))
}

// TestBackloggedBodiesIntact: the body of a message a busy peer's queue
// would not take waits in the backlog while later messages are encoded
// into the buffers of sent ones (bodyBufs): every message arrives as it
// was sent, none malformed, and every one not dropped arrives.
func TestBackloggedBodiesIntact(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	got := make(chan *wire.Abort, 1<<16)
	recv := newRank(t, wire.RolePrefill, "recv", func(c *LoopConfig) {
		c.Handler = func(m wire.Message) {
			if a, ok := m.(*wire.Abort); ok {
				<-release // a peer that stopped reading
				got <- a
			}
		}
	})
	t.Cleanup(open) // before recv closes (cleanups run last first)
	send := newRank(t, wire.RoleDecode, "send", func(c *LoopConfig) { c.SendHWM = 64 })
	to := recv.peer()
	reason := func(i int) string { return fmt.Sprintf("%08d", i) + strings.Repeat(string(rune('a'+i%26)), 900) }
	sent := 0
	post := func() {
		require.NoError(t, send.Send(to, &wire.Abort{Room: uint64(sent), Reason: reason(sent)}))
		sent++
	}
	// Until ZeroMQ's queue and the sockets' buffers are full and messages
	// wait in the backlog.
	for send.snd.pending.Load() == 0 {
		if sent == 1<<16 {
			t.Fatal("no message waited in a backlog")
		}
		post()
	}
	// More while some wait: the backlog's bodies are not handed out again.
	for k := 0; k < 32; k++ {
		post()
	}
	open()
	want := uint64(sent) - send.Stats().Dropped[DropPeerBusy]
	seen := map[uint64]bool{}
	for n := uint64(0); n < want; n++ {
		var a *wire.Abort
		select {
		case a = <-got:
		case <-time.After(time.Minute): // a lost message fails, not hangs
			t.Fatalf("%d of %d messages arrived (malformed %d)", n, want, recv.Stats().MalformedTotal())
		}
		require.Equal(t, reason(int(a.Room)), a.Reason, "message %d arrived with the body of another (reason %.12q…)", a.Room, a.Reason)
		require.False(t, seen[a.Room], "message %d arrived twice: a waiting message went out with a later one's body", a.Room)
		seen[a.Room] = true
	}
	require.Zero(t, recv.Stats().MalformedTotal(), "messages arrived malformed")
}
