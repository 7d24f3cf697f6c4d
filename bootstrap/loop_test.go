package bootstrap

import (
	"bytes"
	"errors"
	"go.uber.org/zap"
	"net"
	"os"
	"os/exec"
	"reflect"
	"syscall"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// recvTimeout bounds every wait for a message in these tests; it is a
// deadlock guard, not a performance assertion.
const recvTimeout = 10 * time.Second

type testRank struct {
	*Loop
	msgs chan Message
	down chan PeerDown
}

func newRank(t *testing.T, role, instance string, mut func(*LoopConfig)) *testRank {
	t.Helper()
	r := &testRank{msgs: make(chan Message, 10000), down: make(chan PeerDown, 16)}
	cfg := LoopConfig{Identity: From{Role: role, Instance: instance, Rank: 0}, Bind: "tcp://127.0.0.1:*",
		Handler:    func(m Message) { r.msgs <- m },
		OnPeerDown: func(p PeerDown) { r.down <- p }}
	if mut != nil {
		mut(&cfg)
	}
	l, err := NewLoop(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.Loop = l
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

func (r *testRank) peer() Peer { return Peer{Endpoint: r.Endpoint(), ServerKey: r.PublicKey()} }

func (r *testRank) next(t *testing.T) Message {
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
	decode := newRank(t, RoleDecode, "d", nil)
	prefill := newRank(t, RolePrefill, "p", nil)
	samples := sampleMessages()
	for _, m := range samples {
		if _, ok := m.(*Ping); ok {
			continue // PING and PONG are the loop's own; see the heartbeat tests
		}
		if _, ok := m.(*Pong); ok {
			continue
		}
		from, to := decode, prefill
		if m.Sender().Role == RolePrefill {
			from, to = prefill, decode
		}
		if err := from.Send(to.peer(), m); err != nil {
			t.Fatal(err)
		}
		got := to.next(t)
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("%v:\n got %+v\nwant %+v", m.Type(), got, m)
		}
		if got.Sender() != from.Identity() || got.Sender().Endpoint != from.Endpoint() {
			t.Fatalf("from = %+v, want %+v", got.Sender(), from.Identity())
		}
	}
	// PING is answered with PONG by the loop itself: a watched peer stays alive.
	if err := decode.Watch(prefill.peer()); err != nil {
		t.Fatal(err)
	}
	if s := prefill.Stats(); s.MalformedTotal() != 0 {
		t.Fatalf("malformed: %+v", s.Malformed)
	}
}

// rawPush is a bare ZeroMQ client that sends whatever frames it is given.
func rawPush(t *testing.T, endpoint string) *zmq.Socket {
	t.Helper()
	ctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	s, err := ctx.NewSocket(zmq.PUSH)
	if err != nil {
		t.Fatal(err)
	}
	s.SetLinger(2 * time.Second)
	if err := s.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); ctx.Term() })
	return s
}

