package bootstrap

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// Auth authenticates the control plane and the bootstrap server's writes
// with one shared secret (PROTOCOL.md "Authentication"). Every control
// message carries a fourth frame, its envelope: the send time, the
// sender's message number, the receiver it is addressed to (identity and
// epoch), the sender's certificate under per-rank identity, and an
// HMAC-SHA256 over the three message frames and the envelope. The key is
// the secret, or under per-rank identity (RankIdentity) a key only the
// sender and the receiver can derive. A rank drops, unanswered and counted,
// every message without a valid tag, sent more than MaxSkew away from its
// own clock, addressed to another rank or another process of itself, or
// already received (the Loop's checks).
//
// Bootstrap writes carry BootstrapToken as a bearer token.
type Auth struct {
	// Secret is shared by every rank of the deployment and its bootstrap
	// server; at least MinSecretBytes.
	Secret []byte
	// MaxSkew bounds |receiver clock − send time|, default 1 min.
	MaxSkew time.Duration

	pool   sync.Pool
	pairMu sync.RWMutex
	pairs  map[string]*sync.Pool // HMACs by pair key
}

// MinSecretBytes is the shortest secret accepted.
const MinSecretBytes = 16

// EnvelopeMagic opens the authentication frame ("KVA2": the first
// revision's 40-byte frame of time and tag is refused as unaddressed).
const EnvelopeMagic = "KVA2"

// envelopeFixed is the envelope's length without the receiver's instance
// name and the certificate: magic, sent, seq, to epoch, to role, to rank,
// the two lengths and the tag.
const envelopeFixed = 4 + 8 + 8 + 8 + 1 + 4 + 2 + 2 + sha256.Size

// MaxEnvelopeBytes bounds the authentication frame.
const MaxEnvelopeBytes = envelopeFixed + MaxNameBytes + MaxCertBytes

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
)

// AuthReasons lists the reasons, in label order.
var AuthReasons = []string{AuthMissing, AuthBadTag, AuthStale, AuthNoIdentity, AuthForged, AuthUnaddressed}

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
	To From
	// Cert is the sender's certificate under per-rank identity (nil with
	// the shared secret alone).
	Cert []byte
}

// NewAuth checks the secret and returns an Auth with default settings.
func NewAuth(secret []byte) (*Auth, error) {
	a := &Auth{Secret: secret}
	return a, a.normalise()
}

func (a *Auth) normalise() error {
	if len(a.Secret) < MinSecretBytes {
		return fmt.Errorf("bootstrap: the shared secret has %d bytes, want at least %d", len(a.Secret), MinSecretBytes)
	}
	if a.MaxSkew <= 0 {
		a.MaxSkew = time.Minute
	}
	secret := append([]byte(nil), a.Secret...)
	a.pool.New = func() any { return &tagger{h: hmac.New(sha256.New, secret)} }
	return nil
}

// tagger is a pooled HMAC and the scratch its input and sum go through
// (written through the hash.Hash interface, a local array would escape).
type tagger struct {
	h   hash.Hash
	n   [4]byte
	sum [sha256.Size]byte
}

// tag appends the HMAC of the frames and the envelope, with the secret
// (key nil) or a pair key, to dst.
func (a *Auth) tag(dst []byte, key []byte, frames [][]byte, env []byte) []byte {
	pool := &a.pool
	if key != nil {
		pool = a.pairPool(key)
	}
	t := pool.Get().(*tagger)
	t.h.Reset()
	for _, f := range frames {
		binary.LittleEndian.PutUint32(t.n[:], uint32(len(f)))
		t.h.Write(t.n[:])
		t.h.Write(f)
	}
	t.h.Write(env)
	dst = append(dst, t.h.Sum(t.sum[:0])...)
	pool.Put(t)
	return dst
}

// tagEqual checks tag against the HMAC of the frames and the envelope.
func (a *Auth) tagEqual(tag []byte, key []byte, frames [][]byte, env []byte) bool {
	var buf [sha256.Size]byte
	return hmac.Equal(a.tag(buf[:0], key, frames, env), tag)
}

// pairPool returns the pool of HMACs keyed with a pair key (at most
// maxBookEntries keys are kept; past it the pools start again).
func (a *Auth) pairPool(key []byte) *sync.Pool {
	a.pairMu.RLock()
	p := a.pairs[string(key)]
	a.pairMu.RUnlock()
	if p != nil {
		return p
	}
	k := append([]byte(nil), key...)
	p = &sync.Pool{New: func() any { return &tagger{h: hmac.New(sha256.New, k)} }}
	a.pairMu.Lock()
	if a.pairs == nil || len(a.pairs) >= maxBookEntries {
		a.pairs = map[string]*sync.Pool{}
	}
	a.pairs[string(k)] = p
	a.pairMu.Unlock()
	return p
}

// Seal appends the authentication frame to the three frames of a message,
// tagged with the shared secret (env.Cert must be empty: per-rank identity
// seals through the Loop, which holds the pair keys).
func (a *Auth) Seal(frames [][]byte, env Envelope) [][]byte {
	return a.seal(nil, frames, env)
}

func (a *Auth) seal(key []byte, frames [][]byte, env Envelope) [][]byte {
	return append(frames, a.sealInto(nil, key, frames, env))
}

