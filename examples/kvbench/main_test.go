package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvbridge/kvbridge/internal/capture"
	"github.com/kvbridge/kvbridge/internal/cudadouble"
	"github.com/kvbridge/kvbridge/internal/nixldouble"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// A child run of kvbench itself (TestVRAMRefusedWithoutGPU): a process
	// of its own, since the CUDA driver is loaded once per process.
	if args, ok := os.LookupEnv("KVBENCH_TEST_RUN"); ok {
		os.Exit(run(strings.Fields(args)))
	}
	goleak.VerifyTestMain(m)
}

// TestQuickRun runs every mode with small sizes and checks the JSON: every
// row has a positive figure, at least one reference figure and its ratio,
// and the chart is written.
func TestQuickRun(t *testing.T) {
	dir := t.TempDir()
	js, png := filepath.Join(dir, "out.json"), filepath.Join(dir, "out.png")
	require.Zero(t, run([]string{"-quick", "-model", "tiny", "-json", js, "-png", png}), "exit")
	var rows []Row
	data, err := os.ReadFile(js)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &rows))
	modes := map[string]int{}
	for _, r := range rows {
		modes[r.Mode]++
		assert.Positive(t, r.Value, "row without a figure: %+v", r)
		assert.NotEmpty(t, r.Unit, "row without a figure: %+v", r)
		assert.NotEmpty(t, r.Name, "row without a figure: %+v", r)
		assert.NotEmpty(t, r.References, "row without a reference: %+v", r)
		for k, v := range r.References {
			assert.Positive(t, v, "reference %s of %s (ratio %v)", k, r.Name, r.Ratios[k])
			assert.Positive(t, r.Ratios[k], "reference %s of %s: %v: ratio", k, r.Name, v)
		}
		checkCPU(t, r)
	}
	for _, m := range []string{"engine", "paged", "rooms", "topology", "discovery", "control"} {
		assert.NotZero(t, modes[m], "no %s rows", m)
	}
	st, err := os.Stat(png)
	require.NoError(t, err, "chart")
	require.GreaterOrEqual(t, st.Size(), int64(1000), "chart")
}

// checkCPU: a row says what it cost (issue 24): kvbridge's CPU in a unit,
// and at least one reference's CPU in the same run, with its ratio.
func checkCPU(t *testing.T, r Row) {
	t.Helper()
	assert.Positive(t, r.CPU, "row without its CPU: %+v", r)
	assert.NotEmpty(t, r.CPUUnit, "row without its CPU: %+v", r)
	assert.NotEmpty(t, r.RefCPU, "row without a reference's CPU: %+v", r)
	for k, v := range r.RefCPU {
		assert.Positive(t, v, "reference CPU %s of %s (ratio %v)", k, r.Name, r.CPURatios[k])
		assert.Positive(t, r.CPURatios[k], "reference CPU %s of %s: %v: ratio", k, r.Name, v)
	}
}

func readRows(t *testing.T, path string) []Row {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var rows []Row
	require.NoError(t, json.Unmarshal(data, &rows))
	return rows
}

// TestModeAlone: a mode run alone exits 0 once it has its results and
// writes them; control and paged exited 1 after their results ("chart: no
// engine rows to chart"), as the chart was asked for by default. The
// modes -mem VRAM measures run alone on each engine that moves VRAM, on
// the CUDA driver double (and the NIXL double for libnixl): every row is
// a VRAM row with cuMemcpyDtoD and its CPU as a reference (the engine
// mode's writes are checked in the target's device memory).
func TestModeAlone(t *testing.T) {
	alone := func(t *testing.T, mode string, extra ...string) {
		dir := t.TempDir()
		js, png := filepath.Join(dir, "out.json"), filepath.Join(dir, "out.png")
		args := append([]string{"-mode", mode, "-quick", "-model", "tiny", "-json", js, "-png", png}, extra...)
		require.Zero(t, run(args), "kvbench %s: exit", strings.Join(args, " "))
		rows := readRows(t, js)
		require.NotEmpty(t, rows, "no rows")
		vram := slices.Contains(extra, "VRAM")
		for _, r := range rows {
			assert.Equal(t, mode, r.Mode, "a row from -mode %s", mode)
			checkCPU(t, r)
			if vram {
				assert.True(t, strings.HasSuffix(r.Name, " VRAM"), "a -mem VRAM row without its cuMemcpyDtoD reference: %+v", r)
				assert.Positive(t, r.References["cuMemcpyDtoD"], "a -mem VRAM row without its cuMemcpyDtoD reference: %+v", r)
				assert.Positive(t, r.RefCPU["cuMemcpyDtoD"], "a -mem VRAM row without its cuMemcpyDtoD reference: %+v", r)
			}
		}
		_, err := os.Stat(png)
		assert.Equal(t, mode == "engine", err == nil, "chart %v: want one only with engine rows", err)
	}
	for _, mode := range []string{"control", "paged", "layerwise", "pages", "pull", "digest"} {
		t.Run(mode, func(t *testing.T) { alone(t, mode) })
	}
	dir := t.TempDir()
	cuda, err := cudadouble.Build(dir)
	require.NoError(t, err)
	t.Setenv("KVBRIDGE_CUDA_LIB", cuda)
	nixlSkip := ""
	if os.Getenv("KVBRIDGE_NIXL_LIB") != "" {
		nixlSkip = "KVBRIDGE_NIXL_LIB is set: a real NIXL cannot move the CUDA double's memory"
	} else {
		lib, err := nixldouble.Build(dir)
		require.NoError(t, err)
		t.Setenv("KVBRIDGE_NIXL_LIB", lib)
	}
	for _, engine := range []string{"loopback", "ucx", "libnixl"} {
		for _, mode := range vramModes {
			t.Run(mode+" VRAM "+engine, func(t *testing.T) {
				if engine == "libnixl" && nixlSkip != "" {
					t.Skip(nixlSkip)
				}
				alone(t, mode, "-engine", engine, "-mem", "VRAM")
			})
		}
	}
}

