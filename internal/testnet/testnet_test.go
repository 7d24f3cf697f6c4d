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
// while a test's server is stopped) and Kubernetes' NodePort range, are
// free, and none twice (3,000 draws from 20,000 ports would repeat one
// with near certainty).
func TestPortOutsideEphemeralRange(t *testing.T) {
	lo := ephemeralLow()
	if lo-portFloor < 1000 {
		t.Skipf("the ephemeral range starts at %d: no room below it", lo)
	}
	seen := map[int]bool{}
	for range 3000 {
		p, err := Port()
		require.NoError(t, err)
		require.GreaterOrEqual(t, p, portFloor)
		require.Less(t, p, lo, "port %d is in the ephemeral range (from %d)", p, lo)
		require.Less(t, p, 30000, "port %d is in Kubernetes' NodePort range (30000–32767)", p)
		require.False(t, seen[p], "port %d handed out twice", p)
		seen[p] = true
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		require.NoError(t, err, "port %d handed out but not free", p)
		require.NoError(t, ln.Close())
	}
}
