package kvmanager

import (
	"os"
	"sync"
	"testing"

	"github.com/kvbridge/kvbridge/internal/nixldouble"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if doubleDir != "" {
			os.RemoveAll(doubleDir)
		}
		os.Exit(code)
	}))
}

// The libnixl double is built once per test process: a process loads one
// libnixl, so a second build (go test -count=2) would be refused.
var (
	doubleOnce sync.Once
	doubleDir  string
	doublePath string
	doubleErr  error
)

func libnixlDouble(t *testing.T) string {
	t.Helper()
	doubleOnce.Do(func() {
		if doubleDir, doubleErr = os.MkdirTemp("", "kvmanager-nixldouble-"); doubleErr == nil {
			doublePath, doubleErr = nixldouble.Build(doubleDir)
		}
	})
	require.NoError(t, doubleErr)
	return doublePath
}
