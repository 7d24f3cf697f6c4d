package bootstrap

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/kvbridge/kvbridge/internal/curve"
	zmq "github.com/pebbe/zmq4"
)

// Security turns on CURVE for a rank: its PULL socket becomes a CURVE server
// that admits only AllowedKeys (checked by a ZAP handler the control loop
// owns), and every PUSH socket a CURVE client that authenticates with the
// same keypair.
// A nil *Security (the default) means no encryption and no authentication.
type Security struct {
	// SecretKey is this rank's Z85-encoded CURVE secret key (40
	// characters; its public key, which peers allow, is derived from it:
	// GenerateKeyPair returns both).
	SecretKey string
	// AllowedKeys are the Z85 public keys of the peers allowed to send to
	// this rank.
	AllowedKeys []string
}

// GenerateKeyPair returns a new Z85 CURVE keypair.
func GenerateKeyPair() (public, secret string, err error) {
	if !zmq.HasCurve() {
		return "", "", errors.New("bootstrap: libzmq was built without CURVE")
	}
	return zmq.NewCurveKeypair()
}

// Environment variables read by SecurityFromEnv.
const (
	envCurveSecretKey     = "KVBRIDGE_CURVE_SECRET_KEY"      // Z85 secret key
	envCurveSecretKeyFile = "KVBRIDGE_CURVE_SECRET_KEY_FILE" // file holding it
	envCurveAllow         = "KVBRIDGE_CURVE_ALLOW"           // comma- or space-separated Z85 public keys
	envCurveAllowFile     = "KVBRIDGE_CURVE_ALLOW_FILE"      // file with one key per line (# comments)
)

// SecurityFromEnv builds a Security from KVBRIDGE_CURVE_* variables. It
// returns nil, nil when no secret key is configured (security off).
func SecurityFromEnv() (*Security, error) {
	secret := strings.TrimSpace(os.Getenv(envCurveSecretKey))
	if path := os.Getenv(envCurveSecretKeyFile); secret == "" && path != "" {
		keys, err := readKeyFile(path)
		if err != nil {
			return nil, err
		}
		if len(keys) != 1 {
			return nil, fmt.Errorf("bootstrap: %s: want exactly one key, found %d", path, len(keys))
		}
		secret = keys[0]
	}
	if secret == "" {
		return nil, nil
	}
	s := &Security{SecretKey: secret, AllowedKeys: strings.FieldsFunc(os.Getenv(envCurveAllow),
		func(r rune) bool { return r == ',' || r == ' ' || r == '\n' })}
	if path := os.Getenv(envCurveAllowFile); path != "" {
		keys, err := readKeyFile(path)
		if err != nil {
			return nil, err
		}
		s.AllowedKeys = append(s.AllowedKeys, keys...)
	}
	if _, err := curve.Check(s.SecretKey, "", s.AllowedKeys); err != nil {
		return nil, err
	}
	return s, nil
}

// readKeyFile reads Z85 keys, one per line; blank lines and lines starting
// with # are skipped.
func readKeyFile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: key file: %w", err)
	}
	var keys []string
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !curve.ValidKey(line) {
			return nil, fmt.Errorf("bootstrap: %s:%d: not a 40-character Z85 key", path, i+1)
		}
		keys = append(keys, line)
	}
	return keys, nil
}
