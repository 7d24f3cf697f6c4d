package bootstrap

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestIdentityFiles: what an operator does with the public API — a CA,
// an identity issued and written, the rank's files loaded back (directly
// and from the environment) to the same identity; one file without the
// other is an error naming both variables, neither is no identity.
func TestIdentityFiles(t *testing.T) {
	ca, err := NewCA()
	require.NoError(t, err)
	id, err := ca.Issue("decode", "d", 2, time.Now().Add(time.Hour))
	require.NoError(t, err)
	dir := t.TempDir()
	caFile, idFile := filepath.Join(dir, "ca"), filepath.Join(dir, "id")
	require.NoError(t, os.WriteFile(caFile, ca.Marshal(false), 0o644))
	require.NoError(t, os.WriteFile(idFile, id.Marshal(), 0o600))
	back, err := LoadIdentity(caFile, idFile)
	require.NoError(t, err)
	require.Equal(t, id.Marshal(), back.Marshal())

	t.Setenv(envCAFile, caFile)
	t.Setenv(envIdentityFile, idFile)
	fromEnv, err := IdentityFromEnv()
	require.NoError(t, err)
	require.Equal(t, id.Marshal(), fromEnv.Marshal())

	t.Setenv(envIdentityFile, "")
	_, err = IdentityFromEnv()
	require.ErrorContains(t, err, "KVBRIDGE_CA_FILE and KVBRIDGE_IDENTITY_FILE")
	t.Setenv(envCAFile, "")
	none, err := IdentityFromEnv()
	require.NoError(t, err)
	require.True(t, none == nil, "neither variable: no identity, and an untyped nil (a Config's RankIdentity != nil test), got %#v", none)

	_, err = LoadIdentity(filepath.Join(dir, "missing"), idFile)
	require.Error(t, err)

	// The operator's file loads back and issues; a rank's public one
	// loads and cannot; a CA nothing made issues nothing (no panic).
	opFile := filepath.Join(dir, "ca-operator")
	require.NoError(t, os.WriteFile(opFile, ca.Marshal(true), 0o600))
	again, err := LoadCA(opFile)
	require.NoError(t, err)
	require.Equal(t, ca.Marshal(false), again.Marshal(false), "the same CA")
	later, err := again.Issue("prefill", "p", 0, time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(idFile, later.Marshal(), 0o600))
	_, err = LoadIdentity(caFile, idFile)
	require.NoError(t, err, "an identity issued by the reloaded CA checks against the rank's CA file")
	public, err := LoadCA(caFile)
	require.NoError(t, err)
	_, err = public.Issue("prefill", "p", 1, time.Now().Add(time.Hour))
	require.ErrorContains(t, err, "no private key")
	_, err = (&CA{}).Issue("prefill", "p", 1, time.Now().Add(time.Hour))
	require.ErrorIs(t, err, errNoCA)
	require.Nil(t, (&CA{}).Marshal(true))
}
