// Package curve checks the Z85 keys of the control plane's optional CURVE
// encryption: for package bootstrap, which reads them (bootstrap.Security,
// SecurityFromEnv, a rank record's curve_public_key), and for
// internal/control, whose sockets use them.
package curve

import (
	"errors"
	"fmt"

	zmq "github.com/pebbe/zmq4"
)

// ValidKey says whether k is a Z85-encoded 32-byte key (40 characters).
func ValidKey(k string) bool { return len(k) == 40 && len(zmq.Z85decode(k)) == 32 }

// Check checks a rank's keypair and allow-list and returns its public key,
// derived from secret (public, when not empty, must be that key).
func Check(secret, public string, allowed []string) (string, error) {
	if !zmq.HasCurve() {
		return "", errors.New("bootstrap: security requested but libzmq was built without CURVE")
	}
	if !ValidKey(secret) {
		return "", errors.New("bootstrap: security: SecretKey is not a 40-character Z85 key")
	}
	pub, err := zmq.AuthCurvePublic(secret)
	if err != nil {
		return "", fmt.Errorf("bootstrap: security: deriving the public key: %w", err)
	}
	if public != "" && public != pub {
		return "", errors.New("bootstrap: security: PublicKey does not belong to SecretKey")
	}
	for i, k := range allowed {
		if !ValidKey(k) {
			return "", fmt.Errorf("bootstrap: security: allowed key %d (%q) is not a 40-character Z85 key", i, k)
		}
	}
	return pub, nil
}
