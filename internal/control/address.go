package control

import (
	"bytes"
	"container/list"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/ident"
	"github.com/kvbridge/kvbridge/internal/wire"
)

// Fresh and addressed (PROTOCOL.md "Envelope"): every message names its
// receiver and carries its sender process's message number; a receiver
// drops a message for another rank or another process of itself, and a
// number of a sender process it has already received. This file holds the
// three tables behind it: where each peer is (learned from what it sent,
// or from a bootstrap record), the pair keys of certified peers, and the
// windows of message numbers received.

// maxBookEntries bounds each of the tables (like MaxEpochs).
const maxBookEntries = 4096

// replayWindow is how many message numbers below the highest one heard
// from a sender process are remembered (a message reordered by more is
// dropped as a duplicate, which the protocol survives as a loss).
const replayWindow = 1024

// peerCert is a verified certificate and the pair key derived from it.
type peerCert struct {
	cert *ident.Cert
	key  []byte
}

// where is what this rank knows of the process at one endpoint: the rank
// bound to it and that rank's latest epoch there. An endpoint is bound to
// one rank: a message from another rank claiming it is refused as forged
// (its from.endpoint is claimed, not proven, and the cores match peers by
// endpoint) unless the binding came from messages only and that rank has
// not been heard there for rebindAfter (a port reused after its rank
// died); a binding the core hinted (a bootstrap record's certificate)
// changes only with another hint.
type where struct {
	id     wire.From // identity and epoch (Endpoint unused)
	cert   *peerCert
	hinted bool
	heard  time.Time
	elem   *list.Element
}

// maxEndpointsPerRank bounds the endpoints one rank holds in the book (a
// rank restarted on new ports leaves its old ones; a key holder claiming
// many endpoints evicts only its own).
const maxEndpointsPerRank = 4

// maxWindowsPerRank bounds the sender processes (epochs) of one rank whose
// message numbers are kept: a rank minting epochs forgets only its own.
const maxWindowsPerRank = 4

type window struct {
	top  uint64                    // highest number accepted
	bits [replayWindow / 64]uint64 // bit i: top−i accepted
	last time.Time                 // when the last one was accepted
	elem *list.Element
}

// rankID names a rank as From.Peer does, without formatting a string
// on every message.
type rankID struct {
	role, instance string
	rank           int
}

func keyOf(f wire.From) rankID { return rankID{f.Role, f.Instance, f.Rank} }

type senderKey struct {
	peer  rankID
	epoch uint64
}

type addressing struct {
	auth        *sealer
	id          *ident.RankIdentity // nil: the shared secret alone
	role        string              // this rank's role: peers have the other
	rebindAfter time.Duration       // the heartbeat bound

	// seq is the last message number stamped: the nonce of the message's
	// tag or sealed body under its loop's sealer's salt (auth.go), so each
	// number goes out once.
	seq atomic.Uint64

	mu       sync.Mutex
	book     map[string]*where
	bookLRU  *list.List
	byRank   map[rankID][]string  // a rank → its endpoints in the book, oldest first
	certs    map[string]*peerCert // by the certificate's bytes
	certLRU  []string             // insertion order, for eviction
	badCerts map[string]error     // certificates refused (bounded; so a bad one costs one check)
	windows  map[senderKey]*window
	// lastKey, lastWin: the window of the sender process checked last (a
	// receive loop's messages come in runs from one), found without
	// hashing its key. Only window drops windows, and a drop there frees
	// the room for the window it then makes and remembers here: lastWin
	// is always in windows.
	lastKey senderKey
	lastWin *window
	winLRU  *list.List
	winRank map[rankID][]uint64 // a rank → epochs with a window, oldest first
	nudged  map[senderKey]time.Time
}

