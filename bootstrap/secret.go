package bootstrap

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// Auth authenticates the control plane and the bootstrap server's writes
// with one shared secret (PROTOCOL.md "Authentication"). Every control
// message carries a fourth frame, its envelope: the send time, the
// sender's message number, the receiver it is addressed to (identity and
// epoch), the sender's certificate under per-rank identity, and a GMAC
// (AES-256-GCM) over the three message frames and the envelope, under a
// key derived per sending process from the secret; under per-rank
// identity (RankIdentity) the body is sealed instead, with a key only the
// sender and the receiver can derive. A rank drops, unanswered and counted,
// every message without a valid tag, sent more than MaxSkew away from its
// own clock, addressed to another rank or another process of itself, or
// already received (the control loop's checks).
//
// Bootstrap writes carry BootstrapToken as a bearer token.
type Auth struct {
	// Secret is shared by every rank of the deployment and its bootstrap
	// server; at least 16 bytes (NewAuth refuses a shorter one).
	Secret []byte
	// MaxSkew bounds |receiver clock − send time|, default 1 min.
	MaxSkew time.Duration
}

// minSecretBytes is the shortest secret accepted.
const minSecretBytes = 16

// NewAuth checks the secret and returns an Auth with default settings.
func NewAuth(secret []byte) (*Auth, error) {
	a := &Auth{Secret: secret}
	if len(a.Secret) < minSecretBytes {
		return nil, fmt.Errorf("bootstrap: the shared secret has %d bytes, want at least %d", len(a.Secret), minSecretBytes)
	}
	a.MaxSkew = time.Minute
	return a, nil
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
	envSecret     = "KVBRIDGE_SECRET"      // the shared secret itself
	envSecretFile = "KVBRIDGE_SECRET_FILE" // a file holding it (trailing newline ignored)
	envInsecure   = "KVBRIDGE_INSECURE"    // "1": run without authentication (logged as a warning)
)

// ErrNoSecret: neither a secret nor an explicit insecure mode is configured.
var ErrNoSecret = errors.New("no shared secret: set " + envSecret + " or " + envSecretFile +
	" (the same on every rank and the bootstrap server), or " + envInsecure + "=1 to run without authentication")

// AuthFromEnv reads KVBRIDGE_SECRET or KVBRIDGE_SECRET_FILE, and
// KVBRIDGE_INSECURE. It returns (nil, true, nil) for an explicit insecure
// mode, (nil, false, nil) when nothing is set.
func AuthFromEnv() (auth *Auth, insecure bool, err error) {
	secret := os.Getenv(envSecret)
	if path := os.Getenv(envSecretFile); secret == "" && path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, false, fmt.Errorf("bootstrap: %s: %w", envSecretFile, err)
		}
		secret = strings.TrimRight(string(b), "\r\n")
	}
	insecure = os.Getenv(envInsecure) == "1" || strings.EqualFold(os.Getenv(envInsecure), "true")
	if secret == "" {
		return nil, insecure, nil
	}
	if insecure {
		return nil, false, fmt.Errorf("bootstrap: both a shared secret and %s are set; choose one", envInsecure)
	}
	a, err := NewAuth([]byte(secret))
	if err != nil {
		return nil, false, err
	}
	return a, false, nil
}
