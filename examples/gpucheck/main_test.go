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

	// -layerwise: every layer's event answers "not ready" to its first
	// three queries; both ways land byte-exact (the run verifies them) and
	// report their figures.
	lw := func(env ...string) (string, error) {
		cmd := exec.Command(bin, "-layerwise", "-lw-layers", "4", "-lw-tokens", "256,512", "-lw-rooms", "2", "-json", js)
		cmd.Env = append(append(os.Environ(), "KVBRIDGE_CUDA_LIB="+lib), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := lw("KVB_FAKE_EVENT_POLLS=3"); err != nil || !strings.Contains(out, "gpucheck: layerwise OK") {
		t.Fatalf("gpucheck -layerwise: %v\n%s", err, out)
	}
	var cases []lwCase
	b, _ = os.ReadFile(js)
	if err := json.Unmarshal(b, &cases); err != nil || len(cases) != 2 {
		t.Fatalf("layerwise JSON: %v %s", err, b)
	}
	for _, c := range cases {
		if c.Layers != 4 || c.LayerTransferMS <= 0 || c.LayerTTFTMS <= 0 || c.WholeTTFTMS <= 0 || c.TTFTRatio <= 0 || c.CopiesPerLayer < 1 {
			t.Fatalf("layerwise case %+v", c)
		}
	}
	// The layers' posts wait on their events: a failing cuEventQuery
	// fails the layer-wise room (and the run).
	if out, err := lw("KVB_CUDA_DOUBLE_FAIL=cuEventQuery"); err == nil || !strings.Contains(out, "layerwise: FAIL") || !strings.Contains(out, "cuEventQuery") {
		t.Fatalf("a failing event query passed: %v\n%s", err, out)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