func newAddressing(auth *sealer, id *ident.RankIdentity, role string) *addressing {
	a := &addressing{auth: auth, id: id, role: role, rebindAfter: 15 * time.Second, book: map[string]*where{}, bookLRU: list.New(),
		byRank: map[rankID][]string{}, certs: map[string]*peerCert{}, badCerts: map[string]error{},
		windows: map[senderKey]*window{}, winLRU: list.New(), winRank: map[rankID][]uint64{}, nudged: map[senderKey]time.Time{}}
	return a
}

var errNoPeerCert = errors.New("no identity certificate known for the peer (per-rank identity is on: a prefill rank's comes with its bootstrap record, a decode rank's with its messages)")

// verify returns the cached verification of a certificate (a.mu held).
func (a *addressing) verify(raw []byte, now time.Time) (*peerCert, error) {
	if pc, ok := a.certs[string(raw)]; ok {
		if now.After(pc.cert.NotAfter) {
			return nil, fmt.Errorf("%w: %s expired at %s", ident.ErrBadCert, pc.cert, pc.cert.NotAfter.UTC().Format(time.RFC3339))
		}
		return pc, nil
	}
	if err, ok := a.badCerts[string(raw)]; ok {
		return nil, err
	}
	refuse := func(err error) (*peerCert, error) {
		if len(a.badCerts) >= maxBookEntries {
			clear(a.badCerts)
		}
		a.badCerts[string(raw)] = err
		return nil, err
	}
	// The role first: a certificate of this rank's own role (a public
	// record's, say) is refused without checking its signature.
	if len(raw) > 4 && wire.ByteRole(raw[4]) == a.role {
		return refuse(fmt.Errorf("%w: a %s rank's certificate, as this one's: ranks talk only to ranks of the other role", ident.ErrBadCert, a.role))
	}
	c, err := ident.ParseCert(raw, a.id.CA, now)
	if err != nil {
		if errors.Is(err, ident.ErrBadCert) && !strings.Contains(err.Error(), "expired") {
			return refuse(err)
		}
		return nil, err
	}
	key, err := pairKey(a.auth.Secret, a.id, c)
	if err != nil {
		return nil, err
	}
	pc := &peerCert{cert: c, key: key}
	if len(a.certLRU) >= maxBookEntries {
		delete(a.certs, a.certLRU[0])
		a.certLRU = a.certLRU[1:]
	}
	a.certs[string(raw)] = pc
	a.certLRU = append(a.certLRU, string(raw))
	return pc, nil
}

// envelope addresses a message to the peer: its identity and epoch as this
// rank knows them (the bootstrap record's certificate and epoch, or what the
// process at that endpoint last sent), the next message number, and under
// per-rank identity this rank's certificate and the pair key to tag with.
func (a *addressing) envelope(to wire.Peer) (Envelope, []byte, error) {
	return a.envelopeAt(to, time.Now())
}

// envelopeAt is envelope with the time the caller read (certificates are
// checked against it).
func (a *addressing) envelopeAt(to wire.Peer, now time.Time) (Envelope, []byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var env Envelope
	w := a.book[to.Endpoint]
	var pc *peerCert
	if to.Cert != "" && a.id != nil {
		// A known certificate is found by its string: no copy of it a
		// message.
		if pc = a.certs[to.Cert]; pc == nil || now.After(pc.cert.NotAfter) {
			var err error
			if pc, err = a.verify([]byte(to.Cert), now); err != nil {
				return env, nil, err
			}
		}
		// The core's hint binds the endpoint (and is remembered for the
		// heartbeat's PINGs, which carry none).
		switch {
		case w == nil:
			w = a.bind(to.Endpoint, certIdentity(pc.cert), pc, now)
			w.id.Epoch = to.Epoch
		case keyOf(w.id) != keyOf(certIdentity(pc.cert)):
			a.unbind(to.Endpoint)
			w = a.bind(to.Endpoint, certIdentity(pc.cert), pc, now)
			w.id.Epoch = to.Epoch
		}
		w.hinted = true
	}
	switch {
	case pc != nil:
		env.To = certIdentity(pc.cert)
		if w != nil && keyOf(w.id) == keyOf(env.To) {
			env.To.Epoch = w.id.Epoch
		}
	case w != nil:
		env.To = w.id
		pc = w.cert
	}
	if env.To.Role != "" || to.Epoch != 0 {
		env.To.Epoch = max(env.To.Epoch, to.Epoch)
	}
	if a.id == nil {
		return env, nil, nil
	}
	if pc == nil {
		return env, nil, errNoPeerCert
	}
	env.Cert = a.id.Cert.Raw()
	return env, pc.key, nil
}

