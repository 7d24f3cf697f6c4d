package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDemoShort builds the prefill, decode and demo binaries and runs the
// demo's short workload: separate processes, real transfers, aborts at
// random stages, a summary with zero pinned rooms.
func TestDemoShort(t *testing.T) {
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "../prefill", "../decode", ".")
	build.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	cmd := exec.Command(filepath.Join(dir, "demo"), "-short", "-abort-rate", "0.2", "-bin", dir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out)
	}
	s := string(out)
	for _, want := range []string{"rooms pinned               0", "(corrupt 0)", "OK: every request"} {
		if !strings.Contains(s, want) {
			t.Fatalf("summary lacks %q:\n%s", want, s)
		}
	}
	t.Logf("\n%s", s)
}
