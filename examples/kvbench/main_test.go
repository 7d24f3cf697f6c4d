package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvbridge/kvbridge/internal/capture"
	"github.com/kvbridge/kvbridge/internal/cudadouble"
	"github.com/kvbridge/kvbridge/internal/nixldouble"
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
	if code := run([]string{"-quick", "-model", "tiny", "-json", js, "-png", png}); code != 0 {
		t.Fatalf("exit %d", code)
	}
	var rows []Row
	data, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &rows); err != nil {
		t.Fatal(err)
	}
	modes := map[string]int{}
	for _, r := range rows {
		modes[r.Mode]++
		if r.Value <= 0 || r.Unit == "" || r.Name == "" {
			t.Errorf("row without a figure: %+v", r)
		}
		if len(r.References) == 0 {
			t.Errorf("row without a reference: %+v", r)
		}
		for k, v := range r.References {
			if v <= 0 || r.Ratios[k] <= 0 {
				t.Errorf("reference %s of %s: %v (ratio %v)", k, r.Name, v, r.Ratios[k])
			}
		}
		checkCPU(t, r)
	}
	for _, m := range []string{"engine", "paged", "rooms", "topology", "discovery", "control"} {
		if modes[m] == 0 {
			t.Errorf("no %s rows", m)
		}
	}
	if st, err := os.Stat(png); err != nil || st.Size() < 1000 {
		t.Fatalf("chart: %v", err)
	}
}

// checkCPU: a row says what it cost (issue 24): kvbridge's CPU in a unit,
// and at least one reference's CPU in the same run, with its ratio.
func checkCPU(t *testing.T, r Row) {
	t.Helper()
	if r.CPU <= 0 || r.CPUUnit == "" {
		t.Errorf("row without its CPU: %+v", r)
	}
	if len(r.RefCPU) == 0 {
		t.Errorf("row without a reference's CPU: %+v", r)
	}
	for k, v := range r.RefCPU {
		if v <= 0 || r.CPURatios[k] <= 0 {
			t.Errorf("reference CPU %s of %s: %v (ratio %v)", k, r.Name, v, r.CPURatios[k])
		}
	}
}

func readRows(t *testing.T, path string) []Row {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rows []Row
	if err := json.Unmarshal(data, &rows); err != nil {
		t.Fatal(err)
	}
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
		if code := run(args); code != 0 {
			t.Fatalf("kvbench %s: exit %d, want 0", strings.Join(args, " "), code)
		}
		rows := readRows(t, js)
		if len(rows) == 0 {
			t.Fatalf("no rows")
		}
		vram := slices.Contains(extra, "VRAM")
		for _, r := range rows {
			if r.Mode != mode {
				t.Errorf("a %s row from -mode %s", r.Mode, mode)
			}
			checkCPU(t, r)
			if vram && (!strings.HasSuffix(r.Name, " VRAM") || r.References["cuMemcpyDtoD"] <= 0 || r.RefCPU["cuMemcpyDtoD"] <= 0) {
				t.Errorf("a -mem VRAM row without its cuMemcpyDtoD reference: %+v", r)
			}
		}
		if _, err := os.Stat(png); (err == nil) != (mode == "engine") {
			t.Errorf("chart %v: want one only with engine rows", err)
		}
	}
	for _, mode := range []string{"control", "paged", "layerwise", "pages", "pull"} {
		t.Run(mode, func(t *testing.T) { alone(t, mode) })
	}
	dir := t.TempDir()
	cuda, err := cudadouble.Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("KVBRIDGE_CUDA_LIB", cuda)
	nixlSkip := ""
	if os.Getenv("KVBRIDGE_NIXL_LIB") != "" {
		nixlSkip = "KVBRIDGE_NIXL_LIB is set: a real NIXL cannot move the CUDA double's memory"
	} else {
		lib, err := nixldouble.Build(dir)
		if err != nil {
			t.Fatal(err)
		}
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
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode(), out.String(), errb.String()
	}
	code, out, errs := kvbench("-mem VRAM -quick -model tiny")
	if code != 1 || out != "" || strings.Count(errs, "\n") != 1 || !strings.HasPrefix(errs, "kvbench: -mem VRAM needs a GPU") || !strings.Contains(errs, "no-libcuda.so.1") {
		t.Errorf("kvbench -mem VRAM without a GPU: exit %d, stdout %q, stderr %q; want exit 1 and one line with the reason", code, out, errs)
	}
	if _, err := os.Stat(filepath.Join(dir, "kvbench.json")); err == nil {
		t.Errorf("a refused run wrote results")
	}
	code, _, errs = kvbench("-mem VRAM -mode control")
	if code != 2 || !strings.Contains(errs, "-mem VRAM applies to engine, paged, rooms") {
		t.Errorf("kvbench -mem VRAM -mode control: exit %d, %q; want 2 and the modes it applies to", code, errs)
	}
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
	if code != 0 {
		t.Fatalf("kvbench -mode idle: exit %d\n%s", code, out)
	}
	want := map[string]bool{"ucx prefill rank process": false, "ucx decode rank process": false, "loopback prefill + decode, one process": false}
	for _, r := range readRows(t, js) {
		if _, ok := want[r.Name]; !ok || r.Mode != "idle" || r.Unit != "% of a core" || r.Value < 0 || r.References["goal"] != idleGoal {
			t.Errorf("unexpected row %+v", r)
		}
		want[r.Name] = true
	}
	for name, seen := range want {
		if !seen {
			t.Errorf("no row %q", name)
		}
	}
	if !strings.Contains(out, "idle goal ≤ 0.1 % of a core per rank over 1s: ") {
		t.Errorf("no goal line in:\n%s", out)
	}
}

// stdout runs f with os.Stdout sent to a file and returns what f wrote.
func stdout(t *testing.T, f func()) string {
	t.Helper()
	tmp, err := os.CreateTemp(t.TempDir(), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	defer tmp.Close()
	saved := os.Stdout
	os.Stdout = tmp
	defer func() { os.Stdout = saved }()
	f()
	b, err := os.ReadFile(tmp.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestHelp: kvbench -h exits 0 (it exited 2, issue 27) with a usage that
// says what it measures and lists its flags.
func TestHelp(t *testing.T) {
	var code int
	out := capture.Stderr(t, func() { code = run([]string{"-h"}) })
	if code != 0 {
		t.Errorf("kvbench -h: exit %d, want 0", code)
	}
	if !strings.HasPrefix(out, "kvbench: measures kvbridge") || !strings.Contains(out, "\n  -mode ") {
		t.Errorf("kvbench -h:\n%s", out)
	}
}
