package control

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/ident"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tagFixture is an ABORT and an envelope addressed to a prefill rank,
// tagged by the sealers the tests make (PROTOCOL.md "Envelope").
func tagFixture(t *testing.T) ([][]byte, Envelope) {
	t.Helper()
	f, err := wire.Encode(&wire.Abort{From: wire.From{Role: wire.RoleDecode, Instance: "d", Rank: 0, Endpoint: "tcp://127.0.0.1:2", Epoch: 9},
		Room: 42, Reason: "tag test"})
	require.NoError(t, err)
	return f[:3:3], Envelope{Sent: time.Now(), Seq: 5, To: wire.From{Role: wire.RolePrefill, Instance: "p", Rank: 1, Epoch: 7}}
}

// TestTagKeyPerSenderProcess: a tagged envelope's key is its sending
// process's own (derived from the secret and the salt it carries), so two
// processes tagging the same message under the same number make two
// different tags, and the receiver opens both; a changed salt, message
// number or tag is refused (bad_tag).
func TestTagKeyPerSenderProcess(t *testing.T) {
	frames, env := tagFixture(t)
	recv := testSealer()
	now := time.Now()
	one, two := testSealer().seal(nil, frames, env), testSealer().seal(nil, frames, env)
	require.Len(t, one[3], envelopeFixed+len(env.To.Instance))
	at := len(one[3]) - tagSaltBytes - tagBytes
	assert.NotEqual(t, one[3][at:at+tagSaltBytes], two[3][at:at+tagSaltBytes], "two sealers drew the same salt")
	assert.NotEqual(t, one[3][at+tagSaltBytes:], two[3][at+tagSaltBytes:], "two processes' tags of one message and number are equal")
	for _, m := range [][][]byte{one, two} {
		_, e, why := recv.open(slices.Clone(m), now, nil)
		require.Empty(t, why)
		assert.EqualValues(t, 5, e.Seq)
	}

	// Another key: a sealer with another secret.
	otherAuth, err := bootstrap.NewAuth([]byte("another-deployment-secret-0123456"))
	require.NoError(t, err)
	other := mustSealer(otherAuth)
	_, _, why := recv.open(other.seal(nil, frames, env), now, nil)
	assert.Equal(t, AuthBadTag, why, "tagged under another secret")

	for name, at := range map[string]int{"salt": at, "message number": 12, "tag": len(one[3]) - 1, "body": -1} {
		bad := slices.Clone(one)
		if at < 0 {
			bad[2] = slices.Clone(bad[2])
			bad[2][len(bad[2])-1] ^= 1
		} else {
			bad[3] = slices.Clone(bad[3])
			bad[3][at] ^= 1
		}
		_, _, why := recv.open(bad, now, nil)
		assert.Equal(t, AuthBadTag, why, "%s changed", name)
	}
}

// TestTagOfEarlierRevisionRefused: the second revision's envelope (KVA2,
// the same fields tagged with HMAC-SHA256 under the secret) is refused as
// bad_tag, as is a KVA4 envelope carrying that HMAC where its salt and
// tag go, and the third revision's sealed envelope (KVA3).
func TestTagOfEarlierRevisionRefused(t *testing.T) {
	frames, env := tagFixture(t)
	a := testSealer()
	hmacTagged := func(magic string) []byte {
		f := appendEnvelope(nil, magic, env)
		m := hmac.New(sha256.New, a.Secret)
		for _, fr := range frames {
			m.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(fr))))
			m.Write(fr)
		}
		m.Write(f)
		return m.Sum(f)
	}
	for _, magic := range []string{"KVA2", EnvelopeMagic} {
		_, _, why := a.open(append(slices.Clone(frames), hmacTagged(magic)), time.Now(), nil)
		assert.Equal(t, AuthBadTag, why, "an HMAC-tagged %s envelope", magic)
	}

	// The third revision's sealed envelope (KVA3: XChaCha20-Poly1305, a
	// 24-byte nonce where KVA5 has its salt), from a certificate holder.
	_, did, pid := identities(t)
	key, err := tagKey(a.Secret, did, pid.Cert.Raw())
	require.NoError(t, err)
	penv := env
	penv.Cert = did.Cert.Raw()
	kva3 := append(appendEnvelope(nil, "KVA3", penv), make([]byte, 24)...)
	_, _, why := a.open(append(slices.Clone(frames), kva3), time.Now(), func([]byte) ([]byte, string) { return key, "" })
	assert.Equal(t, AuthBadTag, why, "a KVA3 envelope")
}

