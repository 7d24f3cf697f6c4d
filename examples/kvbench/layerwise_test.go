package main

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/kvbridge/kvbridge/internal/capture"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	require.Zero(t, code, "kvbench -mode layerwise: exit\n%s", out)
	want := map[string]string{}
	for _, compute := range []string{"cpu", "device"} {
		for _, n := range []string{"256", "512"} {
			name := fmt.Sprintf("tiny %s tok %s", n, compute)
			want[name+" TTFT"], want[name+" tail"] = "whole-chunk", "one layer's transfer"
			assert.Contains(t, out, "layerwise "+name+": 2 layers, one layer's compute ", "no goal line for %s", name)
			assert.Contains(t, out, "(goal ≤ 0.6)", "no goal line for %s", name)
		}
	}
	for _, r := range readRows(t, js) {
		ref, ok := want[r.Name]
		assert.True(t, ok, "unexpected row %+v", r)
		assert.Equal(t, "layerwise", r.Mode, "unexpected row %+v", r)
		assert.Equal(t, "ms", r.Unit, "unexpected row %+v", r)
		assert.Positive(t, r.Value, "unexpected row %+v", r)
		assert.Positive(t, r.References[ref], "unexpected row %+v", r)
		assert.Positive(t, r.Ratios[ref], "unexpected row %+v", r)
		checkCPU(t, r)
		delete(want, r.Name)
	}
	assert.Empty(t, want, "no rows for these")
	errOut := capture.Stderr(t, func() {
		code = run([]string{"-mode", "layerwise", "-quick", "-model", "tiny", "-layer-compute", "gpu", "-json", "", "-png", ""})
	})
	assert.Equal(t, 1, code, "-layer-compute gpu: exit (%q)", errOut)
	assert.Contains(t, errOut, `-layer-compute "gpu"`, "-layer-compute gpu")
}
