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
