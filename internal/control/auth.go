package control

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/wire"
)

// A control message's fourth frame is its envelope (PROTOCOL.md
// "Authentication", "Envelope"): the send time, the sender's message
// number, the receiver it is addressed to (identity and epoch), the
// sender's certificate under per-rank identity, the sending process's
// salt and a GMAC (AES-256-GCM over no plaintext) of the three message
// frames and the envelope, keyed per sending process from the
// deployment's shared secret (bootstrap.Auth) or, under per-rank
// identity, from a key only the sender and the receiver can derive
// (pairKey); under per-rank identity the body is sealed instead, with
// AES-256-GCM under a key per sending process too ("Sealed bodies"). This
// file writes and
// checks envelopes; address.go holds the receiver's further checks
// (addressed to this process, not a replay).

// sealer tags, seals and opens messages with one Auth: a private copy of
// it (MaxSkew defaulted), the salt of the messages it tags, and the
// ciphers it reuses. A sealer tags the messages of one sender process
// (a Loop, numbering them with its addressing's seq): a tag's nonce is
// its message number under a key of the sealer's salt.
type sealer struct {
	bootstrap.Auth

	// salt is drawn at random per sealer: the key of its tags, and so the
	// key their nonce (the message number) must not repeat under, is
	// derived from it (tagCipher).
	salt [tagSaltBytes]byte
	self cipher.AEAD // the tag cipher of salt under the secret

	pairMu  sync.RWMutex
	ciphers map[cipherID]*cipherMemo // tag and body ciphers of sender processes (under pairMu)
	// last is the cipher of ciphers used last, found without hashing its
	// id (a receiver's messages come in runs from one sender process). A
	// cipher is its id's for good (deriveCipher), so one the map no
	// longer holds is still right.
	last atomic.Pointer[cipherMemo]
	aads sync.Pool // *aadBuf: the associated data of a message
}

// newSealer returns a sealer for auth (its secret is not checked here:
// NewLoop checks it with bootstrap.NewAuth). It fails only where AES-GCM
// with caller-chosen nonces is not allowed (GODEBUG=fips140=only).
func newSealer(auth *bootstrap.Auth) (*sealer, error) {
	a := &sealer{Auth: bootstrap.Auth{Secret: bytes.Clone(auth.Secret), MaxSkew: auth.MaxSkew}}
	if a.MaxSkew <= 0 {
		a.MaxSkew = time.Minute
	}
	if _, err := rand.Read(a.salt[:]); err != nil {
		panic(err) // crypto/rand does not fail
	}
	var err error
	if a.self, err = deriveCipher(tagLabel, a.Secret, a.salt[:]); err != nil {
		return nil, fmt.Errorf("message tags need AES-256-GCM with counter nonces: %w", err)
	}
	return a, nil
}

// mustSealer is newSealer for the tools' Seal and Open.
func mustSealer(auth *bootstrap.Auth) *sealer {
	a, err := newSealer(auth)
	if err != nil {
		panic("control: " + err.Error())
	}
	return a
}

// EnvelopeMagic opens the authentication frame of a tagged message
// ("KVA4": GMAC under a key per sending process; the second revision's
// "KVA2", tagged with HMAC-SHA256, is refused as bad_tag, the first
// revision's 40-byte frame of time and tag as unaddressed).
const EnvelopeMagic = "KVA4"

// tagSaltBytes is the sending process's salt in a tagged envelope, and
// tagBytes its GMAC tag.
const (
	tagSaltBytes = 16
	tagBytes     = 16
)

// envelopeSealedMagic opens the authentication frame of a message sealed
// under per-rank identity ("KVA5", PROTOCOL.md "Sealed bodies"): its body
// (frame 2) is encrypted and authenticated with AES-256-GCM under the
// sending process's body key for the pair, the message number its nonce,
// and the envelope ends with the process's salt (no tag: the body carries
// it). The third revision's "KVA3" (XChaCha20-Poly1305, a 24-byte nonce)
// is refused as bad_tag.
const envelopeSealedMagic = "KVA5"

