package control

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/ident"
	"github.com/kvbridge/kvbridge/internal/wire"
	zmq "github.com/pebbe/zmq4"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tap is a PULL socket a test points a rank at to capture what the rank
// sends there, frames and all, as an outsider on the path would.
type tap struct {
	ctx  *zmq.Context
	sock *zmq.Socket
	ep   string
}

func newTap(t *testing.T) *tap {
	t.Helper()
	ctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	s, err := ctx.NewSocket(zmq.PULL)
	if err != nil {
		t.Fatal(err)
	}
	s.SetLinger(0)
	s.SetRcvtimeo(recvTimeout)
	if err := s.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := s.GetLastEndpoint()
	tp := &tap{ctx: ctx, sock: s, ep: ep}
	t.Cleanup(func() { s.Close(); ctx.Term() })
	return tp
}

func (tp *tap) next(t *testing.T) [][]byte {
	t.Helper()
	f, err := tp.sock.RecvMessageBytes(0)
	if err != nil {
		t.Fatalf("tap: nothing captured: %v", err)
	}
	return f
}

// rawWire is one raw connection to a rank: what a test sends on it arrives
// in order, so a marker sent last proves everything before it was handled.
type rawWire struct {
	t    *testing.T
	sock *zmq.Socket
	to   *testRank
	ad   *addressing // seals the markers as a decode rank of its own
	from wire.From
}

func newWire(t *testing.T, to *testRank, id *ident.RankIdentity) *rawWire {
	from := wire.From{Role: wire.RoleDecode, Instance: "marker", Endpoint: "tcp://127.0.0.1:1", Epoch: NewEpoch()}
	if id != nil {
		from.Instance, from.Rank = id.Cert.Instance, id.Cert.Rank
	}
	return &rawWire{t: t, sock: rawPush(t, to.Endpoint()), to: to, ad: newAddressing(testSealer(), id, wire.RoleDecode), from: from}
}

// send sends frames byte for byte.
func (w *rawWire) send(frames [][]byte) {
	w.t.Helper()
	if _, err := w.sock.SendMessage(frames); err != nil {
		w.t.Fatal(err)
	}
}

// sync sends a marker ABORT for room and waits for it: nothing sent on the
// wire before it reached the handler.
func (w *rawWire) sync(room uint64) {
	w.t.Helper()
	env, key, err := w.ad.envelope(w.to.peer())
	if err != nil {
		w.t.Fatal(err)
	}
	env.Sent, env.Seq = time.Now(), w.ad.nextSeq()
	f, _ := wire.Encode(&wire.Abort{From: w.from, Room: room})
	w.send(testSealer().seal(key, f, env))
	if m := w.to.next(w.t); m.Type() != wire.TypeAbort || m.(*wire.Abort).Room != room {
		w.t.Fatalf("%s reached the handler before the marker: %+v", m.Type(), m)
	}
}

// TestCapturedMessagesAreUseless (issue 23, 1): a message captured on the
// wire is refused as a duplicate by the process it was sent to, as
// addressed to another process by that rank restarted on the same
// endpoint, and as unaddressed by another rank; each reason counted.
func TestCapturedMessagesAreUseless(t *testing.T) {
	decode := newRank(t, wire.RoleDecode, "d", nil)
	prefill := newRank(t, wire.RolePrefill, "p", nil)
	other := newRank(t, wire.RolePrefill, "p", func(c *LoopConfig) { c.Identity.Rank = 1 })

	// Capture: the decode rank's ABORT, as the wire carried it to the
	// prefill rank (the tap stands where the prefill rank listens).
	tp := newTap(t)
	if err := decode.Send(wire.Peer{Endpoint: tp.ep, Epoch: prefill.Identity().Epoch}, &wire.Abort{Room: 42, Reason: "captured"}); err != nil {
		t.Fatal(err)
	}
	captured := tp.next(t)
	// Delivered once, it is accepted; again, it is a duplicate.
	w := newWire(t, prefill, nil)
	w.send(captured)
	if a := prefill.next(t).(*wire.Abort); a.Room != 42 {
		t.Fatalf("the original was not delivered: %+v", a)
	}
	w.send(captured)
	w.sync(1)
	if got := prefill.Stats().Replayed[ReplayDuplicate]; got != 1 {
		t.Fatalf("duplicates counted %d, want 1", got)
	}
	// Another rank (same instance, rank 1) refuses it as not addressed to it.
	wo := newWire(t, other, nil)
	wo.send(captured)
	wo.sync(2)
	if got := other.Stats().Replayed[ReplayOtherEpoch]; got != 1 {
		t.Fatalf("another rank counted %d messages for another process, want 1", got)
	}
	// The prefill rank restarts in place (same endpoint, new epoch): the
	// message was for its predecessor.
	ep := prefill.Endpoint()
	if err := prefill.Close(); err != nil {
		t.Fatal(err)
	}
	again := newRank(t, wire.RolePrefill, "p", func(c *LoopConfig) { c.Bind = ep })
	wa := newWire(t, again, nil)
	wa.send(captured)
	wa.sync(3)
	if got := again.Stats().Replayed[ReplayOtherEpoch]; got != 1 {
		t.Fatalf("the restarted rank counted %d messages for another process, want 1", got)
	}
}

