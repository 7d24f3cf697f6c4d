// Package ident is per-rank identity's machinery: the deployment's
// certificate authority, a rank's certificate and X25519 key, the files
// they are kept in, and the key agreement the control plane derives pair
// keys from (docs/PROTOCOL.md "Per-rank identity"). bootstrap's CA,
// RankIdentity, LoadIdentity and IdentityFromEnv are its public face; the
// control loop (internal/control) and the decode shell use it directly.
package ident

import (
	"bytes"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kvbridge/kvbridge/internal/wire"
)

// Per-rank identity (PROTOCOL.md "Per-rank identity"). The deployment's
// operator holds a certificate authority: an Ed25519 key pair whose
// private half never reaches a rank. Each rank holds its own X25519 key
// pair and a certificate, signed by the CA, binding the public half to the
// rank's role, instance and rank. Every control message is authenticated
// with a key only its sender and its receiver can compute: HMAC-SHA256
// keyed by a pair key derived from the deployment secret and the X25519
// agreement of the two ranks' keys (static-static, as Noise's KK pattern).
// A holder of the deployment secret alone therefore cannot speak as any
// rank; a holder of one rank's key speaks only as that rank (to anyone but
// that rank itself: see docs/SECURITY.md).

// certMagic opens every certificate.
const certMagic = "KVC1"

// Cert is a rank's certificate: who it is and its X25519 public key,
// signed by the deployment's CA.
type Cert struct {
	Role     string
	Instance string
	Rank     int
	NotAfter time.Time // the certificate is refused after this
	Key      []byte    // X25519 public key, 32 bytes

	raw []byte // the encoding the signature covers, then the signature
}

// Raw returns the certificate as sent on the wire and published in
// bootstrap records.
func (c *Cert) Raw() []byte { return c.raw }

// String names the certificate's identity (role/instance/rank).
func (c *Cert) String() string {
	return wire.From{Role: c.Role, Instance: c.Instance, Rank: c.Rank}.Peer()
}

// signedPart is the certificate without its signature.
func (c *Cert) signedPart() ([]byte, error) {
	r := wire.RoleByte(c.Role)
	switch {
	case r == 0:
		return nil, fmt.Errorf("identity: certificate role %q: want %q or %q", c.Role, wire.RolePrefill, wire.RoleDecode)
	case c.Instance == "" || len(c.Instance) > wire.MaxNameBytes:
		return nil, fmt.Errorf("identity: certificate instance of %d bytes: want 1 to %d", len(c.Instance), wire.MaxNameBytes)
	case c.Rank < 0 || c.Rank > 1<<31-1:
		return nil, fmt.Errorf("identity: certificate rank %d out of range", c.Rank)
	case len(c.Key) != 32:
		return nil, fmt.Errorf("identity: certificate key of %d bytes, want 32 (X25519)", len(c.Key))
	}
	b := append([]byte(certMagic), r)
	b = binary.LittleEndian.AppendUint32(b, uint32(c.Rank))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(c.Instance)))
	b = append(b, c.Instance...)
	b = binary.LittleEndian.AppendUint64(b, uint64(c.NotAfter.Unix()))
	return append(b, c.Key...), nil
}

// ParseCert decodes a certificate and checks its CA signature and expiry
// at now. Every failure wraps ErrBadCert.
func ParseCert(raw []byte, ca ed25519.PublicKey, now time.Time) (*Cert, error) {
	bad := func(why string) (*Cert, error) { return nil, fmt.Errorf("%w: %s", ErrBadCert, why) }
	if len(raw) > wire.MaxCertBytes {
		return bad(fmt.Sprintf("%d bytes, at most %d", len(raw), wire.MaxCertBytes))
	}
	if len(raw) < 4+1+4+2+8+32+ed25519.SignatureSize || string(raw[:4]) != certMagic {
		return bad("not a kvbridge certificate")
	}
	n := int(binary.LittleEndian.Uint16(raw[9:]))
	if len(raw) != 11+n+8+32+ed25519.SignatureSize {
		return bad("length does not match its instance name")
	}
	body := raw[:len(raw)-ed25519.SignatureSize]
	if len(ca) != ed25519.PublicKeySize || !ed25519.Verify(ca, body, raw[len(body):]) {
		return bad("not signed by this deployment's certificate authority")
	}
	c := &Cert{Role: wire.ByteRole(raw[4]), Rank: int(binary.LittleEndian.Uint32(raw[5:])), Instance: string(raw[11 : 11+n]),
		NotAfter: time.Unix(int64(binary.LittleEndian.Uint64(raw[11+n:])), 0),
		Key:      bytes.Clone(raw[19+n : 51+n]), raw: bytes.Clone(raw)}
	if c.Role == "" || c.Rank > 1<<31-1 {
		return bad("unknown role or rank out of range")
	}
	if now.After(c.NotAfter) {
		return bad(fmt.Sprintf("%s expired at %s", c, c.NotAfter.UTC().Format(time.RFC3339)))
	}
	return c, nil
}

// ErrBadCert: a certificate that does not parse, is not the CA's, or has
// expired.
var ErrBadCert = errors.New("identity: bad identity certificate")

// CA is a deployment's certificate authority. Keep Private with the
// operator (a CI secret, a vault): a rank needs only Public.
type CA struct {
	Public  ed25519.PublicKey
	Private ed25519.PrivateKey // nil on ranks
}

// NewCA generates a certificate authority.
func NewCA() (*CA, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	return &CA{Public: pub, Private: priv}, nil
}