// envelopeFixed is the envelope's length without the receiver's instance
// name and the certificate: magic, sent, seq, to epoch, to role, to rank,
// the two lengths, the salt and the tag (a sealed envelope's nonce is
// shorter).
const envelopeFixed = 4 + 8 + 8 + 8 + 1 + 4 + 2 + 2 + tagSaltBytes + tagBytes

// maxHeaderFrame bounds frames 0 and 1 of a sealed message (the magic and
// the type name) before they are read.
const maxHeaderFrame = 32

// sealedFixed is a sealed envelope's length without the instance name and
// the certificate.
const sealedFixed = envelopeFixed - tagBytes

// MaxEnvelopeBytes bounds the authentication frame.
const MaxEnvelopeBytes = envelopeFixed + wire.MaxNameBytes + wire.MaxCertBytes

// Why an unauthenticated message was dropped (the label of
// kvbridge_unauthenticated_messages_total).
const (
	AuthMissing = "missing" // no authentication frame
	AuthBadTag  = "bad_tag" // wrong length or tag (another secret, or altered)
	AuthStale   = "stale"   // sent further than MaxSkew from now
	// AuthNoIdentity: per-rank identity is on and the message carries no
	// certificate (tagged with the shared secret alone), or the sender's
	// certificate is not this deployment's CA's, has expired, or names a
	// rank of this rank's own role.
	AuthNoIdentity = "no_identity"
	// AuthForged: the body's from names another rank than the sender's
	// certificate.
	AuthForged = "forged_identity"
	// AuthUnaddressed: the envelope does not name this rank, or names no
	// receiver epoch on a message that needs one (all but PING and
	// REGISTER), or is the first revision's frame.
	AuthUnaddressed = "unaddressed"
	// AuthUnsealed: under per-rank identity, a message tagged but not
	// sealed (its body readable on the wire: a sender of an earlier
	// revision).
	AuthUnsealed = "unsealed"
)

// AuthReasons lists the reasons, in label order.
var AuthReasons = []string{AuthMissing, AuthBadTag, AuthStale, AuthNoIdentity, AuthForged, AuthUnaddressed, AuthUnsealed}

// Why a fresh, authentic message was still dropped (the label of
// kvbridge_replayed_messages_total).
const (
	// ReplayOtherEpoch: addressed to another process (epoch) of this rank:
	// a message captured before this process started.
	ReplayOtherEpoch = "other_epoch"
	// ReplayDuplicate: a message number of that sender process already
	// received, or older than the window of numbers kept.
	ReplayDuplicate = "duplicate"
	// ReplayOverflow: a new sender process while the windows of 4,096
	// others, each heard within MaxSkew, are kept (none can be forgotten
	// without letting its replays through).
	ReplayOverflow = "overflow"
)

// ReplayReasons lists the reasons, in label order.
var ReplayReasons = []string{ReplayOtherEpoch, ReplayDuplicate, ReplayOverflow}

// Envelope is the authentication frame's content besides the tag.
type Envelope struct {
	Sent time.Time
	// Seq numbers the sender process's messages (from 1, one counter per
	// epoch for all receivers).
	Seq uint64
	// To is the receiver: Role, Instance, Rank and Epoch; an empty Role
	// when the sender does not know the receiver's identity, a zero Epoch
	// when it does not know its process.
	To wire.From
	// Cert is the sender's certificate under per-rank identity (nil with
	// the shared secret alone).
	Cert []byte
}

// The labels of a sender process's keys: its tags' (under the secret or a
// pair key) and its sealed bodies' (under a pair key).
const (
	tagLabel  = "kvbridge tag key v1"
	bodyLabel = "kvbridge body v2"
)

// cipherID names a sender process's cipher: its label, the key it was
// derived from (the pair key; zero for the secret) and the process's salt.
type cipherID struct {
	label string
	key   [sha256.Size]byte
	salt  [tagSaltBytes]byte
}

// deriveCipher returns a sender process's cipher: AES-256-GCM keyed with
// HMAC-SHA256(key, label || salt).
func deriveCipher(label string, key, salt []byte) (cipher.AEAD, error) {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	m.Write(salt)
	blk, err := aes.NewCipher(m.Sum(nil))
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(blk)
}

