package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kvbridge/kvbridge/bootstrap"
)

// TestIdentitiesIssuedInParallel: the ranks of a TP group start at once,
// each with its own identity file; every file holds its own rank's
// certificate. The file counter was a plain int: two ranks got one file
// and a rank started with another's certificate ("rank
// prefill/prefill-0/3 holds the certificate of prefill/prefill-0/1", 1 run
// in ~10 of TP 4 to 2; the race detector flags the old counter here).
func TestIdentitiesIssuedInParallel(t *testing.T) {
	cleanup, err := makeCA()
	if err != nil {
		t.Fatal(err)
	}
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
		if errs[i] != nil {
			t.Fatalf("rank %d: %v", i, errs[i])
		}
		var path string
		for _, kv := range envs[i] {
			if v, ok := strings.CutPrefix(kv, bootstrap.EnvIdentityFile+"="); ok {
				path = v
			}
		}
		id, err := bootstrap.LoadIdentity(caFile, path)
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
		if got, want := id.Cert.String(), fmt.Sprintf("prefill/p/%d", i); got != want {
			t.Errorf("rank %d's identity file %s holds the certificate of %s", i, path, got)
		}
		os.Remove(path)
	}
}