// TestVRAMRefusedWithoutGPU: -mem VRAM without a CUDA driver exits 1 with
// a one-line reason and no results; a mode it does not measure is a usage
// error. kvbench runs in a process of its own (this test binary again).
func TestVRAMRefusedWithoutGPU(t *testing.T) {
	dir := t.TempDir()
	kvbench := func(args string) (int, string, string) {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "KVBENCH_TEST_RUN="+args, "KVBRIDGE_CUDA_LIB="+filepath.Join(dir, "no-libcuda.so.1"))
		cmd.Dir = dir
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil {
			require.ErrorAs(t, err, &ee)
		}
		return cmd.ProcessState.ExitCode(), out.String(), errb.String()
	}
	code, out, errs := kvbench("-mem VRAM -quick -model tiny")
	assert.Equal(t, 1, code, "kvbench -mem VRAM without a GPU: exit (stdout %q, stderr %q)", out, errs)
	assert.Empty(t, out, "kvbench -mem VRAM without a GPU: stdout")
	assert.Equal(t, 1, strings.Count(errs, "\n"), "kvbench -mem VRAM without a GPU: want one line with the reason: %q", errs)
	assert.True(t, strings.HasPrefix(errs, "kvbench: -mem VRAM needs a GPU"), "kvbench -mem VRAM without a GPU: stderr %q", errs)
	assert.Contains(t, errs, "no-libcuda.so.1", "kvbench -mem VRAM without a GPU: stderr")
	_, err := os.Stat(filepath.Join(dir, "kvbench.json"))
	assert.Error(t, err, "a refused run wrote results")
	code, _, errs = kvbench("-mem VRAM -mode control")
	assert.Equal(t, 2, code, "kvbench -mem VRAM -mode control: exit (%q)", errs)
	assert.Contains(t, errs, "-mem VRAM applies to engine, paged, rooms, digest", "kvbench -mem VRAM -mode control: want the modes it applies to")
}

// TestIdleMode: -mode idle starts real ucx rank processes, registers them
// with a room, and reports each process's share of a core over the window
// with the goal, and the loopback pair in this process; the figures
// themselves are not asserted (the machine is shared).
func TestIdleMode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the rank binaries")
	}
	dir := t.TempDir()
	js := filepath.Join(dir, "out.json")
	var code int
	out := stdout(t, func() {
		code = run([]string{"-mode", "idle", "-idle-for", "1s", "-quick", "-model", "tiny", "-json", js, "-png", filepath.Join(dir, "x.png")})
	})
	require.Zero(t, code, "kvbench -mode idle: exit\n%s", out)
	want := map[string]bool{"ucx prefill rank process": false, "ucx decode rank process": false, "loopback prefill + decode, one process": false}
	for _, r := range readRows(t, js) {
		assert.Contains(t, want, r.Name, "unexpected row %+v", r)
		assert.Equal(t, "idle", r.Mode, "unexpected row %+v", r)
		assert.Equal(t, "% of a core", r.Unit, "unexpected row %+v", r)
		assert.GreaterOrEqual(t, r.Value, 0.0, "unexpected row %+v", r)
		assert.Equal(t, idleGoal, r.References["goal"], "unexpected row %+v", r)
		want[r.Name] = true
	}
	for name, seen := range want {
		assert.True(t, seen, "no row %q", name)
	}
	assert.Contains(t, out, "idle goal ≤ 0.1 % of a core per rank over 1s: ", "no goal line")
}

// stdout runs f with os.Stdout sent to a file and returns what f wrote.
func stdout(t *testing.T, f func()) string {
	t.Helper()
	tmp, err := os.CreateTemp(t.TempDir(), "stdout")
	require.NoError(t, err)
	defer tmp.Close()
	saved := os.Stdout
	os.Stdout = tmp
	defer func() { os.Stdout = saved }()
	f()
	b, err := os.ReadFile(tmp.Name())
	require.NoError(t, err)
	return string(b)
}

// TestHelp: kvbench -h exits 0 (it exited 2, issue 27) with a usage that
// says what it measures and lists its flags.
func TestHelp(t *testing.T) {
	var code int
	out := capture.Stderr(t, func() { code = run([]string{"-h"}) })
	assert.Zero(t, code, "kvbench -h: exit")
	assert.True(t, strings.HasPrefix(out, "kvbench: measures kvbridge"), "kvbench -h:\n%s", out)
	assert.Contains(t, out, "\n  -mode ", "kvbench -h")
}
