package testnet

import (
	"net"
	"os"
	"strconv"
	"testing"

	"github.com/kvbridge/kvbridge/internal/leakcheck"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }

// TestPortOutsideEphemeralRange: the ports handed out lie below the
// kernel's ephemeral range (so no socket gets one as its ephemeral port
// while a test's server is stopped) and are free.
func TestPortOutsideEphemeralRange(t *testing.T) {
	lo := ephemeralLow()
	if lo-portFloor < 1000 {
		t.Skipf("the ephemeral range starts at %d: no room below it", lo)
	}
	for range 20 {
		p, err := Port()
		require.NoError(t, err)
		require.GreaterOrEqual(t, p, portFloor)
		require.Less(t, p, lo, "port %d is in the ephemeral range (from %d)", p, lo)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		require.NoError(t, err, "port %d handed out but not free", p)
		require.NoError(t, ln.Close())
	}
}