// cipherOf returns the cipher of label and salt under the secret (key
// nil) or a pair key, from the cache when it is there (cached false:
// derived now; remember keeps it once a message under it proved
// authentic, so a stranger's salts cost a derivation each and evict
// nothing).
func (a *sealer) cipherOf(label string, key, salt []byte) (c cipher.AEAD, id cipherID, cached bool) {
	if label == tagLabel && key == nil && bytes.Equal(salt, a.salt[:]) {
		return a.self, id, true
	}
	id.label = label
	copy(id.key[:], key)
	copy(id.salt[:], salt)
	if m := a.last.Load(); m != nil && m.id == id {
		return m.c, id, true
	}
	a.pairMu.RLock()
	m := a.ciphers[id]
	a.pairMu.RUnlock()
	if m != nil {
		a.last.Store(m) // (the map's own entry: nothing allocated)
		return m.c, id, true
	}
	base := key
	if key == nil {
		base = a.Secret
	}
	c, err := deriveCipher(label, base, salt)
	if err != nil {
		panic(err) // newSealer derived one with the same primitives
	}
	return c, id, false
}

// own returns this sealer's own cipher of label under the secret (key
// nil) or a pair key, cached.
func (a *sealer) own(label string, key []byte) cipher.AEAD {
	c, id, cached := a.cipherOf(label, key, a.salt[:])
	if !cached {
		a.remember(id, c)
	}
	return c
}

// remember caches a cipher (at most maxBookEntries are kept; past it the
// cache starts again).
func (a *sealer) remember(id cipherID, c cipher.AEAD) {
	a.pairMu.Lock()
	if a.ciphers == nil || len(a.ciphers) >= maxBookEntries {
		a.ciphers = map[cipherID]*cipherMemo{}
	}
	m := &cipherMemo{id, c}
	a.ciphers[id] = m
	a.pairMu.Unlock()
	a.last.Store(m)
}

// cipherMemo is the cipher a sealer found last (sealer.last).
type cipherMemo struct {
	id cipherID
	c  cipher.AEAD
}

// aadBuf is the scratch of a tag or a seal: its associated data and a
// tag's nonce (pooled: a slice handed to cipher.AEAD escapes).
type aadBuf struct {
	b  []byte
	nb [12]byte
}

// nonce lays out the nonce of a tag or a sealed body: four zero bytes,
// then the message number (little-endian), which a sender process never
// uses twice.
func (p *aadBuf) nonce(seq uint64) []byte {
	p.nb = [12]byte{}
	binary.LittleEndian.PutUint64(p.nb[4:], seq)
	return p.nb[:]
}

// tagOK checks a tagged envelope f (its salt at at, then its tag) against
// the frames, with the tag cipher of its salt under the secret (key nil)
// or a pair key.
func (a *sealer) tagOK(key []byte, frames [][]byte, f []byte, at int, seq uint64) bool {
	c, id, cached := a.cipherOf(tagLabel, key, f[at:at+tagSaltBytes])
	aad := a.aad(frames, f[:at+tagSaltBytes])
	_, err := c.Open(nil, aad.nonce(seq), f[at+tagSaltBytes:], aad.b)
	a.putAAD(aad)
	if err != nil {
		return false
	}
	if !cached {
		a.remember(id, c)
	}
	return true
}

// Seal appends the authentication frame to the three frames of a message,
// tagged with auth's shared secret (env.Cert must be empty: per-rank
// identity seals through SealAs or the Loop), for tools and tests that
// speak the protocol without a Loop.
func Seal(auth *bootstrap.Auth, frames [][]byte, env Envelope) [][]byte {
	return mustSealer(auth).seal(nil, frames, env)
}

// seal seals a message's three frames: tagged with the secret (key nil),
// or under a pair key with its body sealed (frames is then not changed).
// Its nonce is env.Seq under the sealer's salt: a sealer seals each
// number once (a Loop numbers its messages; SealAs makes a sealer per
// message).
func (a *sealer) seal(key []byte, frames [][]byte, env Envelope) [][]byte {
	if key == nil {
		return append(frames, a.sealInto(nil, key, frames, env))
	}
	out := slices.Clone(frames[:3])
	var envFrame []byte
	envFrame, out[2] = a.sealBodyInto(nil, nil, key, frames, env)
	return append(out, envFrame)
}

