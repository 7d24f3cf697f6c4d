package bootstrap

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/kvbridge/kvbridge/internal/ident"
)

// Per-rank identity (docs/PROTOCOL.md "Per-rank identity"). The
// deployment's operator holds a certificate authority, an Ed25519 key pair
// whose private half never reaches a rank, and issues each rank a
// certificate binding its own X25519 key to its role, instance and rank.
// Every control message is then authenticated with a key only its sender
// and its receiver can compute (the deployment secret and the X25519
// agreement of the two ranks' keys), so a holder of the secret alone
// cannot speak as any rank (docs/SECURITY.md).

// RankIdentity is what one rank holds: the CA's public key, its
// certificate and its private key. Set it as kvmanager.Config.RankIdentity.
// Only LoadIdentity, IdentityFromEnv and CA.Issue make one; a Manager
// refuses any other value.
type RankIdentity interface {
	// Marshal encodes the identity for KVBRIDGE_IDENTITY_FILE (it holds
	// the private key: write it with mode 0600).
	Marshal() []byte
}

// CA is a deployment's certificate authority. Keep its private key with
// the operator (a CI secret, a vault): a rank needs only the public file,
// Marshal(false).
type CA struct{ ca *ident.CA }

// NewCA generates a certificate authority.
func NewCA() (*CA, error) {
	ca, err := ident.NewCA()
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	return &CA{ca: ca}, nil
}

// Issue generates a key pair for the rank (role "prefill" or "decode",
// its instance and its rank's index there) and returns its identity: the
// certificate, signed, valid until notAfter, and the private key.
func (ca *CA) Issue(role, instance string, rank int, notAfter time.Time) (RankIdentity, error) {
	if ca == nil || ca.ca == nil {
		return nil, errNoCA
	}
	id, err := ca.ca.Issue(role, instance, rank, notAfter)
	if err != nil {
		return nil, err
	}
	return id, nil
}

// Marshal encodes the CA: with its private key, the operator's file; with
// the public key only, what ranks get (KVBRIDGE_CA_FILE).
// A CA that NewCA or LoadCA did not make encodes as nothing.
func (ca *CA) Marshal(withPrivate bool) []byte {
	if ca == nil || ca.ca == nil {
		return nil
	}
	return ca.ca.Marshal(withPrivate)
}

var errNoCA = errors.New("bootstrap: a CA that NewCA or LoadCA did not make")

// LoadCA reads the operator's CA file (Marshal(true)), to issue more
// ranks' identities later; a rank's public CA file loads too but cannot
// issue.
func LoadCA(path string) (*CA, error) {
	ca, err := ident.LoadCA(path)
	if err != nil {
		return nil, err
	}
	return &CA{ca: ca}, nil
}

// Environment variables read by IdentityFromEnv.
const (
	envCAFile       = "KVBRIDGE_CA_FILE"       // the CA's public key (a kvbridge-ca file)
	envIdentityFile = "KVBRIDGE_IDENTITY_FILE" // this rank's certificate and key
)

// IdentityFromEnv reads KVBRIDGE_CA_FILE and KVBRIDGE_IDENTITY_FILE: both
// or neither (nil, nil).
func IdentityFromEnv() (RankIdentity, error) {
	caPath, idPath := os.Getenv(envCAFile), os.Getenv(envIdentityFile)
	if caPath == "" && idPath == "" {
		return nil, nil
	}
	if caPath == "" || idPath == "" {
		return nil, fmt.Errorf("bootstrap: per-rank identity needs both %s and %s (got %q and %q)", envCAFile, envIdentityFile, caPath, idPath)
	}
	return LoadIdentity(caPath, idPath)
}

// LoadIdentity reads a CA file (its public key is enough) and a rank's
// identity file, and checks the certificate against the CA now.
func LoadIdentity(caPath, idPath string) (RankIdentity, error) {
	id, err := ident.LoadIdentity(caPath, idPath)
	if err != nil {
		return nil, err
	}
	return id, nil
}
