package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kvbridge/kvbridge/internal/ident"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestIdentitiesIssuedInParallel: the ranks of a TP group start at once,
// each with its own identity file; every file holds its own rank's
// certificate. The file counter was a plain int: two ranks got one file
// and a rank started with another's certificate ("rank
// prefill/prefill-0/3 holds the certificate of prefill/prefill-0/1", 1 run
// in ~10 of TP 4 to 2; the race detector flags the old counter here).
func TestIdentitiesIssuedInParallel(t *testing.T) {
	cleanup, err := makeCA()
	require.NoError(t, err)
	defer cleanup()
	const n = 16
	envs := make([][]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			envs[i], errs[i] = identityEnv("prefill", []string{"-instance", "p", "-tp", strconv.Itoa(n), "-tp-rank", strconv.Itoa(i)})
		}(i)
	}
	wg.Wait()
	for i := 0; i < n; i++ {
		require.NoError(t, errs[i], "rank %d", i)
		var path string
		for _, kv := range envs[i] {
			if v, ok := strings.CutPrefix(kv, "KVBRIDGE_IDENTITY_FILE"+"="); ok {
				path = v
			}
		}
		id, err := ident.LoadIdentity(caFile, path)
		require.NoError(t, err, "rank %d", i)
		assert.Equal(t, fmt.Sprintf("prefill/p/%d", i), id.Cert.String(), "rank %d's identity file %s holds the certificate of another rank", i, path)
		os.Remove(path)
	}
}
