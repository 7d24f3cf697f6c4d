package bootstrap

import (
	"os"
	"testing"

	"github.com/kvbridge/kvbridge/internal/curve"
	"github.com/stretchr/testify/require"
)

func TestSecurityFromEnv(t *testing.T) {
	pub, sec, err := GenerateKeyPair()
	if err != nil {
		t.Skip(err)
	}
	peerPub, _, _ := GenerateKeyPair()
	t.Setenv(envCurveSecretKey, "")
	s, err := SecurityFromEnv()
	require.NoError(t, err, "off by default: %v", s)
	require.Nil(t, s, "off by default")
	dir := t.TempDir()
	keyFile := dir + "/secret"
	os.WriteFile(keyFile, []byte("# rank key\n"+sec+"\n"), 0o600)
	allowFile := dir + "/allow"
	os.WriteFile(allowFile, []byte(peerPub+"\n"), 0o600)
	t.Setenv(envCurveSecretKeyFile, keyFile)
	t.Setenv(envCurveAllowFile, allowFile)
	s, err = SecurityFromEnv()
	require.NoError(t, err, "%+v", s)
	derived, err := curve.Check(s.SecretKey, "", s.AllowedKeys)
	require.NoError(t, err)
	require.Equal(t, pub, derived, "the secret key read is the one generated with pub: %+v", s)
	require.Equal(t, []string{peerPub}, s.AllowedKeys, "%+v", s)
	t.Setenv(envCurveAllow, "not-a-key")
	_, err = SecurityFromEnv()
	require.Error(t, err, "a bad allowed key must be refused")
}
