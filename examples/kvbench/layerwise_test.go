package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvbridge/kvbridge/internal/capture"
)

// TestLayerwiseMode: -mode layerwise gives, for each compute and size, a
// TTFT row against whole-chunk's and a tail row against one layer's
// transfer, each with its CPU against whole-chunk's, and a goal line; the
// figures themselves are not asserted (the machine is shared).
func TestLayerwiseMode(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "out.json")
	var code int
	out := stdout(t, func() {
		code = run([]string{"-mode", "layerwise", "-quick", "-model", "tiny", "-json", js, "-png", ""})
	})
	if code != 0 {
		t.Fatalf("kvbench -mode layerwise: exit %d\n%s", code, out)
	}
	want := map[string]string{}
	for _, compute := range []string{"cpu", "device"} {
		for _, n := range []string{"256", "512"} {
			name := fmt.Sprintf("tiny %s tok %s", n, compute)
			want[name+" TTFT"], want[name+" tail"] = "whole-chunk", "one layer's transfer"
			if !strings.Contains(out, "layerwise "+name+": 2 layers, one layer's compute ") || !strings.Contains(out, "(goal ≤ 0.6)") {
				t.Errorf("no goal line for %s in:\n%s", name, out)
			}
		}
	}
	for _, r := range readRows(t, js) {
		ref, ok := want[r.Name]
		if !ok || r.Mode != "layerwise" || r.Unit != "ms" || r.Value <= 0 || r.References[ref] <= 0 || r.Ratios[ref] <= 0 {
			t.Errorf("unexpected row %+v", r)
		}
		checkCPU(t, r)
		delete(want, r.Name)
	}
	for name := range want {
		t.Errorf("no row %q", name)
	}
	errOut := capture.Stderr(t, func() {
		code = run([]string{"-mode", "layerwise", "-quick", "-model", "tiny", "-layer-compute", "gpu", "-json", "", "-png", ""})
	})
	if code != 1 || !strings.Contains(errOut, `-layer-compute "gpu"`) {
		t.Errorf("-layer-compute gpu: exit %d, %q", code, errOut)
	}
}
