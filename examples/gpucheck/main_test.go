package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvbridge/kvbridge/internal/cudadouble"
	"github.com/kvbridge/kvbridge/internal/nixldouble"
	"go.uber.org/goleak"
)

// TestGPUCheckOnCUDADouble builds the GPU node's bundle with
// scripts/gpu-check.sh and runs its gpucheck end to end (a real peer
// process, CUDA IPC, verification, JSON) against the CUDA driver test
// double with small sizes, then the bundle's run.sh: kvbench -mem VRAM on
// the ucx, loopback and libnixl engines (the NIXL double standing in for
// KVBRIDGE_NIXL_LIB), forced here with GPUCHECK_KVBENCH=1, skipped without
// a device otherwise. On a GPU node run the bundle's run.sh instead.
func TestGPUCheckOnCUDADouble(t *testing.T) {
	dir := t.TempDir()
	lib, err := cudadouble.Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "bundle")
	build := exec.Command("scripts/gpu-check.sh", "build", bundle)
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("scripts/gpu-check.sh build: %v %s", err, out)
	}
	bin := filepath.Join(bundle, "gpucheck")
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
	runSh(t, bundle, lib)
	// The layers' posts wait on their events: a failing cuEventQuery
	// fails the layer-wise room (and the run).
	if out, err := lw("KVB_CUDA_DOUBLE_FAIL=cuEventQuery"); err == nil || !strings.Contains(out, "layerwise: FAIL") || !strings.Contains(out, "cuEventQuery") {
		t.Fatalf("a failing event query passed: %v\n%s", err, out)
	}
}

// runSh runs the bundle's run.sh on the CUDA double: kvbench -mem VRAM on
// each engine, every row a VRAM row against cuMemcpyDtoD.
func runSh(t *testing.T, bundle, cudaLib string) {
	nixlLib, err := nixldouble.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	runSh := func(env ...string) (string, error) {
		cmd := exec.Command(filepath.Join(bundle, "run.sh"), "-size", "1048576", "-pages", "16", "-iters", "1", "-allow-no-nvml")
		cmd.Env = append(append(os.Environ(), "KVBRIDGE_CUDA_LIB="+cudaLib, "GPUCHECK_LAYERWISE=0"), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := runSh("GPUCHECK_KVBENCH=1", "KVBENCH_FLAGS=-quick -model tiny", "KVBRIDGE_NIXL_LIB="+nixlLib)
	if err != nil {
		t.Fatalf("run.sh: %v\n%s", err, out)
	}
	for _, engine := range []string{"ucx", "loopback", "libnixl"} {
		b, err := os.ReadFile(filepath.Join(bundle, "kvbench-vram-"+engine+".json"))
		if err != nil {
			t.Fatalf("run.sh: no kvbench -mem VRAM -engine %s results: %v\n%s", engine, err, out)
		}
		var rows []struct {
			Mode, Name string
			References map[string]float64
		}
		if err := json.Unmarshal(b, &rows); err != nil || len(rows) == 0 {
			t.Fatalf("kvbench-vram-%s.json: %v %s", engine, err, b)
		}
		modes := map[string]bool{}
		for _, r := range rows {
			modes[r.Mode] = true
			if !strings.HasSuffix(r.Name, " VRAM") || r.References["cuMemcpyDtoD"] <= 0 {
				t.Errorf("-engine %s: row %+v", engine, r)
			}
		}
		if !modes["engine"] || !modes["paged"] || !modes["rooms"] {
			t.Errorf("-engine %s: modes %v, want engine, paged and rooms", engine, modes)
		}
	}
	// Without a device kvbench is not run (unless forced, as above).
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		return
	}
	if _, err := exec.LookPath("nvidia-smi"); err == nil {
		return
	}
	out, err = runSh()
	if err != nil || !strings.Contains(out, "kvbench -mem VRAM skipped (no GPU device") || strings.Contains(out, "kvbench -mem VRAM -engine") {
		t.Errorf("run.sh without a device: %v\n%s", err, out)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
