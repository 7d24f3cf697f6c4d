package etcdtest

import (
	"errors"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestPortTakenIsAddrInUse: a server whose port another socket took fails
// with an error Start recognises (EADDRINUSE through etcd's wrapping), so
// it draws new ports rather than fail the test (seen in make test: a port
// free when drawn, taken before etcd bound it); and Start then serves.
func TestPortTakenIsAddrInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	free, err := freePort()
	require.NoError(t, err)
	dir := t.TempDir()
	s := &Server{dir: dir, clientURL: url.URL{Scheme: "http", Host: ln.Addr().String()}, peerURL: url.URL{Scheme: "http", Host: free}}
	err = s.Restart()
	require.Error(t, err)
	require.True(t, errors.Is(err, syscall.EADDRINUSE), "not recognised as a port taken: %v", err)

	// Start's first draw is the taken port: it draws again and serves.
	draws := 0
	drawPort = func() (string, error) {
		if draws++; draws == 1 {
			return ln.Addr().String(), nil
		}
		return freePort()
	}
	defer func() { drawPort = freePort }()
	srv, err := Start()
	require.NoError(t, err, "Start failed on a port taken after it was drawn")
	defer srv.Close()
	require.Greater(t, draws, 2, "Start did not draw again")
	require.NotEqual(t, ln.Addr().String(), srv.Endpoint)
	_, err = os.Stat(srv.dir)
	require.NoError(t, err)
}