// sealInto appends the authentication frame of frames to dst (a sender
// reuses dst's memory from one message to the next): the envelope, the
// sealer's salt, and the GMAC of the frames (a message's three, each with
// its length as a uint32) and the envelope up to the tag, its nonce
// env.Seq.
func (a *sealer) sealInto(dst []byte, key []byte, frames [][]byte, env Envelope) []byte {
	f := appendEnvelope(dst, EnvelopeMagic, env)
	f = append(f, a.salt[:]...)
	c := a.own(tagLabel, key)
	aad := a.aad(frames, f[len(dst):])
	f = c.Seal(f, aad.nonce(env.Seq), nil, aad.b)
	a.putAAD(aad)
	return f
}

// sealBodyInto seals a message under a pair key: it appends the sealed
// authentication frame (the envelope, then the sealer's salt) to dst and
// frame 2 encrypted with the sender process's body key for the pair, its
// 16-byte tag appended, to body; the nonce is env.Seq. The associated
// data are frames 0 and 1 and the whole envelope.
func (a *sealer) sealBodyInto(dst, body, key []byte, frames [][]byte, env Envelope) (envFrame, sealed []byte) {
	f := appendEnvelope(dst, envelopeSealedMagic, env)
	f = append(f, a.salt[:]...)
	c := a.own(bodyLabel, key)
	aad := a.aad(frames[:2], f[len(dst):])
	sealed = c.Seal(body, aad.nonce(env.Seq), frames[2], aad.b)
	a.putAAD(aad)
	return f, sealed
}

// maxKeptAAD bounds the scratch kept for the next message: a large body
// (a REGISTER's, or an outsider's 16 MiB) is copied once and left to the
// GC.
const maxKeptAAD = 64 << 10

// putAAD gives p back to the pool unless it grew past maxKeptAAD.
func (a *sealer) putAAD(p *aadBuf) {
	if cap(p.b) <= maxKeptAAD {
		a.aads.Put(p)
	}
}