// TestFirstContactNeedsAnEpoch: only a PING or a REGISTER may go to a rank
// whose process the sender does not know yet (its epoch 0); anything else
// is refused as unaddressed. The PONG to such a PING names the process.
func TestFirstContactNeedsAnEpoch(t *testing.T) {
	decode := newRank(t, wire.RoleDecode, "d", nil)
	prefill := newRank(t, wire.RolePrefill, "p", nil)
	blind := wire.Peer{Endpoint: prefill.Endpoint()} // no epoch known
	if err := decode.Send(blind, &wire.Abort{Room: 5}); err != nil {
		t.Fatal(err)
	}
	if got := decode.Stats().Dropped[DropUnaddressed]; got != 1 {
		t.Fatalf("an ABORT to a process not known yet: %d dropped at the sender, want 1", got)
	}
	if err := decode.Send(blind, &wire.Register{Compat: "c", Agent: "a", AgentMD: []byte("md"), TPSize: 1, KV: []wire.Region{}, Aux: []wire.Region{}, State: []wire.Region{}}); err != nil {
		t.Fatal(err)
	}
	r, ok := prefill.next(t).(*wire.Register)
	if !ok || string(r.AgentMD) != "md" {
		t.Fatalf("the first REGISTER was not delivered with its metadata: %+v", r)
	}
	// The receiver refuses what a sender that does not check sends: an
	// ABORT with epoch 0, and a first REGISTER that names another rank
	// (prefill/p/1).
	w := newWire(t, prefill, nil)
	f, _ := wire.Encode(&wire.Abort{From: decode.Identity(), Room: 5})
	w.send(Seal(testAuth(), f, Envelope{Sent: time.Now(), Seq: 1<<45 - 1, To: wire.From{Role: wire.RolePrefill, Instance: "p"}}))
	f, _ = wire.Encode(&wire.Register{From: decode.Identity(), Compat: "c", Agent: "a", TPSize: 1, KV: []wire.Region{}, Aux: []wire.Region{}, State: []wire.Region{}})
	w.send(Seal(testAuth(), f, Envelope{Sent: time.Now(), Seq: 1 << 45, To: wire.From{Role: wire.RolePrefill, Instance: "p", Rank: 1}}))
	w.sync(77)
	if got := prefill.Stats().Refused[AuthUnaddressed]; got != 2 {
		t.Fatalf("ABORT to an unknown process and REGISTER for another rank: %d unaddressed, want 2", got)
	}
	// The reply teaches the decode rank the process: its next ABORT, sent
	// blind again, is addressed and arrives.
	if err := prefill.Send(wire.Peer{Endpoint: decode.Endpoint()}, &wire.RegisterAck{OK: true}); err != nil {
		t.Fatal(err)
	}
	if _, ok := decode.next(t).(*wire.RegisterAck); !ok {
		t.Fatal("no REGISTER_ACK")
	}
	if err := decode.Send(blind, &wire.Abort{Room: 6}); err != nil {
		t.Fatal(err)
	}
	if a := prefill.next(t).(*wire.Abort); a.Room != 6 {
		t.Fatalf("got %+v", a)
	}
}

func TestReplayWindow(t *testing.T) {
	var w window
	for _, c := range []struct {
		seq  uint64
		want bool
	}{{0, false}, {1, true}, {1, false}, {3, true}, {2, true}, {2, false}, {3, false},
		{3 + replayWindow - 1, true}, // top 1026: 3 is the window's last number
		{3, false}, {2, false}, {4, true}, {4 + replayWindow, true}, {3 + replayWindow, true}, {4, false},
		{4 + replayWindow + 64, true}, {4 + replayWindow + 64, false}, {4 + replayWindow + 1, true},
		{1 << 40, true}, {1<<40 - replayWindow, false}, {1<<40 - replayWindow + 1, true}, {4 + replayWindow + 64, false}} {
		if got := w.accept(c.seq); got != c.want {
			t.Fatalf("accept(%d) = %v, want %v (top %d)", c.seq, got, c.want, w.top)
		}
	}
}

// identities issues certificates for a decode and a prefill rank.
func identities(t *testing.T) (ca *ident.CA, decode, prefill *ident.RankIdentity) {
	t.Helper()
	ca, err := ident.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	year := time.Now().Add(365 * 24 * time.Hour)
	if decode, err = ca.Issue(wire.RoleDecode, "d", 0, year); err != nil {
		t.Fatal(err)
	}
	if prefill, err = ca.Issue(wire.RolePrefill, "p", 0, year); err != nil {
		t.Fatal(err)
	}
	return ca, decode, prefill
}

