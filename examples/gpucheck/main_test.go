package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvbridge/kvbridge/internal/cudadouble"
	"go.uber.org/goleak"
)

// TestGPUCheckOnCUDADouble builds the gpucheck binary and runs it end to end
// (a real peer process, CUDA IPC, verification, JSON) against the CUDA
// driver test double with small sizes. On a GPU node run
// scripts/gpu-check.sh instead.
func TestGPUCheckOnCUDADouble(t *testing.T) {
	dir := t.TempDir()
	lib, err := cudadouble.Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "gpucheck")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v %s", err, out)
	}
	js := filepath.Join(dir, "out.json")
	cmd := exec.Command(bin, "-size", "8388608", "-pages", "256", "-iters", "2", "-allow-no-nvml", "-json", js)
	cmd.Env = append(os.Environ(), "KVBRIDGE_CUDA_LIB="+lib)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "gpucheck: OK") {
		t.Fatalf("gpucheck: %v\n%s", err, out)
	}
	var r result
	b, _ := os.ReadFile(js)
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.BytesVerified != 8<<20+256*32<<10 || r.BulkGBps <= 0 || r.DtoDGBps <= 0 || r.Ratio <= 0 {
		t.Fatalf("result %+v", r)
	}
	// A corrupted peer must be caught: make every copy fail in the writer.
	cmd = exec.Command(bin, "-size", "1048576", "-pages", "16", "-iters", "1", "-allow-no-nvml")
	cmd.Env = append(os.Environ(), "KVBRIDGE_CUDA_LIB="+lib, "KVB_CUDA_DOUBLE_FAIL=cuMemcpyAsync")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "FAIL") {
		t.Fatalf("a failing copy passed: %s", out)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