// aad lays out a message's associated data: for each frame (0 and 1 for a
// sealed message, 0, 1 and 2 for a tagged one) its length as a uint32 and
// its bytes, then the envelope. The caller puts it back in a.aads.
func (a *sealer) aad(frames [][]byte, env []byte) *aadBuf {
	p, _ := a.aads.Get().(*aadBuf)
	if p == nil {
		p = new(aadBuf)
	}
	b := p.b[:0]
	for _, f := range frames {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	p.b = append(b, env...)
	return p
}

// appendEnvelope appends an envelope's fields, from magic to the
// certificate, to dst.
func appendEnvelope(dst []byte, magic string, env Envelope) []byte {
	inst := env.To.Instance
	if len(inst) > wire.MaxNameBytes {
		inst = inst[:wire.MaxNameBytes]
	}
	f := slices.Grow(dst, envelopeFixed+len(inst)+len(env.Cert))
	f = append(f, magic...)
	f = binary.LittleEndian.AppendUint64(f, uint64(env.Sent.UnixNano()))
	f = binary.LittleEndian.AppendUint64(f, env.Seq)
	f = binary.LittleEndian.AppendUint64(f, env.To.Epoch)
	f = append(f, wire.RoleByte(env.To.Role))
	f = binary.LittleEndian.AppendUint32(f, uint32(env.To.Rank))
	f = binary.LittleEndian.AppendUint16(f, uint16(len(inst)))
	f = append(f, inst...)
	f = binary.LittleEndian.AppendUint16(f, uint16(len(env.Cert)))
	return append(f, env.Cert...)
}

// parseEnvelope splits the authentication frame into the envelope and
// the offset of its salt (a sealed one's: of its nonce); why is AuthMissing,
// AuthBadTag or AuthUnaddressed.
func parseEnvelope(f []byte) (env Envelope, tagAt int, sealed bool, why string) {
	if len(f) == 8+sha256.Size { // the first revision's frame: time and tag only
		return env, 0, false, AuthUnaddressed
	}
	if len(f) < 4 {
		return env, 0, false, AuthBadTag
	}
	sealed = string(f[:4]) == envelopeSealedMagic
	fixed, tail := envelopeFixed, tagSaltBytes+tagBytes
	if sealed {
		fixed, tail = sealedFixed, tagSaltBytes
	}
	if len(f) < fixed || len(f) > MaxEnvelopeBytes || (!sealed && string(f[:4]) != EnvelopeMagic) {
		return env, 0, false, AuthBadTag
	}
	env.Sent = time.Unix(0, int64(binary.LittleEndian.Uint64(f[4:])))
	env.Seq = binary.LittleEndian.Uint64(f[12:])
	env.To.Epoch = binary.LittleEndian.Uint64(f[20:])
	env.To.Role = wire.ByteRole(f[28])
	env.To.Rank = int(binary.LittleEndian.Uint32(f[29:]))
	off := 33
	n := int(binary.LittleEndian.Uint16(f[off:]))
	off += 2
	if n > wire.MaxNameBytes || len(f)-off < n+2+tail {
		return env, 0, false, AuthBadTag
	}
	env.To.Instance = string(f[off : off+n])
	off += n
	c := int(binary.LittleEndian.Uint16(f[off:]))
	off += 2
	if c > wire.MaxCertBytes || len(f)-off != c+tail {
		return env, 0, false, AuthBadTag
	}
	if c > 0 {
		env.Cert = f[off : off+c]
	}
	return env, off + c, sealed, ""
}

// Open checks and strips the authentication frame of a message tagged
// with auth's shared secret; why is one of the Auth* reasons. (OpenAs and
// the Loop open messages under per-rank identity.)
func Open(auth *bootstrap.Auth, frames [][]byte, now time.Time) (opened [][]byte, env Envelope, why string) {
	a, err := newSealer(auth)
	if err != nil {
		return nil, Envelope{}, AuthBadTag
	}
	return a.open(frames, now, nil)
}

// open checks the tag with the secret, or with the pair key keyFor
// returns for the envelope's certificate (keyFor nil: secret only; a
// certificate is then refused as AuthNoIdentity... by the caller).
func (a *sealer) open(frames [][]byte, now time.Time, keyFor func(cert []byte) ([]byte, string)) ([][]byte, Envelope, string) {
	if len(frames) != 4 {
		return nil, Envelope{}, AuthMissing
	}
	f := frames[3]
	env, at, sealed, why := parseEnvelope(f)
	if why != "" {
		return nil, env, why
	}
	var key []byte
	switch {
	case keyFor != nil:
		if key, why = keyFor(env.Cert); why != "" {
			return nil, env, why
		}
	case env.Cert != nil || sealed:
		return nil, env, AuthNoIdentity // a certificate this rank has no key for
	}
	if len(frames[0]) > maxHeaderFrame || len(frames[1]) > maxHeaderFrame {
		// Not a message any rank sends (a magic and a type name): refused
		// before its frames are copied into the associated data.
		return nil, env, AuthBadTag
	}
	switch {
	case sealed:
		c, id, cached := a.cipherOf(bodyLabel, key, f[at:])
		aad := a.aad(frames[:2], f)
		body, err := c.Open(frames[2][:0], aad.nonce(env.Seq), frames[2], aad.b)
		a.putAAD(aad)
		if err != nil {
			return nil, env, AuthBadTag
		}
		if !cached {
			a.remember(id, c)
		}
		frames[2] = body // decrypted in place
	case !a.tagOK(key, frames[:3], f, at, env.Seq):
		return nil, env, AuthBadTag
	case key != nil:
		// Under per-rank identity every body is sealed: an authentic but
		// only tagged one went readable on the wire.
		return nil, env, AuthUnsealed
	}
	if d := now.Sub(env.Sent); d > a.MaxSkew || d < -a.MaxSkew {
		return nil, env, AuthStale
	}
	return frames[:3], env, ""
}