// nextSeq is the next message number. The caller holds the peer's lock, so
// each peer receives growing numbers.
func (a *addressing) nextSeq() uint64 { return a.seq.Add(1) }

// keyFor is the Auth.open callback under per-rank identity.
func (a *addressing) keyFor(now time.Time) func([]byte) ([]byte, string) {
	return func(raw []byte) ([]byte, string) {
		if raw == nil {
			return nil, AuthNoIdentity
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		pc, err := a.verify(raw, now)
		if err != nil {
			return nil, AuthNoIdentity
		}
		return pc.key, ""
	}
}

// check applies the receiver's rules to an authentic message: its from
// is the certificate's rank, its endpoint is not bound to another rank, it
// is addressed to this process, its number is new. why is an Auth* or
// Replay* reason; replay tells which counter.
func (a *addressing) check(self wire.From, m wire.Message, env Envelope, now time.Time) (why string, replay bool) {
	from := m.Sender()
	a.mu.Lock()
	defer a.mu.Unlock()
	var pc *peerCert
	if a.id != nil {
		pc = a.certs[string(env.Cert)] // verified by keyFor
		if pc == nil || certIdentity(pc.cert) != (wire.From{Role: from.Role, Instance: from.Instance, Rank: from.Rank}) {
			return AuthForged, false
		}
	}
	t := m.Type()
	opener := t == wire.TypePing || t == wire.TypeRegister
	to := env.To
	switch {
	case to.Epoch == 0 && !opener:
		// The epoch pins the process (and so the rank); only a PING or a
		// REGISTER may go to a rank whose process is not known yet.
		return AuthUnaddressed, false
	case to.Role != "" && (to.Role != self.Role || to.Instance != self.Instance || to.Rank != self.Rank):
		return AuthUnaddressed, false
	case to.Epoch != 0 && to.Epoch != self.Epoch && t != wire.TypePing:
		// A PING to an old epoch is answered: the PONG tells the sender
		// which process is here now.
		return ReplayOtherEpoch, true
	}
	e := a.book[from.Endpoint]
	if e != nil && keyOf(e.id) != keyOf(from) && (e.hinted || now.Sub(e.heard) < a.rebindAfter) {
		return AuthForged, false // the endpoint is another rank's
	}
	w, why := a.window(from, now)
	if why != "" {
		return why, true
	}
	if !w.accept(env.Seq) {
		return ReplayDuplicate, true
	}
	w.last = now
	// Learn where this process is, for the replies.
	id := wire.From{Role: from.Role, Instance: from.Instance, Rank: from.Rank, Epoch: from.Epoch}
	switch {
	case e == nil:
		e = a.bind(from.Endpoint, id, pc, now)
	case keyOf(e.id) != keyOf(from): // a port reused after its rank went silent
		a.unbind(from.Endpoint)
		e = a.bind(from.Endpoint, id, pc, now)
	case from.Epoch >= e.id.Epoch:
		e.id.Epoch = from.Epoch
		if pc != nil {
			e.cert = pc
		}
	}
	e.heard = now
	a.bookLRU.MoveToFront(e.elem)
	return "", false
}

// window returns the window of the sender process (a.mu held), making
// one if there is room: a rank keeps windows for its maxWindowsPerRank
// latest epochs, and a window is forgotten for another rank's only once
// idle for MaxSkew (a replay within the skew must still find it).
func (a *addressing) window(from wire.From, now time.Time) (*window, string) {
	k := senderKey{keyOf(from), from.Epoch}
	if a.lastWin != nil && a.lastKey == k {
		a.winLRU.MoveToFront(a.lastWin.elem)
		return a.lastWin, ""
	}
	if w := a.windows[k]; w != nil {
		a.winLRU.MoveToFront(w.elem)
		a.lastKey, a.lastWin = k, w
		return w, ""
	}
	epochs := a.winRank[k.peer]
	if len(epochs) >= maxWindowsPerRank {
		if from.Epoch < epochs[0] {
			return nil, ReplayDuplicate // older than every epoch of it kept: a replay or a dead process
		}
		a.dropWindow(senderKey{k.peer, epochs[0]})
	}
	if a.winLRU.Len() >= maxBookEntries {
		b := a.winLRU.Back()
		old := b.Value.(senderKey)
		if now.Sub(a.windows[old].last) < a.auth.MaxSkew {
			return nil, ReplayOverflow
		}
		a.dropWindow(old)
	}
	w := &window{}
	a.windows[k] = w
	w.elem = a.winLRU.PushFront(k)
	a.lastKey, a.lastWin = k, w
	a.winRank[k.peer] = insertSorted(a.winRank[k.peer], from.Epoch)
	return w, ""
}

func insertSorted(s []uint64, v uint64) []uint64 {
	i := 0
	for i < len(s) && s[i] < v {
		i++
	}
	return append(s[:i], append([]uint64{v}, s[i:]...)...)
}

func (a *addressing) dropWindow(k senderKey) {
	if w := a.windows[k]; w != nil {
		a.winLRU.Remove(w.elem)
		delete(a.windows, k)
	}
	e := a.winRank[k.peer]
	for i, v := range e {
		if v == k.epoch {
			e = append(e[:i], e[i+1:]...)
			break
		}
	}
	if len(e) == 0 {
		delete(a.winRank, k.peer)
	} else {
		a.winRank[k.peer] = e
	}
}

// bind records that endpoint is the rank id's (a.mu held), evicting the
// rank's oldest endpoint past maxEndpointsPerRank and the least recently
// used entry past maxBookEntries.
func (a *addressing) bind(endpoint string, id wire.From, pc *peerCert, now time.Time) *where {
	w := &where{id: id, cert: pc, heard: now}
	a.book[endpoint] = w
	w.elem = a.bookLRU.PushFront(endpoint)
	r := keyOf(id)
	a.byRank[r] = append(a.byRank[r], endpoint)
	if eps := a.byRank[r]; len(eps) > maxEndpointsPerRank {
		a.unbind(eps[0])
	}
	for a.bookLRU.Len() > maxBookEntries {
		a.unbind(a.bookLRU.Back().Value.(string))
	}
	return w
}

func (a *addressing) unbind(endpoint string) {
	w := a.book[endpoint]
	if w == nil {
		return
	}
	a.bookLRU.Remove(w.elem)
	delete(a.book, endpoint)
	r := keyOf(w.id)
	eps := a.byRank[r]
	for i, ep := range eps {
		if ep == endpoint {
			eps = append(eps[:i], eps[i+1:]...)
			break
		}
	}
	if len(eps) == 0 {
		delete(a.byRank, r)
	} else {
		a.byRank[r] = eps
	}
}

// nudge says whether to tell a sender process that addressed this rank's
// predecessor where this one is: once per interval per sender process.
func (a *addressing) nudge(from wire.From, now time.Time, interval time.Duration) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := senderKey{keyOf(from), from.Epoch}
	if last, ok := a.nudged[k]; ok && now.Sub(last) < interval {
		return false
	}
	if len(a.nudged) >= maxBookEntries {
		clear(a.nudged)
	}
	a.nudged[k] = now
	return true
}

