package bootstrap

import (
	"container/list"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
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
	cert *Cert
	key  []byte
}

// where is what this rank knows of the process at one endpoint.
type where struct {
	id   From // identity and epoch, from the last accepted message (Endpoint unused)
	cert *peerCert
	elem *list.Element
}

type window struct {
	top  uint64                    // highest number accepted
	bits [replayWindow / 64]uint64 // bit i: top−i accepted
	last time.Time                 // when the last one was accepted
	elem *list.Element
}

type senderKey struct {
	peer  string // From.Peer()
	epoch uint64
}

type addressing struct {
	auth *Auth
	id   *RankIdentity // nil: the shared secret alone
	role string        // this rank's role: peers have the other

	seq atomic.Uint64 // the last message number stamped

	mu       sync.Mutex
	book     map[string]*where
	bookLRU  *list.List
	certs    map[string]*peerCert // by the certificate's bytes
	certLRU  []string             // insertion order, for eviction
	windows  map[senderKey]*window
	winLRU   *list.List
	evictedW uint64 // windows forgotten while still within MaxSkew
}

func newAddressing(auth *Auth, id *RankIdentity, role string) *addressing {
	return &addressing{auth: auth, id: id, role: role, book: map[string]*where{}, bookLRU: list.New(),
		certs: map[string]*peerCert{}, windows: map[senderKey]*window{}, winLRU: list.New()}
}

var errNoPeerCert = errors.New("no identity certificate known for the peer (per-rank identity is on: a prefill rank's comes with its bootstrap record, a decode rank's with its messages)")

