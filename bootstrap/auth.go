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
	"strings"
	"sync"
	"time"
)

// Auth authenticates the control plane and the bootstrap server's writes
// with one shared secret (PROTOCOL.md "Authentication"). Every control
// message carries a fourth frame: the send time and an HMAC-SHA256 over the
// three message frames and that time. A rank with Auth drops, unanswered
// and counted, every message without a valid tag or sent more than MaxSkew
// away from its own clock. The tag covers the sender's identity, so a
// captured message cannot be replayed under another identity; it can be
// replayed unchanged within MaxSkew, which the protocol tolerates (every
// message is idempotent for its room and epoch).
//
// Bootstrap writes carry BootstrapToken as a bearer token.
type Auth struct {
	// Secret is shared by every rank of the deployment and its bootstrap
	// server; at least MinSecretBytes.
	Secret []byte
	// MaxSkew bounds |receiver clock − send time|, default 1 min.
	MaxSkew time.Duration

	pool sync.Pool
}

// MinSecretBytes is the shortest secret accepted.
const MinSecretBytes = 16

// AuthFrameLen is the length of the fourth frame: 8-byte send time (Unix
// nanoseconds, little-endian) and a 32-byte HMAC-SHA256 tag.
const AuthFrameLen = 8 + sha256.Size

// Why an unauthenticated message was dropped (the label of
// kvbridge_unauthenticated_messages_total).
const (
	AuthMissing = "missing" // no authentication frame
	AuthBadTag  = "bad_tag" // wrong length or tag (another secret, or altered)
	AuthStale   = "stale"   // sent further than MaxSkew from now
)

// AuthReasons lists the reasons, in label order.
var AuthReasons = []string{AuthMissing, AuthBadTag, AuthStale}

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
	a.pool.New = func() any { return hmac.New(sha256.New, secret) }
	return nil
}

func (a *Auth) tag(frames [][]byte, ts []byte) []byte {
	h := a.pool.Get().(hash.Hash)
	h.Reset()
	var n [4]byte
	for _, f := range frames {
		binary.LittleEndian.PutUint32(n[:], uint32(len(f)))
		h.Write(n[:])
		h.Write(f)
	}
	h.Write(ts)
	out := h.Sum(make([]byte, 0, sha256.Size))
	a.pool.Put(h)
	return out
}

// Seal appends the authentication frame to the three frames of a message.
func (a *Auth) Seal(frames [][]byte, now time.Time) [][]byte {
	f := make([]byte, 8, AuthFrameLen)
	binary.LittleEndian.PutUint64(f, uint64(now.UnixNano()))
	f = append(f, a.tag(frames, f)...)
	return append(frames, f)
}

// Open checks and strips the authentication frame; the error is one of the
// Auth* reasons.
func (a *Auth) Open(frames [][]byte, now time.Time) ([][]byte, string) {
	if len(frames) != 4 {
		return nil, AuthMissing
	}
	f := frames[3]
	if len(f) != AuthFrameLen {
		return nil, AuthBadTag
	}
	if !hmac.Equal(a.tag(frames[:3], f[:8]), f[8:]) {
		return nil, AuthBadTag
	}
	sent := time.Unix(0, int64(binary.LittleEndian.Uint64(f[:8])))
	if d := now.Sub(sent); d > a.MaxSkew || d < -a.MaxSkew {
		return nil, AuthStale
	}
	return frames[:3], ""
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
