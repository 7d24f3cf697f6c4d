package ident

import (
	"bytes"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/wire"
)

// identities issues certificates for a decode and a prefill rank.
func identities(t *testing.T) (ca *CA, decode, prefill *RankIdentity) {
	t.Helper()
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	year := time.Now().Add(365 * 24 * time.Hour)
	if decode, err = ca.Issue(wire.RoleDecode, "d", 0, year); err != nil {
		t.Fatal(err)
	}
	if prefill, err = ca.Issue(wire.RolePrefill, "p", 0, year); err != nil {
		t.Fatal(err)
	}
	return ca, decode, prefill
}

// TestCertificates: encoding, the CA's signature, expiry, tampering,
// files.
func TestCertificates(t *testing.T) {
	ca, did, _ := identities(t)
	now := time.Now()
	c, err := ParseCert(did.Cert.Raw(), ca.Public, now)
	if err != nil || c.String() != "decode/d/0" || !bytes.Equal(c.Key, did.Cert.Key) {
		t.Fatalf("round trip: %v %+v", err, c)
	}
	if _, err := ParseCert(did.Cert.Raw(), ca.Public, now.Add(366*24*time.Hour)); !errors.Is(err, ErrBadCert) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired: %v", err)
	}
	for i := range did.Cert.Raw() {
		b := bytes.Clone(did.Cert.Raw())
		b[i] ^= 0x40
		if _, err := ParseCert(b, ca.Public, now); err == nil {
			t.Fatalf("byte %d altered and still accepted", i)
		}
	}
	wrong := make([]byte, ed25519.PublicKeySize)
	rand.Read(wrong)
	if _, err := ParseCert(did.Cert.Raw(), wrong, now); !errors.Is(err, ErrBadCert) {
		t.Fatalf("another CA's key: %v", err)
	}
	back, err := parseCA(ca.Marshal(true))
	if err != nil || !reflect.DeepEqual(back, ca) {
		t.Fatalf("CA file round trip: %v", err)
	}
	pubOnly, err := parseCA(ca.Marshal(false))
	if err != nil || pubOnly.Private != nil {
		t.Fatalf("public CA file: %v", err)
	}
	if _, err := pubOnly.Issue(wire.RoleDecode, "d", 0, now.Add(time.Hour)); err == nil {
		t.Fatal("a public-only CA issued a certificate")
	}
	id, err := parseIdentity(did.Marshal(), ca.Public, now)
	if err != nil || !bytes.Equal(id.Cert.Raw(), did.Cert.Raw()) {
		t.Fatalf("identity file round trip: %v", err)
	}
	_, _, pid := identities(t)
	mixed := strings.Fields(string(did.Marshal()))
	mixed[3] = strings.Fields(string(pid.Marshal()))[3]
	if _, err := parseIdentity([]byte(strings.Join(mixed, " ")), ca.Public, now); err == nil {
		t.Fatal("an identity file whose key is another rank's was accepted")
	}
}

// goldenIdentity is a fixed CA and rank identity (Ed25519 signatures are
// deterministic), for the golden files.
func goldenIdentity(t *testing.T, role, instance string, rank int, keyByte byte) (*CA, *RankIdentity) {
	t.Helper()
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{0x42}, ed25519.SeedSize))
	ca := &CA{Public: priv.Public().(ed25519.PublicKey), Private: priv}
	key, err := ecdh.X25519().NewPrivateKey(bytes.Repeat([]byte{keyByte}, 32))
	if err != nil {
		t.Fatal(err)
	}
	c := &Cert{Role: role, Instance: instance, Rank: rank, NotAfter: time.Unix(2000000000, 0), Key: key.PublicKey().Bytes()}
	body, err := c.signedPart()
	if err != nil {
		t.Fatal(err)
	}
	c.raw = append(body, ed25519.Sign(priv, body)...)
	return ca, &RankIdentity{CA: ca.Public, Cert: c, key: key}
}

// TestGoldenCertificate: a certificate byte for byte (PROTOCOL.md
// "Per-rank identity"), so any implementation can check its own against
// it, and the CA and identity files of two fixed ranks, which
// internal/control's TestGoldenEnvelope seals its golden envelopes with.
func TestGoldenCertificate(t *testing.T) {
	ca, dec := goldenIdentity(t, wire.RoleDecode, "decode-a", 3, 0x11)
	_, pre := goldenIdentity(t, wire.RolePrefill, "prefill-a", 1, 0x22)
	for name, got := range map[string][]byte{"CERT_decode.bin": dec.Cert.Raw(), "CA.txt": ca.Marshal(false),
		"IDENTITY_decode.txt": dec.Marshal(), "IDENTITY_prefill.txt": pre.Marshal()} {
		path := filepath.Join("testdata", "golden", name)
		if *update {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test ./internal/ident -run TestGolden -update once)", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s drifted:\n got %x\nwant %x", name, got, want)
		}
	}
	dir := filepath.Join("testdata", "golden")
	for _, id := range []*RankIdentity{dec, pre} {
		back, err := LoadIdentity(filepath.Join(dir, "CA.txt"), filepath.Join(dir, "IDENTITY_"+id.Cert.Role+".txt"))
		if err != nil || !bytes.Equal(back.Cert.Raw(), id.Cert.Raw()) || !back.key.Equal(id.key) {
			t.Fatalf("%s: the identity file does not load back: %v", id.Cert, err)
		}
	}
}