func TestLoopSurvivesGarbage(t *testing.T) {
	prefill := newRank(t, RolePrefill, "p", nil)
	decode := newRank(t, RoleDecode, "d", nil)
	raw := rawPush(t, prefill.Endpoint())

	good := func(room uint64) [][]byte {
		f, err := Encode(&Abort{From: decode.Identity(), Room: room, Reason: "ok"})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	okBody := good(0)[2]
	// A REQUEST with required 0 that still names its room and sender: the
	// prefill rank must answer it with STATUS failed.
	badReq := encodeMap(t, map[string]any{"from": map[string]any{"role": "decode", "instance": "d", "rank": 0,
		"endpoint": decode.Endpoint(), "epoch": 1}, "room": 77, "dst_pages": []byte{}, "aux_index": -1,
		"state_indices": []any{}, "required": 0, "prefix": 0, "dummy": false})
	bad := map[string][][]byte{
		"one frame":     {[]byte(Magic)},
		"two frames":    {[]byte(Magic), []byte("ABORT")},
		"four frames":   {[]byte(Magic), []byte("ABORT"), okBody, okBody},
		"magic":         {[]byte("KVB0"), []byte("ABORT"), okBody},
		"type":          {[]byte(Magic), []byte("HELLO"), okBody},
		"random bytes":  {[]byte(Magic), []byte("ABORT"), []byte{0xc1, 0xff, 0x00, 0x12, 0x99}},
		"truncated":     {[]byte(Magic), []byte("ABORT"), okBody[:len(okBody)/2]},
		"huge array":    {[]byte(Magic), []byte("ABORT"), []byte{0x81, 0xa4, 'r', 'o', 'o', 'm', 0xdd, 0x7f, 0xff, 0xff, 0xff}},
		"deep nesting":  {[]byte(Magic), []byte("ABORT"), append([]byte{0x81, 0xa1, 'x'}, bytes.Repeat([]byte{0x91}, 1<<20)...)},
		"bad REQUEST":   {[]byte(Magic), []byte("REQUEST"), badReq},
		"missing field": {[]byte(Magic), []byte("ABORT"), encodeMap(t, map[string]any{"room": 1})},
	}
	wantReasons := map[string]uint64{}
	room := uint64(1)
	var order []uint64
	for name, frames := range bad {
		if _, err := raw.SendMessage(good(room)); err != nil {
			t.Fatal(err)
		}
		order = append(order, room)
		room++
		if _, err := raw.SendMessage(frames); err != nil {
			t.Fatal(name, err)
		}
		_, err := Decode(frames)
		var me *MalformedError
		if !errors.As(err, &me) {
			t.Fatalf("%s: the test's bad message decodes", name)
		}
		wantReasons[me.Reason]++
	}
	raw.SendMessage(good(room))
	order = append(order, room)

	for _, want := range order {
		m := prefill.next(t)
		a, ok := m.(*Abort)
		if !ok || a.Room != want {
			t.Fatalf("good traffic out of order or altered: got %+v, want ABORT room %d", m, want)
		}
	}
	st := prefill.Stats()
	for reason, n := range wantReasons {
		if st.Malformed[reason] != n {
			t.Errorf("malformed[%s] = %d, want %d (all: %v)", reason, st.Malformed[reason], n, st.Malformed)
		}
	}
	if st.MalformedTotal() != uint64(len(bad)) {
		t.Fatalf("counted %d malformed, sent %d", st.MalformedTotal(), len(bad))
	}
	m := decode.next(t)
	if s, ok := m.(*Status); !ok || s.Room != 77 || s.Status != StatusFailed {
		t.Fatalf("malformed REQUEST not answered with STATUS failed: %+v", m)
	}

	// A body over 64 MiB is refused by the socket (the connection is
	// dropped) and never reaches the handler; other peers are unaffected.
	huge := rawPush(t, prefill.Endpoint())
	if _, err := huge.SendMessage(Magic, "ABORT", make([]byte, MaxBodySize+8192)); err != nil {
		t.Fatal(err)
	}
	if err := decode.Send(prefill.peer(), &Abort{Room: 9999}); err != nil {
		t.Fatal(err)
	}
	if m := prefill.next(t); m.(*Abort).Room != 9999 {
		t.Fatalf("after the huge body: %+v", m)
	}
	select {
	case m := <-prefill.msgs:
		t.Fatalf("unexpected message %+v", m)
	default:
	}
}

// freeEndpoint returns a loopback endpoint nobody listens on.
func freeEndpoint(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "tcp://" + addr
}

func TestDeadEndpointDoesNotDelayOthers(t *testing.T) {
	decode := newRank(t, RoleDecode, "d", func(c *LoopConfig) { c.SendHWM = 50 })
	prefill := newRank(t, RolePrefill, "p", nil)
	nobody := Peer{Endpoint: freeEndpoint(t)}
	// Rounds of 100 messages to an endpoint nobody listens on, each followed
	// by 40 to a live peer (below its high-water mark): the live peer gets
	// every one, in order, while the dead peer's queue overflows and drops.
	room := uint64(0)
	for round := 0; round < 5; round++ {
		for i := 0; i < 100; i++ {
			if err := decode.Send(nobody, &Abort{Room: 1 << 40}); err != nil {
				t.Fatal(err)
			}
		}
		first := room
		for i := 0; i < 40; i++ {
			if err := decode.Send(prefill.peer(), &Abort{Room: room}); err != nil {
				t.Fatal(err)
			}
			room++
		}
		for want := first; want < room; want++ {
			if m := prefill.next(t).(*Abort); m.Room != want {
				t.Fatalf("got room %d, want %d", m.Room, want)
			}
		}
	}
	if d := decode.Stats().Dropped[DropPeerBusy]; d == 0 {
		t.Fatal("the dead peer's queue never filled: the test did not exercise the high-water mark")
	}
}

func TestQueueFullIsAnError(t *testing.T) {
	// With a one-slot queue some sends must be refused, never block.
	decode := newRank(t, RoleDecode, "d", func(c *LoopConfig) { c.SendQueue = 1 })
	nobody := Peer{Endpoint: freeEndpoint(t)}
	var full int
	for i := 0; i < 10000; i++ {
		if err := decode.Send(nobody, &Abort{Room: uint64(i)}); errors.Is(err, ErrQueueFull) {
			full++
		}
	}
	if full == 0 || decode.Stats().Dropped[DropQueueFull] != uint64(full) {
		t.Fatalf("full=%d, stats %v", full, decode.Stats().Dropped)
	}
}

func TestHeartbeatDetectsKilledPeer(t *testing.T) {
	const interval, misses = 200 * time.Millisecond, 2
	parent := newRank(t, RoleDecode, "parent", func(c *LoopConfig) {
		c.HeartbeatInterval, c.MaxMisses = interval, misses
	})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KVBRIDGE_TEST_CHILD=peer", "KVBRIDGE_TEST_PARENT="+parent.Endpoint())
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	hello := parent.next(t).(*Abort)
	child := hello.From
	if err := parent.Watch(Peer{Endpoint: child.Endpoint}); err != nil {
		t.Fatal(err)
	}
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
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-parent.down:
		took := time.Since(killed)
		bound := interval * (misses + 1)
		t.Logf("killed peer reported %v after SIGKILL (bound %v)", took, bound)
		if d.Reason != ReasonPeerUnreachable || d.Endpoint != child.Endpoint {
			t.Fatalf("report %+v", d)
		}
		// The bound holds from the last PONG; the slack absorbs scheduling
		// noise on a loaded machine.
		if took > bound+time.Second {
			t.Fatalf("reported after %v, bound %v", took, bound)
		}
	case <-time.After(recvTimeout):
		t.Fatal("killed peer never reported")
	}
	if parent.Stats().PeersDead != 1 {
		t.Fatalf("stats %+v", parent.Stats())
	}
}