// sealInto appends the authentication frame of frames to dst (a sender
// reuses dst's memory from one message to the next).
func (a *Auth) sealInto(dst []byte, key []byte, frames [][]byte, env Envelope) []byte {
	inst := env.To.Instance
	if len(inst) > MaxNameBytes {
		inst = inst[:MaxNameBytes]
	}
	f := slices.Grow(dst, envelopeFixed+len(inst)+len(env.Cert))
	f = append(f, EnvelopeMagic...)
	f = binary.LittleEndian.AppendUint64(f, uint64(env.Sent.UnixNano()))
	f = binary.LittleEndian.AppendUint64(f, env.Seq)
	f = binary.LittleEndian.AppendUint64(f, env.To.Epoch)
	f = append(f, roleByte(env.To.Role))
	f = binary.LittleEndian.AppendUint32(f, uint32(env.To.Rank))
	f = binary.LittleEndian.AppendUint16(f, uint16(len(inst)))
	f = append(f, inst...)
	f = binary.LittleEndian.AppendUint16(f, uint16(len(env.Cert)))
	f = append(f, env.Cert...)
	return a.tag(f, key, frames, f[len(dst):])
}

// parseEnvelope splits the authentication frame into the envelope and
// the offset of its tag; why is AuthMissing, AuthBadTag or AuthUnaddressed.
func parseEnvelope(f []byte) (env Envelope, tagAt int, why string) {
	if len(f) == 8+sha256.Size { // the first revision's frame: time and tag only
		return env, 0, AuthUnaddressed
	}
	if len(f) < envelopeFixed || len(f) > MaxEnvelopeBytes || string(f[:4]) != EnvelopeMagic {
		return env, 0, AuthBadTag
	}
	env.Sent = time.Unix(0, int64(binary.LittleEndian.Uint64(f[4:])))
	env.Seq = binary.LittleEndian.Uint64(f[12:])
	env.To.Epoch = binary.LittleEndian.Uint64(f[20:])
	env.To.Role = byteRole(f[28])
	env.To.Rank = int(binary.LittleEndian.Uint32(f[29:]))
	off := 33
	n := int(binary.LittleEndian.Uint16(f[off:]))
	off += 2
	if n > MaxNameBytes || len(f)-off < n+2+sha256.Size {
		return env, 0, AuthBadTag
	}
	env.To.Instance = string(f[off : off+n])
	off += n
	c := int(binary.LittleEndian.Uint16(f[off:]))
	off += 2
	if c > MaxCertBytes || len(f)-off != c+sha256.Size {
		return env, 0, AuthBadTag
	}
	if c > 0 {
		env.Cert = f[off : off+c]
	}
	return env, off + c, ""
}

// Open checks and strips the authentication frame of a message tagged
// with the shared secret; why is one of the Auth* reasons. (The Loop opens
// messages under per-rank identity itself.)
func (a *Auth) Open(frames [][]byte, now time.Time) (opened [][]byte, env Envelope, why string) {
	return a.open(frames, now, nil)
}

// open checks the tag with the secret, or with the pair key keyFor
// returns for the envelope's certificate (keyFor nil: secret only; a
// certificate is then refused as AuthNoIdentity... by the caller).
func (a *Auth) open(frames [][]byte, now time.Time, keyFor func(cert []byte) ([]byte, string)) ([][]byte, Envelope, string) {
	if len(frames) != 4 {
		return nil, Envelope{}, AuthMissing
	}
	f := frames[3]
	env, at, why := parseEnvelope(f)
	if why != "" {
		return nil, env, why
	}
	var key []byte
	switch {
	case keyFor != nil:
		if key, why = keyFor(env.Cert); why != "" {
			return nil, env, why
		}
	case env.Cert != nil:
		return nil, env, AuthNoIdentity // a certificate this rank has no key for
	}
	if !a.tagEqual(f[at:], key, frames[:3], f[:at]) {
		return nil, env, AuthBadTag
	}
	if d := now.Sub(env.Sent); d > a.MaxSkew || d < -a.MaxSkew {
		return nil, env, AuthStale
	}
	return frames[:3], env, ""
}

// BootstrapToken is the bearer token for bootstrap server writes derived
// from the secret (so the secret itself never travels).
func (a *Auth) BootstrapToken() string {
	m := hmac.New(sha256.New, a.Secret)
	m.Write([]byte("kvbridge bootstrap token v1"))
	return hex.EncodeToString(m.Sum(nil))
}

// Environment variables read by AuthFromEnv.
const (
	EnvSecret     = "KVBRIDGE_SECRET"      // the shared secret itself
	EnvSecretFile = "KVBRIDGE_SECRET_FILE" // a file holding it (trailing newline ignored)
	EnvInsecure   = "KVBRIDGE_INSECURE"    // "1": run without authentication (logged as a warning)
)

// ErrNoSecret: neither a secret nor an explicit insecure mode is configured.
var ErrNoSecret = errors.New("no shared secret: set " + EnvSecret + " or " + EnvSecretFile +
	" (the same on every rank and the bootstrap server), or " + EnvInsecure + "=1 to run without authentication")

// AuthFromEnv reads KVBRIDGE_SECRET or KVBRIDGE_SECRET_FILE, and
// KVBRIDGE_INSECURE. It returns (nil, true, nil) for an explicit insecure
// mode, (nil, false, nil) when nothing is set.
func AuthFromEnv() (auth *Auth, insecure bool, err error) {
	secret := os.Getenv(EnvSecret)
	if path := os.Getenv(EnvSecretFile); secret == "" && path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, false, fmt.Errorf("bootstrap: %s: %w", EnvSecretFile, err)
		}
		secret = strings.TrimRight(string(b), "\r\n")
	}
	insecure = os.Getenv(EnvInsecure) == "1" || strings.EqualFold(os.Getenv(EnvInsecure), "true")
	if secret == "" {
		return nil, insecure, nil
	}
	if insecure {
		return nil, false, fmt.Errorf("bootstrap: both a shared secret and %s are set; choose one", EnvInsecure)
	}
	a, err := NewAuth([]byte(secret))
	if err != nil {
		return nil, false, err
	}
	return a, false, nil
}
