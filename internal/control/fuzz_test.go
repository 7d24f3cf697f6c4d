package control

import (
	"bytes"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/internal/wire/wiretest"

	"github.com/stretchr/testify/require"
)

// FuzzOpen: the authentication frame's check never panics on any four
// frames, and opens only the frames a holder of the secret sealed — the
// seeds, byte for byte (a mutation of any frame, the envelope or the tag
// is refused with a reason).
func FuzzOpen(f *testing.F) {
	// A fixed salt: the seeds must be the same bytes in the fuzzing
	// workers, which run this setup again (any salt opens under the secret).
	a := fixedSaltSealer(f, 0x20)
	now := time.Unix(1_800_000_000, 0)
	var sealed [][][]byte
	for i, m := range wiretest.SampleMessages() {
		frames, err := wire.Encode(m)
		require.NoError(f, err)
		s := a.seal(nil, frames, Envelope{Sent: now, Seq: uint64(i + 1), To: wire.From{Role: wire.RolePrefill, Instance: "p", Rank: i % 3, Epoch: 9}})
		sealed = append(sealed, s)
		f.Add(s[0], s[1], s[2], s[3])
	}
	f.Add([]byte(wire.Magic), []byte("PING"), []byte{0x80}, make([]byte, 8+32)) // the first revision's frame
	f.Add([]byte(wire.Magic), []byte("PING"), []byte{0x80}, []byte(EnvelopeMagic))
	f.Fuzz(func(t *testing.T, f0, f1, f2, f3 []byte) {
		frames := [][]byte{f0, f1, f2, f3}
		opened, env, why := a.open(frames, now, nil)
		if why != "" {
			require.Nil(t, opened, "refused (%s) but returned frames", why)
			return
		}
		for _, s := range sealed {
			if bytes.Equal(s[0], f0) && bytes.Equal(s[1], f1) && bytes.Equal(s[2], f2) && bytes.Equal(s[3], f3) {
				require.Len(t, opened, 3, "opened frames, sent %v", env.Sent)
				require.Equal(t, now.UnixNano(), env.Sent.UnixNano(), "opened %d frames, sent %v", len(opened), env.Sent)
				return
			}
		}
		require.Fail(t, "opened frames nobody sealed", "%q %q %x %x", f0, f1, f2, f3)
	})
}

// FuzzOpenMD: sealed agent metadata opens only as sealed, from and to the
// ranks it was sealed between; anything else is an error, never a panic.
// (Seeds are sealed under a random nonce in each process.)
func FuzzOpenMD(f *testing.F) {
	key, secret := bytes.Repeat([]byte{7}, 32), []byte("the deployment's shared secret")
	from := wire.From{Role: wire.RoleDecode, Instance: "d", Rank: 1, Epoch: 3}
	to := wire.From{Role: wire.RolePrefill, Instance: "p", Rank: 0, Epoch: 5}
	md := []byte("agent metadata")
	s, err := sealMD(key, secret, md, from, to)
	require.NoError(f, err)
	f.Add(s, uint64(3), uint64(5))
	f.Add(s[:len(s)-1], uint64(3), uint64(5))
	f.Add([]byte(sealMagic), uint64(0), uint64(0))
	f.Fuzz(func(t *testing.T, b []byte, fromEpoch, toEpoch uint64) {
		fr, tt := from, to
		fr.Epoch, tt.Epoch = fromEpoch, toEpoch
		got, err := openMD(key, secret, b, fr, tt)
		if err != nil {
			return
		}
		// Whatever opens is md sealed between these two processes, under
		// the nonce it carries (each fuzz worker seals its own seed).
		g, err := sealGCM(key, secret)
		require.NoError(t, err)
		head := b[:len(sealMagic)+g.NonceSize()]
		want := g.Seal(bytes.Clone(head), head[len(sealMagic):], md, sealAAD(from, to))
		require.Equal(t, want, b, "opened %q from %x (epochs %d → %d)", got, b, fromEpoch, toEpoch)
		require.EqualValues(t, 3, fromEpoch, "opened %q from %x (epochs %d → %d)", got, b, fromEpoch, toEpoch)
		require.EqualValues(t, 5, toEpoch, "opened %q from %x (epochs %d → %d)", got, b, fromEpoch, toEpoch)
		require.Equal(t, md, got, "opened %q from %x (epochs %d → %d)", got, b, fromEpoch, toEpoch)
	})
}