// Issue generates a key pair for the rank and returns its identity: the
// certificate, signed, and the private key.
func (ca *CA) Issue(role, instance string, rank int, notAfter time.Time) (*RankIdentity, error) {
	if len(ca.Private) != ed25519.PrivateKeySize {
		return nil, errors.New("identity: this CA has no private key (ranks hold only its public key)")
	}
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	c := &Cert{Role: role, Instance: instance, Rank: rank, NotAfter: notAfter.Truncate(time.Second), Key: key.PublicKey().Bytes()}
	body, err := c.signedPart()
	if err != nil {
		return nil, err
	}
	c.raw = append(body, ed25519.Sign(ca.Private, body)...)
	return &RankIdentity{CA: ca.Public, Cert: c, key: key}, nil
}

// RankIdentity is what one rank holds: the CA's public key, its own
// certificate and its private key.
type RankIdentity struct {
	CA   ed25519.PublicKey
	Cert *Cert
	key  *ecdh.PrivateKey
}

// Agree returns the X25519 agreement of the rank's private key with the
// key of a peer's certificate (verified by the caller): what the control
// plane derives the pair's message keys from, with the deployment secret.
// The private key itself never leaves the RankIdentity.
func (id *RankIdentity) Agree(peer *Cert) ([]byte, error) {
	pub, err := ecdh.X25519().NewPublicKey(peer.Key)
	if err != nil {
		return nil, fmt.Errorf("%w: key agreement with %s: %v", ErrBadCert, peer, err)
	}
	return id.key.ECDH(pub)
}

// Identity files: one line each, "kvbridge-identity v1 <cert> <key>" and
// "kvbridge-ca v1 <public> [<private>]", base64 (standard, padded).
const (
	identityFileTag = "kvbridge-identity v1"
	caFileTag       = "kvbridge-ca v1"
)

var b64 = base64.StdEncoding

// Marshal encodes the identity for KVBRIDGE_IDENTITY_FILE (it holds the
// private key: mode 0600).
func (id *RankIdentity) Marshal() []byte {
	return []byte(fmt.Sprintf("%s %s %s\n", identityFileTag, b64.EncodeToString(id.Cert.raw), b64.EncodeToString(id.key.Bytes())))
}

// Marshal encodes the CA; with public only, what ranks get
// (KVBRIDGE_CA_FILE).
func (ca *CA) Marshal(withPrivate bool) []byte {
	s := caFileTag + " " + b64.EncodeToString(ca.Public)
	if withPrivate && ca.Private != nil {
		s += " " + b64.EncodeToString(ca.Private.Seed())
	}
	return []byte(s + "\n")
}

// parseCA decodes a CA file.
func parseCA(b []byte) (*CA, error) {
	f := strings.Fields(string(b))
	if len(f) < 3 || len(f) > 4 || f[0]+" "+f[1] != caFileTag {
		return nil, fmt.Errorf("identity: not a %q file", caFileTag)
	}
	pub, err := b64.DecodeString(f[2])
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return nil, errors.New("identity: CA file: bad public key")
	}
	ca := &CA{Public: pub}
	if len(f) == 4 {
		seed, err := b64.DecodeString(f[3])
		if err != nil || len(seed) != ed25519.SeedSize {
			return nil, errors.New("identity: CA file: bad private key")
		}
		ca.Private = ed25519.NewKeyFromSeed(seed)
		if !bytes.Equal(ca.Private.Public().(ed25519.PublicKey), pub) {
			return nil, errors.New("identity: CA file: the private key does not belong to the public key")
		}
	}
	return ca, nil
}

// parseIdentity decodes an identity file and checks its certificate
// against the CA at now and its private key against the certificate.
func parseIdentity(b []byte, ca ed25519.PublicKey, now time.Time) (*RankIdentity, error) {
	f := strings.Fields(string(b))
	if len(f) != 4 || f[0]+" "+f[1] != identityFileTag {
		return nil, fmt.Errorf("identity: not a %q file", identityFileTag)
	}
	raw, err1 := b64.DecodeString(f[2])
	kb, err2 := b64.DecodeString(f[3])
	if err1 != nil || err2 != nil {
		return nil, errors.New("identity: identity file: bad base64")
	}
	c, err := ParseCert(raw, ca, now)
	if err != nil {
		return nil, err
	}
	key, err := ecdh.X25519().NewPrivateKey(kb)
	if err != nil {
		return nil, fmt.Errorf("identity: identity file: %w", err)
	}
	if !bytes.Equal(key.PublicKey().Bytes(), c.Key) {
		return nil, fmt.Errorf("identity: identity file: the private key does not belong to %s's certificate", c)
	}
	return &RankIdentity{CA: ca, Cert: c, key: key}, nil
}

// LoadCA reads a CA file: the operator's (with the private key) or the
// public one ranks get.
func LoadCA(path string) (*CA, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	ca, err := parseCA(b)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	return ca, nil
}

// LoadIdentity reads a CA file and an identity file.
func LoadIdentity(caPath, idPath string) (*RankIdentity, error) {
	if caPath == "" || idPath == "" {
		return nil, fmt.Errorf("identity: per-rank identity needs both a CA file and an identity file (got %q and %q)", caPath, idPath)
	}
	ca, err := LoadCA(caPath)
	if err != nil {
		return nil, err
	}
	ib, err := os.ReadFile(idPath)
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	id, err := parseIdentity(ib, ca.Public, time.Now())
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, idPath)
	}
	return id, nil
}
