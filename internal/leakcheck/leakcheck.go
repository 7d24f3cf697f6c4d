// Package leakcheck runs a test binary's tests and then goleak, for a
// TestMain that has its own cleanup to do before exiting
// (goleak.VerifyTestMain exits the process itself, before deferred calls).
package leakcheck

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Run runs the tests and, when they pass, fails the run on leaked
// goroutines. It returns the exit code.
func Run(m *testing.M) int {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	return code
}