func withIdentity(id *ident.RankIdentity) func(*LoopConfig) {
	return func(c *LoopConfig) {
		c.RankIdentity = id
		c.Identity.Role, c.Identity.Instance, c.Identity.Rank = id.Cert.Role, id.Cert.Instance, id.Cert.Rank
	}
}

// TestRankIdentityProvesFrom (issue 23, 2): under per-rank identity the
// ranks talk; a holder of the deployment secret without a certificate
// cannot; a holder of one rank's certificate cannot speak as another rank,
// nor as its own role's peer.
func TestRankIdentityProvesFrom(t *testing.T) {
	ca, did, pid := identities(t)
	decode := newRank(t, wire.RoleDecode, "d", withIdentity(did))
	prefill := newRank(t, wire.RolePrefill, "p", withIdentity(pid))
	if err := decode.Send(prefill.peer(), &wire.Abort{Room: 1}); err != nil {
		t.Fatal(err)
	}
	if a := prefill.next(t).(*wire.Abort); a.Room != 1 || a.From.Peer() != "decode/d/0" {
		t.Fatalf("got %+v", a)
	}
	// Replies need no certificate from the caller: the prefill rank learned
	// the decode rank's from its message.
	if err := prefill.Send(wire.Peer{Endpoint: decode.Endpoint()}, &wire.AbortAck{Room: 1, Drained: true}); err != nil {
		t.Fatal(err)
	}
	if a := decode.next(t).(*wire.AbortAck); a.Room != 1 {
		t.Fatalf("got %+v", a)
	}

	// Another rank's certificate holder (decode rank 1) claiming rank 0,
	// by forging the body under its own envelope.
	insider, err := ca.Issue(wire.RoleDecode, "d", 1, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	liar := newRank(t, wire.RoleDecode, "d", withIdentity(insider))
	ad := newAddressing(liar.auth, insider, wire.RoleDecode)
	env, key, err := ad.envelope(prefill.peer())
	if err != nil {
		t.Fatal(err)
	}
	env.Sent, env.Seq = time.Now(), 1
	claim := decode.Identity()
	f, _ := wire.Encode(&wire.Abort{From: claim, Room: 3})
	w := newWire(t, prefill, did)
	w.send(liar.auth.seal(key, f, env))
	// The secret alone: tagged with the secret, no certificate.
	f, _ = wire.Encode(&wire.Abort{From: decode.Identity(), Room: 2})
	w.send(Seal(testAuth(), f, Envelope{Sent: time.Now(), Seq: 1 << 50, To: prefill.Identity()}))
	// A prefill certificate's holder speaking to a prefill rank.
	samerole, err := ca.Issue(wire.RolePrefill, "p", 1, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := newAddressing(liar.auth, samerole, wire.RolePrefill).envelope(prefill.peer()); !errors.Is(err, ident.ErrBadCert) {
		t.Fatalf("a prefill rank addressed a prefill rank: %v", err)
	}
	// A certificate from another CA.
	otherCA, _ := ident.NewCA()
	stranger, _ := otherCA.Issue(wire.RoleDecode, "d", 0, time.Now().Add(time.Hour))
	// Its holder does not accept the prefill rank's certificate either, so
	// the test seals the message by hand.
	pc, _ := ident.ParseCert(pid.Cert.Raw(), ca.Public, time.Now())
	fkey, err := pairKey(testSecret, stranger, pc)
	if err != nil {
		t.Fatal(err)
	}
	f, _ = wire.Encode(&wire.Abort{From: wire.From{Role: wire.RoleDecode, Instance: "d", Endpoint: decode.Endpoint(), Epoch: 77}, Room: 4})
	w.send(testSealer().seal(fkey, f, Envelope{Sent: time.Now(), Seq: 1, To: prefill.Identity(), Cert: stranger.Cert.Raw()}))
	w.sync(5)
	got := prefill.Stats().Refused
	if got[AuthNoIdentity] != 2 || got[AuthForged] != 1 {
		t.Fatalf("refused %v, want 2 no_identity (secret only, foreign CA) and 1 forged_identity", got)
	}
}

// TestAgentMetadataSealedToItsRecipient (issue 23, 3): a REGISTER's agent
// metadata is on the wire only sealed to the prefill rank it is for, bound
// to its owner: captured, it cannot be read, nor presented by another
// rank, nor to another rank.
func TestAgentMetadataSealedToItsRecipient(t *testing.T) {
	ca, did, pid := identities(t)
	decode := newRank(t, wire.RoleDecode, "d", withIdentity(did))
	prefill := newRank(t, wire.RolePrefill, "p", withIdentity(pid))
	md := []byte("UCX worker address and rkeys of decode/d/0")
	proof := []byte("the ownership proof of decode/d/0")
	tp := newTap(t)
	reg := &wire.Register{Compat: "c", Agent: "a", AgentMD: md, TPSize: 1, KV: []wire.Region{}, Aux: []wire.Region{}, State: []wire.Region{}, Proof: proof}
	to := prefill.peer()
	to.Endpoint = tp.ep
	if err := decode.Send(to, reg); err != nil {
		t.Fatal(err)
	}
	captured := tp.next(t)
	if bytes.Contains(bytes.Join(captured, nil), md) || bytes.Contains(bytes.Join(captured, nil), proof) {
		t.Fatal("the agent metadata or the ownership proof is on the wire in the clear")
	}
	w := newWire(t, prefill, did)
	w.send(captured)
	if r := prefill.next(t).(*wire.Register); !bytes.Equal(r.AgentMD, md) || !bytes.Equal(r.Proof, proof) {
		t.Fatalf("the recipient read %q and proof %q", r.AgentMD, r.Proof)
	}
	// The body itself is sealed to the recipient: an insider on the wire
	// decodes nothing of it.
	if _, err := wire.Decode(captured[:3]); err == nil {
		t.Fatal("a REGISTER sealed to the prefill rank decoded from the wire")
	}
	// Another decode rank's holder that got the sealed blob anyway (as the
	// recipient reads the body) presents it in its own REGISTER: the
	// blob's own seal names its owner.
	insider, _ := ca.Issue(wire.RoleDecode, "d", 1, time.Now().Add(time.Hour))
	liar := newRank(t, wire.RoleDecode, "d", withIdentity(insider))
	now := time.Now()
	opened, _, why := testSealer().open(slices.Clone(captured), now, newAddressing(testSealer(), pid, wire.RolePrefill).keyFor(now))
	if why != "" {
		t.Fatal(why)
	}
	m, err := wire.Decode(opened)
	if err != nil {
		t.Fatal(err)
	}
	stolen := *m.(*wire.Register)
	ad := newAddressing(liar.auth, insider, wire.RoleDecode)
	env, key, err := ad.envelope(prefill.peer())
	if err != nil {
		t.Fatal(err)
	}
	stolen.From = liar.Identity()
	env.Sent, env.Seq = time.Now(), 1
	f, _ := wire.Encode(&stolen)
	w.send(liar.auth.seal(key, f, env))
	w.sync(9)
	if got := prefill.Stats().Refused[AuthBadTag]; got != 1 {
		t.Fatalf("a stolen sealed blob: %d refused, want 1", got)
	}
}

// goldenIdentity loads a fixed rank identity (its X25519 key and its
// certificate, signed by a fixed CA: Ed25519 signatures are deterministic)
// from the files internal/ident's TestGoldenCertificate pins, for the golden
// files here.
func goldenIdentity(t *testing.T, role string) *ident.RankIdentity {
	t.Helper()
	dir := filepath.Join("..", "ident", "testdata", "golden")
	id, err := ident.LoadIdentity(filepath.Join(dir, "CA.txt"), filepath.Join(dir, "IDENTITY_"+role+".txt"))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestGoldenEnvelope: the authentication frame, tagged with the secret
// and sealed under a pair key, byte for byte (PROTOCOL.md "Envelope",
// "Sealed bodies"; the certificate is internal/ident's TestGoldenCertificate's),
// so any implementation can check its own against them.
func TestGoldenEnvelope(t *testing.T) {
	dec := goldenIdentity(t, wire.RoleDecode)  // decode-a rank 3
	pre := goldenIdentity(t, wire.RolePrefill) // prefill-a rank 1
	a := testSealer()                          // secret "kvbridge-test-secret-0123456789"
	frames, err := wire.Encode(&wire.Abort{From: wire.From{Role: wire.RoleDecode, Instance: "decode-a", Rank: 3, Endpoint: "tcp://10.0.0.2:5557", Epoch: 0x1234_5678_9abc_def1},
		Room: 42, Reason: "client left"})
	if err != nil {
		t.Fatal(err)
	}
	env := Envelope{Sent: time.Unix(1800000000, 5), Seq: 7,
		To: wire.From{Role: wire.RolePrefill, Instance: "prefill-a", Rank: 1, Epoch: 0x0fed_cba9_8765_4321}}
	// Tagged with the secret under the sender process's salt (here a
	// fixed one: 0x10..0x1f), the message number its nonce.
	tagger := fixedSaltSealer(t, 0x10)
	secret := tagger.seal(nil, frames, env)
	// Under per-rank identity the body is sealed (PROTOCOL.md "Sealed
	// bodies") under the sender process's body key for the pair (the same
	// fixed salt), the message number its nonce.
	key, err := tagKey(a.Secret, dec, pre.Cert.Raw())
	if err != nil {
		t.Fatal(err)
	}
	penv := env
	penv.Cert = dec.Cert.Raw()
	pair := tagger.seal(key, frames, penv)
	if bytes.Contains(pair[2], []byte("client left")) {
		t.Fatal("the sealed body carries its reason in the clear")
	}
	for name, got := range map[string][]byte{"ENVELOPE_secret.bin": secret[3], "ENVELOPE_pair.bin": pair[3], "BODY_pair.bin": pair[2]} {
		path := filepath.Join("testdata", "golden", name)
		if *update {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test ./internal/control -run TestGolden -update once)", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s drifted:\n got %x\nwant %x", name, got, want)
		}
	}
	// They open: the secret's with the secret, the pair's at the prefill
	// rank, with the decode rank's certificate.
	if _, e, why := a.open(secret, time.Unix(1800000000, 0), nil); why != "" || e.Seq != 7 || e.To.Instance != "prefill-a" {
		t.Fatalf("secret envelope: %q %+v", why, e)
	}
	ad := newAddressing(a, pre, wire.RolePrefill)
	if _, e, why := a.open(pair, time.Unix(1800000000, 0), ad.keyFor(time.Unix(1800000000, 0))); why != "" || !bytes.Equal(e.Cert, dec.Cert.Raw()) {
		t.Fatalf("pair envelope: %q", why)
	}
}

// TestAgentMetadataBoundToOwnerWithSecret: with the shared secret alone
// the seal's key is the same for all, so the binding is its associated
// data: a sealed blob presented under another identity, or to another
// rank, is refused (an outsider cannot re-present it; a secret holder
// could seal its own, PROTOCOL.md says so).
func TestAgentMetadataBoundToOwnerWithSecret(t *testing.T) {
	decode := newRank(t, wire.RoleDecode, "d", nil)
	prefill := newRank(t, wire.RolePrefill, "p", nil)
	tp := newTap(t)
	to := prefill.peer()
	to.Endpoint = tp.ep
	if err := decode.Send(to, &wire.Register{Compat: "c", Agent: "a", AgentMD: []byte("victim's"), TPSize: 1, KV: []wire.Region{}, Aux: []wire.Region{}, State: []wire.Region{}}); err != nil {
		t.Fatal(err)
	}
	captured := tp.next(t)
	m, err := wire.Decode(captured[:3])
	if err != nil {
		t.Fatal(err)
	}
	orig, _, _, why := parseEnvelope(captured[3])
	if why != "" {
		t.Fatal(why)
	}
	stolen := *m.(*wire.Register)
	stolen.From.Instance = "liar" // the same process otherwise
	f, _ := wire.Encode(&stolen)
	w := newWire(t, prefill, nil)
	w.send(Seal(testAuth(), f, Envelope{Sent: time.Now(), Seq: 1 << 46, To: orig.To}))
	w.sync(3)
	if got := prefill.Stats().Refused[AuthBadTag]; got != 1 {
		t.Fatalf("a sealed blob under another identity: %d refused, want 1", got)
	}
}

// TestEndpointBoundToItsRank (review of issue 23): a message's endpoint is
// claimed, not proven, and the cores match peers by endpoint, so an
// endpoint is bound to one rank: the holder of prefill rank 1's key
// claiming prefill rank 0's endpoint is refused as forged, cannot rebind
// the endpoint, cannot evict its windows with minted epochs, and its
// malformed REQUEST claiming another rank's endpoint is not answered.
func TestEndpointBoundToItsRank(t *testing.T) {
	ca, did, pid := identities(t)
	decode := newRank(t, wire.RoleDecode, "d", withIdentity(did))
	prefill := newRank(t, wire.RolePrefill, "p", withIdentity(pid))
	p1, _ := ca.Issue(wire.RolePrefill, "p", 1, time.Now().Add(time.Hour))
	// The pair works; decode has p/0 bound at its endpoint.
	if err := decode.Send(prefill.peer(), &wire.Abort{Room: 1}); err != nil {
		t.Fatal(err)
	}
	prefill.next(t)
	if err := prefill.Send(wire.Peer{Endpoint: decode.Endpoint()}, &wire.AbortAck{Room: 1, Drained: true}); err != nil {
		t.Fatal(err)
	}
	decode.next(t)
	to := decode.Identity()
	claim := prefill.Identity()
	claim.Rank, claim.Epoch = 1, 1<<62 // p/1, claiming p/0's endpoint, a huge epoch
	w := newWire(t, decode, nil)
	for i, m := range []wire.Message{&wire.AbortAck{From: claim, Room: 1, Drained: true}, &wire.Status{From: claim, Room: 1, Status: wire.StatusFailed, Code: "failed"}} {
		f, _ := wire.Encode(m)
		sealed, err := SealAs(testAuth(), p1, did.Cert.Raw(), f, Envelope{Sent: time.Now(), Seq: uint64(i + 1), To: to})
		if err != nil {
			t.Fatal(err)
		}
		w.send(sealed)
	}
	// The marker: a genuine message of p/0 sent on the same connection
	// after the forged ones.
	f, _ := wire.Encode(&wire.AbortAck{From: prefill.Identity(), Room: 2, Drained: true})
	pkey := mustSeal(t, pid, did.Cert.Raw(), f, Envelope{Sent: time.Now(), Seq: 1 << 50, To: to})
	w.send(pkey)
	if a := decode.next(t).(*wire.AbortAck); a.Room != 2 {
		t.Fatalf("got %+v", a)
	}
	if got := decode.Stats().Refused[AuthForged]; got != 2 {
		t.Fatalf("p/1 claiming p/0's endpoint: %d forged, want 2", got)
	}
	// The book still addresses p/0 at its endpoint: the next reply arrives.
	if err := decode.Send(wire.Peer{Endpoint: prefill.Endpoint()}, &wire.Abort{Room: 3}); err != nil {
		t.Fatal(err)
	}
	if a := prefill.next(t).(*wire.Abort); a.Room != 3 {
		t.Fatalf("got %+v", a)
	}

	// Windows: d/1's key holder mints 5,000 epochs; d/0's window stays, so
	// d/0's captured message replayed is still a duplicate.
	tp := newTap(t)
	cap := prefill.peer()
	cap.Endpoint = tp.ep
	if err := decode.Send(cap, &wire.Abort{Room: 4}); err != nil {
		t.Fatal(err)
	}
	captured := tp.next(t)
	wp := newWire(t, prefill, did)
	wp.send(captured)
	if a := prefill.next(t).(*wire.Abort); a.Room != 4 {
		t.Fatalf("got %+v", a)
	}
	d1, _ := ca.Issue(wire.RoleDecode, "d", 1, time.Now().Add(time.Hour))
	for e := uint64(1); e <= 5000; e++ {
		f, _ := wire.Encode(&wire.Abort{From: wire.From{Role: wire.RoleDecode, Instance: "d", Rank: 1, Endpoint: "tcp://127.0.0.1:9", Epoch: e}, Room: 1 << 41})
		wp.send(mustSeal(t, d1, pid.Cert.Raw(), f, Envelope{Sent: time.Now(), Seq: 1, To: prefill.Identity()}))
	}
	wp.send(captured)
	// The marker: the minted epochs' ABORTs are d/1's own and reach the
	// handler before it.
	env, key, err := wp.ad.envelope(prefill.peer())
	if err != nil {
		t.Fatal(err)
	}
	env.Sent, env.Seq = time.Now(), wp.ad.nextSeq()
	f, _ = wire.Encode(&wire.Abort{From: wp.from, Room: 5})
	wp.send(testSealer().seal(key, f, env))
	for {
		if a := prefill.next(t).(*wire.Abort); a.Room == 5 {
			break
		} else if a.Room != 1<<41 {
			t.Fatalf("got %+v before the marker", a)
		}
	}
	if got := prefill.Stats().Replayed[ReplayDuplicate]; got < 1 {
		t.Fatalf("d/0's message replayed after 5,000 minted epochs: %d duplicates, want at least 1 (%v)", got, prefill.Stats().Replayed)
	}
	if n := len(prefill.addr.windows); n > maxBookEntries {
		t.Fatalf("%d windows kept, bound %d", n, maxBookEntries)
	}
}

func mustSeal(t *testing.T, id *ident.RankIdentity, peer []byte, frames [][]byte, env Envelope) [][]byte {
	t.Helper()
	out, err := SealAs(testAuth(), id, peer, frames, env)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestWindowsKeptWithinTheSkew: with the shared secret alone identities
// are free, so a secret holder can fill the window table; a window heard
// within MaxSkew is never forgotten for a newcomer (refused as overflow
// instead), so a captured message stays a duplicate.
func TestWindowsKeptWithinTheSkew(t *testing.T) {
	decode := newRank(t, wire.RoleDecode, "d", nil)
	prefill := newRank(t, wire.RolePrefill, "p", nil)
	tp := newTap(t)
	cap := prefill.peer()
	cap.Endpoint = tp.ep
	if err := decode.Send(cap, &wire.Abort{Room: 1}); err != nil {
		t.Fatal(err)
	}
	captured := tp.next(t)
	w := newWire(t, prefill, nil)
	w.send(captured)
	prefill.next(t)
	for i := 0; i < maxBookEntries; i++ {
		f, _ := wire.Encode(&wire.Abort{From: wire.From{Role: wire.RoleDecode, Instance: "flood", Rank: i, Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", 1+i), Epoch: 1}, Room: 1 << 42})
		w.send(Seal(testAuth(), f, Envelope{Sent: time.Now(), Seq: 1, To: prefill.Identity()}))
	}
	w.send(captured)
	w.send(captured)
	// The marker, on the same connection: a message of the decode
	// process, whose window is kept (with the secret alone the test can
	// speak as it).
	f, _ := wire.Encode(&wire.Abort{From: decode.Identity(), Room: 3})
	w.send(Seal(testAuth(), f, Envelope{Sent: time.Now(), Seq: 1 << 50, To: prefill.Identity()}))
	n := 0
	for {
		a := prefill.next(t).(*wire.Abort)
		if a.Room == 3 {
			break
		}
		if a.Room != 1<<42 {
			t.Fatalf("got %+v", a)
		}
		n++
	}
	if n != maxBookEntries-1 {
		t.Fatalf("%d of the flood's senders accepted, want %d (the table holds the decode process's window too)", n, maxBookEntries-1)
	}
	st := prefill.Stats()
	if st.Replayed[ReplayDuplicate] != 2 || st.Replayed[ReplayOverflow] == 0 {
		t.Fatalf("after the flood: replays %v, want 2 duplicates and the flood's last senders refused as overflow", st.Replayed)
	}
}

// TestBodiesSealedUnderRankIdentity (issue 49, 3): under per-rank identity
// a message's body is sealed to its recipient — its room id and reason are
// not on the wire in the clear, as they are under the shared secret alone
// — and opens only there; a flipped byte of the body or of its type frame
// is refused (bad_tag), and a tagged but unsealed message, as an earlier
// revision sends, is refused and counted (unsealed).
func TestBodiesSealedUnderRankIdentity(t *testing.T) {
	const room = 0x0123456789abcdef
	reason := []byte("a reason only the recipient reads")
	roomBytes := binary.BigEndian.AppendUint64(nil, room) // as msgpack carries a uint64
	capture := func(t *testing.T, from, to *testRank) [][]byte {
		t.Helper()
		tp := newTap(t)
		p := to.peer()
		p.Endpoint = tp.ep
		require.NoError(t, from.Send(p, &wire.Abort{Room: room, Reason: string(reason)}))
		return tp.next(t)
	}
	clear := func(frames [][]byte) bool {
		all := bytes.Join(frames, nil)
		return bytes.Contains(all, reason) || bytes.Contains(all, roomBytes)
	}

	// The shared secret alone: tagged, readable (what the seal hides).
	open := capture(t, newRank(t, wire.RoleDecode, "s", nil), newRank(t, wire.RolePrefill, "s", nil))
	require.True(t, clear(open), "under the secret alone the room and reason travel readable")
	assert.Equal(t, EnvelopeMagic, string(open[3][:4]))

	_, did, pid := identities(t)
	decode := newRank(t, wire.RoleDecode, "d", withIdentity(did))
	prefill := newRank(t, wire.RolePrefill, "p", withIdentity(pid))
	sealed := capture(t, decode, prefill)
	assert.False(t, clear(sealed), "room id or reason on the wire in the clear under per-rank identity")
	assert.Equal(t, envelopeSealedMagic, string(sealed[3][:4]))
	w := newWire(t, prefill, did)
	w.send(sealed)
	a := prefill.next(t).(*wire.Abort)
	assert.Equal(t, uint64(room), a.Room)
	assert.Equal(t, string(reason), a.Reason)

	// Altered: a byte of the body, of the type frame.
	for i, at := range []int{2, 1} {
		bad := make([][]byte, len(sealed))
		for j := range sealed {
			bad[j] = slices.Clone(sealed[j])
		}
		bad[at][len(bad[at])-1] ^= 1
		w.send(bad)
		w.sync(uint64(10 + i))
		assert.EqualValues(t, i+1, prefill.Stats().Refused[AuthBadTag], "frame %d altered", at)
	}

	// Tagged with the pair key but not sealed (an earlier revision).
	f, err := wire.Encode(&wire.Abort{From: decode.Identity(), Room: room, Reason: string(reason)})
	require.NoError(t, err)
	env, key, err := w.ad.envelope(prefill.peer())
	require.NoError(t, err)
	env.Sent, env.Seq = time.Now(), 1<<20
	w.send(append(f[:3:3], testSealer().sealInto(nil, key, f, env)))
	w.sync(12)
	assert.EqualValues(t, 1, prefill.Stats().Refused[AuthUnsealed])
	// The same with a tag that is not the pair's (anyone can carry a
	// certificate): bad_tag, not counted as a peer of an earlier revision.
	env.Seq++
	forged := testSealer().sealInto(nil, key, f, env)
	forged[len(forged)-1] ^= 1
	w.send(append(f[:3:3], forged))
	w.sync(13)
	assert.EqualValues(t, 1, prefill.Stats().Refused[AuthUnsealed])
	assert.EqualValues(t, 3, prefill.Stats().Refused[AuthBadTag])
	select {
	case m := <-prefill.msgs:
		t.Fatalf("an unsealed or altered message was handled: %+v", m)
	default:
	}
}

// TestSealNoncesNeverRepeat: a sealed message's nonce is its message
// number under its process's own body key (derived from a salt drawn per
// process), so no two messages under one key share one — neither two of a
// process, nor the same number from two lives of one rank (a restart
// numbers from 1 again): the same body sealed twice never looks the same
// on the wire. And what the loop sends carries one salt and a new number
// each time.
func TestSealNoncesNeverRepeat(t *testing.T) {
	_, did, pid := identities(t)
	first, restarted := testSealer(), testSealer()
	key, err := tagKey(first.Secret, did, pid.Cert.Raw())
	require.NoError(t, err)
	f, err := wire.Encode(&wire.Abort{From: wire.From{Role: wire.RoleDecode, Instance: "d"}, Room: 1, Reason: "the same body"})
	require.NoError(t, err)
	env := Envelope{Sent: time.Now(), Seq: 1, To: certIdentity(pid.Cert), Cert: did.Cert.Raw()}
	one := first.seal(key, f[:3:3], env)
	env.Seq = 2
	two := first.seal(key, f[:3:3], env)
	env.Seq = 1
	again := restarted.seal(key, f[:3:3], env)
	// (the encrypted bytes, without the tag: under a repeated nonce they
	// would be the same, the key stream laid bare).
	ct := func(m [][]byte) []byte { return m[2][:len(m[2])-tagBytes] }
	assert.NotEqual(t, ct(one), ct(two), "one body sealed as two messages of one process")
	assert.NotEqual(t, ct(one), ct(again), "one body sealed as message 1 of two lives of one rank")
	assert.NotEqual(t, one[3][len(one[3])-tagSaltBytes:], again[3][len(again[3])-tagSaltBytes:], "two processes' salts")

	decode := newRank(t, wire.RoleDecode, "d", withIdentity(did))
	prefill := newRank(t, wire.RolePrefill, "p", withIdentity(pid))
	tp := newTap(t)
	to := prefill.peer()
	to.Endpoint = tp.ep
	salts, seqs := map[string]bool{}, map[uint64]bool{}
	for i := range 3 {
		require.NoError(t, decode.Send(to, &wire.Abort{Room: uint64(i)}))
		env := tp.next(t)[3]
		salts[string(env[len(env)-tagSaltBytes:])] = true
		seqs[binary.LittleEndian.Uint64(env[12:])] = true
	}
	assert.Len(t, salts, 1, "one process, one salt")
	assert.Len(t, seqs, 3, "a message number per message")
}

// TestSealedHeaderFramesBounded (review of 3fee272): a sealed message's
// magic and type frames are bounded before they are copied into the
// associated data — anyone can carry a certificate, so an unauthenticated
// sender must not make a rank copy megabytes before the check.
func TestSealedHeaderFramesBounded(t *testing.T) {
	_, did, pid := identities(t)
	a := testSealer()
	key, err := tagKey(a.Secret, did, pid.Cert.Raw())
	require.NoError(t, err)
	f, err := wire.Encode(&wire.Abort{From: wire.From{Role: wire.RoleDecode, Instance: "d"}, Room: 1})
	require.NoError(t, err)
	sealed := a.seal(key, f[:3:3], Envelope{Sent: time.Now(), Seq: 1, To: certIdentity(pid.Cert), Cert: did.Cert.Raw()})
	sealed[1] = make([]byte, 4<<20) // a type frame of 4 MiB
	fresh := testSealer()           // (a pool with no buffer yet)
	now := time.Now()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, why := fresh.open(sealed, now, newAddressing(fresh, pid, wire.RolePrefill).keyFor(now))
	runtime.ReadMemStats(&after)
	assert.Equal(t, AuthBadTag, why)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "bytes allocated to refuse a 4 MiB type frame")
}

// TestTaggedFramesBounded (review of eead32e): a tagged message's magic
// and type frames are bounded before they are copied into the associated
// data too, and the scratch a large body was copied into is not kept for
// the next message.
func TestTaggedFramesBounded(t *testing.T) {
	frames, env := tagFixture(t)
	a := testSealer()
	tagged := a.seal(nil, slices.Clone(frames), env)
	tagged[1] = make([]byte, 4<<20) // a type frame of 4 MiB
	fresh := testSealer()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, why := fresh.open(tagged, time.Now(), nil)
	runtime.ReadMemStats(&after)
	assert.Equal(t, AuthBadTag, why)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "bytes allocated to refuse a 4 MiB type frame")

	// An authentic message with a 1 MiB body: opened, its scratch left to
	// the GC.
	big := slices.Clone(frames)
	big[2] = make([]byte, 1<<20)
	_, _, why = fresh.open(a.seal(nil, big, env), time.Now(), nil)
	require.Empty(t, why)
	p := fresh.aad(frames[:1], nil)
	assert.LessOrEqual(t, cap(p.b), maxKeptAAD, "the scratch of a 1 MiB body kept for the next message")
}