// TestTagKeysCachedOnlyWhenAuthentic: a receiver keeps a sender process's
// tag key once a message under it proved authentic, never for a forged
// salt (a stranger's random salts would evict the honest senders' keys),
// and keeps at most maxBookEntries.
func TestTagKeysCachedOnlyWhenAuthentic(t *testing.T) {
	frames, env := tagFixture(t)
	recv := testSealer()
	now := time.Now()
	cached := func() int {
		recv.pairMu.RLock()
		defer recv.pairMu.RUnlock()
		return len(recv.ciphers)
	}
	for i := range 50 {
		m := testSealer().seal(nil, frames, env)
		f := m[3]
		_, err := rand.Read(f[len(f)-tagSaltBytes-tagBytes:]) // a stranger's salt and tag
		require.NoError(t, err)
		_, _, why := recv.open(m, now, nil)
		require.Equal(t, AuthBadTag, why, "forgery %d", i)
	}
	assert.Zero(t, cached(), "forged salts' keys cached")

	sender := testSealer()
	for seq := range uint64(3) {
		env.Seq = seq + 1
		_, _, why := recv.open(sender.seal(nil, frames, env), now, nil)
		require.Empty(t, why)
	}
	assert.Equal(t, 1, cached(), "one sender process's key, cached once")

	// Sealed under a pair key: a forged salt's body key is not kept
	// either, the sender's is.
	_, did, pid := identities(t)
	key, err := tagKey(recv.Secret, did, pid.Cert.Raw())
	require.NoError(t, err)
	penv := env
	penv.Cert = did.Cert.Raw()
	keyFor := func([]byte) ([]byte, string) { return key, "" }
	for i := range 50 {
		m := testSealer().seal(key, frames, penv)
		_, err := rand.Read(m[3][len(m[3])-tagSaltBytes:]) // a stranger's salt
		require.NoError(t, err)
		_, _, why := recv.open(m, now, keyFor)
		require.Equal(t, AuthBadTag, why, "sealed forgery %d", i)
	}
	assert.Equal(t, 1, cached(), "forged salts' body keys cached")
	_, _, why := recv.open(sender.seal(key, frames, penv), now, keyFor)
	require.Empty(t, why)
	assert.Equal(t, 2, cached(), "the sender's body key for the pair, cached")

	for i := range maxBookEntries + 10 {
		_, _, why := recv.open(testSealer().seal(nil, frames, env), now, nil)
		require.Empty(t, why, "sender %d", i)
	}
	assert.LessOrEqual(t, cached(), maxBookEntries)
}

// TestLoopRefusesFIPSOnly (review of eead32e): where AES-GCM with the
// message number as nonce is not allowed (GODEBUG=fips140=only), NewLoop
// with a secret fails, naming the rank and why, instead of panicking. Run
// in a child process: the setting is read at start.
func TestLoopRefusesFIPSOnly(t *testing.T) {
	if os.Getenv("KVBRIDGE_TEST_FIPS_CHILD") == "1" {
		_, err := NewLoop(LoopConfig{Identity: wire.From{Role: wire.RoleDecode, Instance: "fips"}, Bind: "tcp://127.0.0.1:*",
			Auth: testAuth(), Handler: func(wire.Message) {}})
		require.Error(t, err)
		fmt.Println("NewLoop:", err)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestLoopRefusesFIPSOnly$")
	cmd.Env = append(os.Environ(), "KVBRIDGE_TEST_FIPS_CHILD=1", "GODEBUG=fips140=only")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "NewLoop: control: rank decode/fips/0: message tags need AES-256-GCM")
}

// TestCipherMemoTurnsAllocateNothing: senders that take turns find their
// cached ciphers with no allocation (the memo of the cipher used last
// holds the cache's own entry), and each finds its own.
func TestCipherMemoTurnsAllocateNothing(t *testing.T) {
	recv := testSealer()
	salts := [][]byte{testSealer().salt[:], testSealer().salt[:]}
	var want [2]cipherID
	for i, salt := range salts {
		c, id, cached := recv.cipherOf(tagLabel, nil, salt)
		require.False(t, cached)
		recv.remember(id, c)
		want[i] = id
	}
	allocs := testing.AllocsPerRun(200, func() {
		for i, salt := range salts {
			if _, id, cached := recv.cipherOf(tagLabel, nil, salt); !cached || id != want[i] {
				panic(fmt.Sprintf("sender %d: cached %v, its id %v", i, cached, id == want[i]))
			}
		}
	})
	require.Zero(t, allocs, "allocations of two senders' ciphers found in turn")
}

// TestEnvelopeToKnownPeerAllocatesNothing: under per-rank identity,
// addressing a message to a peer whose certificate is known finds it
// without copying the certificate (a message's envelope allocates
// nothing); an expired one is still refused.
func TestEnvelopeToKnownPeerAllocatesNothing(t *testing.T) {
	_, did, pid := identities(t)
	ad := newAddressing(testSealer(), did, wire.RoleDecode)
	to := wire.Peer{Endpoint: "tcp://127.0.0.1:1", Cert: string(pid.Cert.Raw()), Epoch: 7}
	now := time.Now()
	env, key, err := ad.envelopeAt(to, now)
	require.NoError(t, err)
	require.NotNil(t, key)
	require.Equal(t, uint64(7), env.To.Epoch)
	allocs := testing.AllocsPerRun(200, func() {
		if _, _, err := ad.envelopeAt(to, now); err != nil {
			panic(err)
		}
	})
	require.Zero(t, allocs, "allocations of an envelope to a known peer")
	_, _, err = ad.envelopeAt(to, pid.Cert.NotAfter.Add(time.Second))
	require.ErrorIs(t, err, ident.ErrBadCert, "a known certificate past its expiry")
}
