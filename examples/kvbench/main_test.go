package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvbridge/kvbridge/internal/capture"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
// engine rows to chart"), as the chart was asked for by default.
func TestModeAlone(t *testing.T) {
	for _, mode := range []string{"control", "paged", "layerwise"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			js, png := filepath.Join(dir, "out.json"), filepath.Join(dir, "out.png")
			if code := run([]string{"-mode", mode, "-quick", "-model", "tiny", "-json", js, "-png", png}); code != 0 {
				t.Fatalf("kvbench -mode %s: exit %d, want 0", mode, code)
			}
			rows := readRows(t, js)
			if len(rows) == 0 {
				t.Fatalf("no rows")
			}
			for _, r := range rows {
				if r.Mode != mode {
					t.Errorf("a %s row from -mode %s", r.Mode, mode)
				}
				checkCPU(t, r)
			}
			if _, err := os.Stat(png); err == nil {
				t.Errorf("a chart without engine rows")
			}
		})
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