// verify returns the cached verification of a certificate (a.mu held).
func (a *addressing) verify(raw []byte, now time.Time) (*peerCert, error) {
	if pc, ok := a.certs[string(raw)]; ok {
		if now.After(pc.cert.NotAfter) {
			return nil, fmt.Errorf("%w: %s expired at %s", ErrBadCert, pc.cert, pc.cert.NotAfter.UTC().Format(time.RFC3339))
		}
		return pc, nil
	}
	c, err := ParseCert(raw, a.id.CA, now)
	if err != nil {
		return nil, err
	}
	if c.Role == a.role {
		return nil, fmt.Errorf("%w: %s is a %s rank, as this one: ranks talk only to ranks of the other role", ErrBadCert, c, c.Role)
	}
	key, err := a.id.pairKey(a.auth.Secret, c)
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
func (a *addressing) envelope(to Peer) (Envelope, []byte, error) {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	var env Envelope
	w := a.book[to.Endpoint]
	var pc *peerCert
	if to.Cert != "" && a.id != nil {
		var err error
		if pc, err = a.verify([]byte(to.Cert), now); err != nil {
			return env, nil, err
		}
		if w == nil { // remembered for the heartbeat's PINGs, which carry no hint
			w = &where{id: pc.cert.Identity(), cert: pc}
			w.id.Epoch = to.Epoch
			a.book[to.Endpoint] = w
			w.elem = a.bookLRU.PushFront(to.Endpoint)
			a.trimBook()
		}
	}
	switch {
	case pc != nil:
		env.To = pc.cert.Identity()
		if w != nil && w.id.Peer() == env.To.Peer() {
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
	env.Cert = a.id.Cert.raw
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
// is the certificate's rank, it is addressed to this process, its number
// is new. why is an Auth* or Replay* reason; replay tells which counter.
func (a *addressing) check(self From, m Message, env Envelope, now time.Time) (why string, replay bool) {
	from := m.Sender()
	a.mu.Lock()
	defer a.mu.Unlock()
	var pc *peerCert
	if a.id != nil {
		pc = a.certs[string(env.Cert)] // verified by keyFor
		if pc == nil || pc.cert.Identity() != (From{Role: from.Role, Instance: from.Instance, Rank: from.Rank}) {
			return AuthForged, false
		}
	}
	t := m.Type()
	opener := t == TypePing || t == TypeRegister
	to := env.To
	switch {
	case to.Epoch == 0 && !opener:
		// The epoch pins the process (and so the rank); only a PING or a
		// REGISTER may go to a rank whose process is not known yet.
		return AuthUnaddressed, false
	case to.Role != "" && (to.Role != self.Role || to.Instance != self.Instance || to.Rank != self.Rank):
		return AuthUnaddressed, false
	case to.Epoch != 0 && to.Epoch != self.Epoch && t != TypePing:
		// A PING to an old epoch is answered: the PONG tells the sender
		// which process is here now.
		return ReplayOtherEpoch, true
	}
	k := senderKey{from.Peer(), from.Epoch}
	w := a.windows[k]
	if w == nil {
		w = &window{}
		a.windows[k] = w
		w.elem = a.winLRU.PushFront(k)
		for a.winLRU.Len() > maxBookEntries {
			e := a.winLRU.Back()
			old := a.windows[e.Value.(senderKey)]
			if now.Sub(old.last) < a.auth.MaxSkew {
				a.evictedW++
			}
			delete(a.windows, e.Value.(senderKey))
			a.winLRU.Remove(e)
		}
	} else {
		a.winLRU.MoveToFront(w.elem)
	}
	if !w.accept(env.Seq) {
		return ReplayDuplicate, true
	}
	w.last = now
	// Learn where this process is, for the replies: a newer epoch, or
	// another rank now bound at the endpoint, replaces what was known.
	e := a.book[from.Endpoint]
	switch {
	case e == nil:
		e = &where{id: from, cert: pc}
		a.book[from.Endpoint] = e
		e.elem = a.bookLRU.PushFront(from.Endpoint)
		a.trimBook()
	case from.Epoch >= e.id.Epoch:
		e.id, e.cert = from, pc
		a.bookLRU.MoveToFront(e.elem)
	}
	return "", false
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

func sealAAD(from, to From) []byte {
	b := []byte(from.Peer())
	b = binary.LittleEndian.AppendUint64(b, from.Epoch)
	b = append(b, 0)
	b = append(b, to.Peer()...)
	return binary.LittleEndian.AppendUint64(b, to.Epoch)
}

func sealMD(key, secret, md []byte, from, to From) ([]byte, error) {
	blk, err := aes.NewCipher(sealKey(key, secret))
	if err != nil {
		return nil, err
	}
	g, err := cipher.NewGCM(blk)
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

func openMD(key, secret, sealed []byte, from, to From) ([]byte, error) {
	blk, err := aes.NewCipher(sealKey(key, secret))
	if err != nil {
		return nil, err
	}
	g, err := cipher.NewGCM(blk)
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

func (a *addressing) trimBook() {
	for a.bookLRU.Len() > maxBookEntries {
		b := a.bookLRU.Back()
		delete(a.book, b.Value.(string))
		a.bookLRU.Remove(b)
	}
}

// SealAs seals a message's three frames as a rank would send them, for
// tools and tests that speak the protocol without a Loop: with id nil,
// tagged with the shared secret (env.Cert must be empty); with id, as the
// rank id names, to the peer whose certificate is given (env.Cert is set
// to id's). A REGISTER's agent metadata must be sealed first (SealAgentMD).
func SealAs(auth *Auth, id *RankIdentity, peer []byte, frames [][]byte, env Envelope) ([][]byte, error) {
	key, err := tagKey(auth, id, peer)
	if err != nil {
		return nil, err
	}
	if id != nil {
		env.Cert = id.Cert.raw
	}
	return auth.seal(key, frames[:len(frames):len(frames)], env), nil
}

// SealAgentMD seals agent metadata from the rank from to the rank to (as
// the envelope will address it), as SealAs would tag it.
func SealAgentMD(auth *Auth, id *RankIdentity, peer []byte, md []byte, from, to From) ([]byte, error) {
	key, err := tagKey(auth, id, peer)
	if err != nil {
		return nil, err
	}
	return sealMD(key, auth.Secret, md, from, to)
}

func tagKey(auth *Auth, id *RankIdentity, peer []byte) ([]byte, error) {
	if id == nil {
		return nil, nil
	}
	c, err := ParseCert(peer, id.CA, time.Now())
	if err != nil {
		return nil, err
	}
	return id.pairKey(auth.Secret, c)
}
