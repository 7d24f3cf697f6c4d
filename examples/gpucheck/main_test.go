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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	require.NoError(t, err)
	bundle := filepath.Join(dir, "bundle")
	build := exec.Command("scripts/gpu-check.sh", "build", bundle)
	build.Dir = "../.."
	out, err := build.CombinedOutput()
	require.NoError(t, err, "scripts/gpu-check.sh build: %s", out)
	bin := filepath.Join(bundle, "gpucheck")
	js := filepath.Join(dir, "out.json")
	cmd := exec.Command(bin, "-size", "8388608", "-pages", "256", "-iters", "2", "-allow-no-nvml", "-json", js)
	cmd.Env = append(os.Environ(), "KVBRIDGE_CUDA_LIB="+lib)
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "gpucheck:\n%s", out)
	require.Contains(t, string(out), "gpucheck: OK", "gpucheck")
	var r result
	b, _ := os.ReadFile(js)
	require.NoError(t, json.Unmarshal(b, &r))
	require.EqualValues(t, 8<<20+256*32<<10, r.BytesVerified, "result %+v", r)
	require.Positive(t, r.BulkGBps, "result %+v", r)
	require.Positive(t, r.DtoDGBps, "result %+v", r)
	require.Positive(t, r.Ratio, "result %+v", r)
	// A corrupted peer must be caught: make every copy fail in the writer.
	cmd = exec.Command(bin, "-size", "1048576", "-pages", "16", "-iters", "1", "-allow-no-nvml")
	cmd.Env = append(os.Environ(), "KVBRIDGE_CUDA_LIB="+lib, "KVB_CUDA_DOUBLE_FAIL=cuMemcpyAsync")
	out, err = cmd.CombinedOutput()
	require.Error(t, err, "a failing copy passed: %s", out)
	require.Contains(t, string(out), "FAIL", "a failing copy passed")

	// -layerwise: every layer's event answers "not ready" to its first
	// three queries; both ways land byte-exact (the run verifies them) and
	// report their figures.
	lw := func(env ...string) (string, error) {
		cmd := exec.Command(bin, "-layerwise", "-lw-layers", "4", "-lw-tokens", "256,512", "-lw-rooms", "2", "-json", js)
		cmd.Env = append(append(os.Environ(), "KVBRIDGE_CUDA_LIB="+lib), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	lwOut, err := lw("KVB_FAKE_EVENT_POLLS=3")
	require.NoError(t, err, "gpucheck -layerwise:\n%s", lwOut)
	require.Contains(t, lwOut, "gpucheck: layerwise OK", "gpucheck -layerwise")
	var cases []lwCase
	b, _ = os.ReadFile(js)
	require.NoError(t, json.Unmarshal(b, &cases), "layerwise JSON: %s", b)
	require.Len(t, cases, 2, "layerwise JSON: %s", b)
	for _, c := range cases {
		require.EqualValues(t, 4, c.Layers, "layerwise case %+v", c)
		require.Positive(t, c.LayerTransferMS, "layerwise case %+v", c)
		require.Positive(t, c.LayerTTFTMS, "layerwise case %+v", c)
		require.Positive(t, c.WholeTTFTMS, "layerwise case %+v", c)
		require.Positive(t, c.TTFTRatio, "layerwise case %+v", c)
		require.GreaterOrEqual(t, c.CopiesPerLayer, 1, "layerwise case %+v", c)
	}
	runSh(t, bundle, lib)
	// The layers' posts wait on their events: a failing cuEventQuery
	// fails the layer-wise room (and the run).
	lwOut, err = lw("KVB_CUDA_DOUBLE_FAIL=cuEventQuery")
	require.Error(t, err, "a failing event query passed:\n%s", lwOut)
	require.Contains(t, lwOut, "layerwise: FAIL", "a failing event query passed")
	require.Contains(t, lwOut, "cuEventQuery", "a failing event query passed")
}

// runSh runs the bundle's run.sh on the CUDA double: kvbench -mem VRAM on
// each engine, every row a VRAM row against cuMemcpyDtoD.
func runSh(t *testing.T, bundle, cudaLib string) {
	nixlLib, err := nixldouble.Build(t.TempDir())
	require.NoError(t, err)
	runSh := func(env ...string) (string, error) {
		cmd := exec.Command(filepath.Join(bundle, "run.sh"), "-size", "1048576", "-pages", "16", "-iters", "1", "-allow-no-nvml")
		cmd.Env = append(append(os.Environ(), "KVBRIDGE_CUDA_LIB="+cudaLib, "GPUCHECK_LAYERWISE=0"), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := runSh("GPUCHECK_KVBENCH=1", "KVBENCH_FLAGS=-quick -model tiny", "KVBRIDGE_NIXL_LIB="+nixlLib)
	require.NoError(t, err, "run.sh:\n%s", out)
	for _, engine := range []string{"ucx", "loopback", "libnixl"} {
		b, err := os.ReadFile(filepath.Join(bundle, "kvbench-vram-"+engine+".json"))
		require.NoError(t, err, "run.sh: no kvbench -mem VRAM -engine %s results:\n%s", engine, out)
		var rows []struct {
			Mode, Name string
			References map[string]float64
		}
		require.NoError(t, json.Unmarshal(b, &rows), "kvbench-vram-%s.json: %s", engine, b)
		require.NotEmpty(t, rows, "kvbench-vram-%s.json: %s", engine, b)
		modes := map[string]bool{}
		for _, r := range rows {
			modes[r.Mode] = true
			assert.True(t, strings.HasSuffix(r.Name, " VRAM"), "-engine %s: row %+v", engine, r)
			assert.Positive(t, r.References["cuMemcpyDtoD"], "-engine %s: row %+v", engine, r)
		}
		for _, mode := range []string{"engine", "paged", "rooms"} {
			assert.True(t, modes[mode], "-engine %s: modes %v, want engine, paged and rooms", engine, modes)
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
	assert.NoError(t, err, "run.sh without a device:\n%s", out)
	assert.Contains(t, out, "kvbench -mem VRAM skipped (no GPU device", "run.sh without a device")
	assert.NotContains(t, out, "kvbench -mem VRAM -engine", "run.sh without a device")
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
