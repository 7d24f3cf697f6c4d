// Package capture holds test helpers that capture a process's output.
package capture

import (
	"os"
	"testing"
)

// Stderr runs f with os.Stderr sent to a file and returns what f wrote
// (for testing a command's Main: help texts and usage errors).
func Stderr(t testing.TB, f func()) string {
	t.Helper()
	tmp, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer tmp.Close()
	saved := os.Stderr
	os.Stderr = tmp
	defer func() { os.Stderr = saved }()
	f()
	b, err := os.ReadFile(tmp.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