// vouch says whether a message that could not be decoded may still be
// answered at endpoint (a malformed REQUEST's STATUS): its envelope names
// this process, and under per-rank identity the endpoint is bound to the
// rank of the envelope's certificate.
func (a *addressing) vouch(self wire.From, endpoint string, env Envelope) bool {
	if env.To.Epoch != self.Epoch {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.book[endpoint]
	if a.id == nil {
		return w != nil
	}
	pc := a.certs[string(env.Cert)]
	return w != nil && pc != nil && keyOf(w.id) == keyOf(certIdentity(pc.cert))
}

// shift moves the bitmap s numbers up: bit i becomes bit i+s.
func (w *window) shift(s uint64) {
	const n = replayWindow / 64
	if s >= replayWindow {
		w.bits = [n]uint64{}
		return
	}
	words, bits := int(s/64), s%64
	for i := n - 1; i >= 0; i-- {
		var v uint64
		if j := i - words; j >= 0 {
			v = w.bits[j] << bits
			if bits > 0 && j > 0 {
				v |= w.bits[j-1] >> (64 - bits)
			}
		}
		w.bits[i] = v
	}
}

// accept marks seq received; false if it was, or is below the window.
func (w *window) accept(seq uint64) bool {
	if seq == 0 {
		return false
	}
	if seq > w.top {
		w.shift(seq - w.top)
		w.top = seq
		w.bits[0] |= 1
		return true
	}
	d := w.top - seq
	if d >= replayWindow {
		return false
	}
	word, bit := d/64, d%64
	if w.bits[word]&(1<<bit) != 0 {
		return false
	}
	w.bits[word] |= 1 << bit
	return true
}

// Agent metadata travels sealed to its recipient: AES-256-GCM under a key
// derived from the pair key (or the secret), with the sender's and the
// receiver's identities and epochs as associated data, so a blob can be
// read only by the rank it was sent to and presented by no one but the
// rank that registered the memory it describes.
const sealMagic = "KVS1"

func sealKey(key, secret []byte) []byte {
	if key == nil {
		key = secret
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte("kvbridge agent_md v1"))
	return m.Sum(nil)
}

func sealAAD(from, to wire.From) []byte {
	b := []byte(from.Peer())
	b = binary.LittleEndian.AppendUint64(b, from.Epoch)
	b = append(b, 0)
	b = append(b, to.Peer()...)
	return binary.LittleEndian.AppendUint64(b, to.Epoch)
}

func sealGCM(key, secret []byte) (cipher.AEAD, error) {
	blk, err := aes.NewCipher(sealKey(key, secret))
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(blk)
}

func sealMD(key, secret, md []byte, from, to wire.From) ([]byte, error) {
	g, err := sealGCM(key, secret)
	if err != nil {
		return nil, err
	}
	out := make([]byte, len(sealMagic)+g.NonceSize(), len(sealMagic)+g.NonceSize()+len(md)+g.Overhead())
	copy(out, sealMagic)
	if _, err := rand.Read(out[len(sealMagic):]); err != nil {
		return nil, err
	}
	return g.Seal(out, out[len(sealMagic):], md, sealAAD(from, to)), nil
}

func openMD(key, secret, sealed []byte, from, to wire.From) ([]byte, error) {
	g, err := sealGCM(key, secret)
	if err != nil {
		return nil, err
	}
	if len(sealed) < len(sealMagic)+g.NonceSize()+g.Overhead() || string(sealed[:len(sealMagic)]) != sealMagic {
		return nil, errors.New("agent metadata is not sealed to this rank")
	}
	n := sealed[len(sealMagic) : len(sealMagic)+g.NonceSize()]
	return g.Open(nil, n, sealed[len(sealMagic)+g.NonceSize():], sealAAD(from, to))
}

// peerKey returns the verified certificate of an envelope (nil without
// per-rank identity).
func (a *addressing) peerKey(raw []byte) *peerCert {
	if a.id == nil || raw == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.certs[string(raw)]
}

// SealAs seals a message's three frames as a rank would send them, for
// tools and tests that speak the protocol without a Loop: with id nil,
// tagged with the shared secret (env.Cert must be empty); with id, as the
// rank id names, to the peer whose certificate is given (env.Cert is set
// to id's). A REGISTER's agent metadata must be sealed first (SealAgentMD).
func SealAs(auth *bootstrap.Auth, id *ident.RankIdentity, peer []byte, frames [][]byte, env Envelope) ([][]byte, error) {
	key, err := tagKey(auth.Secret, id, peer)
	if err != nil {
		return nil, err
	}
	if id != nil {
		env.Cert = id.Cert.Raw()
	}
	a, err := newSealer(auth)
	if err != nil {
		return nil, err
	}
	return a.seal(key, frames[:len(frames):len(frames)], env), nil
}

// SealAgentMD seals agent metadata (or an ownership proof) from the rank
// from to the rank to (as the envelope will address it), as SealAs would
// tag it.
func SealAgentMD(auth *bootstrap.Auth, id *ident.RankIdentity, peer []byte, md []byte, from, to wire.From) ([]byte, error) {
	key, err := tagKey(auth.Secret, id, peer)
	if err != nil {
		return nil, err
	}
	return sealMD(key, auth.Secret, md, from, to)
}

// OpenAs opens a message sent to the rank id names under per-rank identity
// (its body sealed to id; PROTOCOL.md "Sealed bodies"), for tools and tests
// that speak the protocol without a Loop: the sender's certificate must be
// the deployment CA's. It checks what Auth.Open checks, not the Loop's
// addressing and replay rules; why is an Auth* reason. The body is
// decrypted in place (frames[2]).
func OpenAs(auth *bootstrap.Auth, id *ident.RankIdentity, frames [][]byte, now time.Time) (opened [][]byte, env Envelope, why string) {
	a, err := newSealer(auth)
	if err != nil {
		return nil, Envelope{}, AuthBadTag
	}
	return a.open(frames, now, func(cert []byte) ([]byte, string) {
		if cert == nil {
			return nil, AuthNoIdentity
		}
		c, err := ident.ParseCert(cert, id.CA, now)
		if err != nil || c.Role == id.Cert.Role { // (a rank talks to the other role's ranks)
			return nil, AuthNoIdentity
		}
		key, err := pairKey(auth.Secret, id, c)
		if err != nil {
			return nil, AuthNoIdentity
		}
		return key, ""
	})
}

func tagKey(secret []byte, id *ident.RankIdentity, peer []byte) ([]byte, error) {
	if id == nil {
		return nil, nil
	}
	c, err := ident.ParseCert(peer, id.CA, time.Now())
	if err != nil {
		return nil, err
	}
	return pairKey(secret, id, c)
}

// pairKey derives the MAC key of the pair (id, peer) under the deployment
// secret: both the secret and one of the two private keys are needed.
func pairKey(secret []byte, id *ident.RankIdentity, peer *ident.Cert) ([]byte, error) {
	shared, err := id.Agree(peer)
	if err != nil {
		return nil, err
	}
	a, b := id.Cert.Raw(), peer.Raw()
	if bytes.Compare(a, b) > 0 {
		a, b = b, a
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("kvbridge pair key v1"))
	m.Write(shared)
	for _, c := range [][]byte{a, b} {
		var n [2]byte
		binary.LittleEndian.PutUint16(n[:], uint16(len(c)))
		m.Write(n[:])
		m.Write(c)
	}
	return m.Sum(nil), nil
}

// certIdentity is the identity a certificate vouches for (no endpoint or
// epoch: those change with every start).
func certIdentity(c *ident.Cert) wire.From {
	return wire.From{Role: c.Role, Instance: c.Instance, Rank: c.Rank}
}