func TestEpochChangeReportsRestart(t *testing.T) {
	prefill := newRank(t, RolePrefill, "p", nil)
	id := From{Role: RoleDecode, Instance: "d", Rank: 4}
	for epoch := uint64(1); epoch <= 2; epoch++ {
		d := newRank(t, RoleDecode, "d", func(c *LoopConfig) { c.Identity = id; c.Identity.Epoch = epoch })
		if err := d.Send(prefill.peer(), &Abort{Room: epoch}); err != nil {
			t.Fatal(err)
		}
		prefill.next(t)
		d.Close()
	}
	select {
	case p := <-prefill.down:
		if p.Reason != ReasonPeerRestarted || p.From.Epoch != 2 || p.From.Rank != 4 {
			t.Fatalf("report %+v", p)
		}
	default:
		t.Fatal("restart not reported")
	}
}

// TestPingNeverReportsRestart: a PING is unsolicited, so one carrying a new
// epoch (forged, or from anyone) must not report a restart, nor make the
// real epoch's next message look like one.
func TestPingNeverReportsRestart(t *testing.T) {
	prefill := newRank(t, RolePrefill, "p", nil)
	// One raw connection, so the three messages arrive in order: the real
	// epoch, a PING claiming a new epoch, the real epoch again.
	raw := rawPush(t, prefill.Endpoint())
	real := From{Role: RoleDecode, Instance: "d", Rank: 4, Endpoint: "tcp://127.0.0.1:1", Epoch: 1}
	forged := real
	forged.Epoch = 99
	for _, m := range []Message{&Abort{From: real, Room: 1}, &Ping{From: forged, Seq: 1}, &Abort{From: real, Room: 2}} {
		f, err := Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := raw.SendMessage(f); err != nil {
			t.Fatal(err)
		}
	}
	for want := uint64(1); want <= 2; want++ {
		if m := prefill.next(t).(*Abort); m.Room != want {
			t.Fatalf("room %d, want %d", m.Room, want)
		}
	}
	select {
	case p := <-prefill.down:
		t.Fatalf("a PING reported a restart: %+v", p)
	default:
	}
	if n := prefill.Stats().PeersRestarted; n != 0 {
		t.Fatalf("%d restarts counted", n)
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
	if len(down) != 0 || pc.misses != 0 {
		t.Fatalf("a peer whose backlog moves was declared dead (misses %d, down %v)", pc.misses, down)
	}
	s.heartbeat(now) // the backlog stands still: one miss
	s.heartbeat(now) // two: dead
	if len(down) != 1 || down[0].Reason != ReasonPeerUnreachable {
		t.Fatalf("a stuck backlog must count as misses: %v", down)
	}
}

func TestCurveAdmitsOnlyListedKeys(t *testing.T) {
	if !zmq.HasCurve() {
		t.Skip("libzmq built without CURVE")
	}
	keys := func() *Security {
		pub, sec, err := GenerateKeyPair()
		if err != nil {
			t.Fatal(err)
		}
		return &Security{PublicKey: pub, SecretKey: sec}
	}
	good, stranger, server := keys(), keys(), keys()
	server.AllowedKeys = []string{good.PublicKey}
	prefill := newRank(t, RolePrefill, "p", func(c *LoopConfig) { c.Security = server })
	listed := newRank(t, RoleDecode, "listed", func(c *LoopConfig) { c.Security = good })
	unlisted := newRank(t, RoleDecode, "unlisted", func(c *LoopConfig) { c.Security = stranger })

	for i := uint64(0); i < 10; i++ {
		if err := unlisted.Send(prefill.peer(), &Abort{Room: 1000 + i}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(recvTimeout)
	for prefill.Stats().Unauthenticated == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the unlisted key was never refused")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := listed.Send(prefill.peer(), &Abort{Room: 1}); err != nil {
		t.Fatal(err)
	}
	if m := prefill.next(t).(*Abort); m.Room != 1 || m.From.Instance != "listed" {
		t.Fatalf("got %+v", m)
	}
	select {
	case m := <-prefill.msgs:
		t.Fatalf("a message got through: %+v", m)
	default:
	}
	// Without a peer's server key a secure rank does not send in clear.
	if err := listed.Send(Peer{Endpoint: freeEndpoint(t)}, &Abort{Room: 3}); err != nil {
		t.Fatal(err)
	}
	for listed.Stats().Dropped[DropNoKey] != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("send without a key not dropped: %v", listed.Stats().Dropped)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSecurityFromEnv(t *testing.T) {
	pub, sec, err := GenerateKeyPair()
	if err != nil {
		t.Skip(err)
	}
	peerPub, _, _ := GenerateKeyPair()
	t.Setenv(EnvCurveSecretKey, "")
	if s, err := SecurityFromEnv(); s != nil || err != nil {
		t.Fatalf("off by default: %v %v", s, err)
	}
	dir := t.TempDir()
	keyFile := dir + "/secret"
	os.WriteFile(keyFile, []byte("# rank key\n"+sec+"\n"), 0o600)
	allowFile := dir + "/allow"
	os.WriteFile(allowFile, []byte(peerPub+"\n"), 0o600)
	t.Setenv(EnvCurveSecretKeyFile, keyFile)
	t.Setenv(EnvCurveAllowFile, allowFile)
	s, err := SecurityFromEnv()
	if err != nil || s.PublicKey != pub || len(s.AllowedKeys) != 1 || s.AllowedKeys[0] != peerPub {
		t.Fatalf("%+v %v", s, err)
	}
	t.Setenv(EnvCurveAllow, "not-a-key")
	if _, err := SecurityFromEnv(); err == nil {
		t.Fatal("a bad allowed key must be refused")
	}
}

func TestLoopCloseIdempotent(t *testing.T) {
	r := newRank(t, RoleDecode, "d", nil)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Send(Peer{Endpoint: "tcp://127.0.0.1:1"}, &Abort{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("send after close: %v", err)
	}
	if err := r.Watch(Peer{Endpoint: "tcp://127.0.0.1:1"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("watch after close: %v", err)
	}
}

func TestLoopConfigValidate(t *testing.T) {
	for name, c := range map[string]LoopConfig{
		"no role":    {Identity: From{Instance: "x"}, Bind: "tcp://127.0.0.1:*", Handler: func(Message) {}},
		"no handler": {Identity: From{Role: RoleDecode, Instance: "x"}, Bind: "tcp://127.0.0.1:*"},
		"bad bind":   {Identity: From{Role: RoleDecode, Instance: "x"}, Bind: "bogus://", Handler: func(Message) {}},
		"bad key": {Identity: From{Role: RoleDecode, Instance: "x"}, Bind: "tcp://127.0.0.1:*", Handler: func(Message) {},
			Security: &Security{SecretKey: "short"}},
	} {
		if l, err := NewLoop(c); err == nil {
			l.Close()
			t.Errorf("%s: accepted", name)
		}
	}
}
