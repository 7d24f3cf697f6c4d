package gpu

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Only gpu (and what imports it: examples/gpucheck) compiles
// go-nvml, whose cgo prologue floods a plain go build with deprecation
// warnings: the library and the other examples build quietly.
func TestOnlyDiscoveryCompilesNVML(t *testing.T) {
	pkgs := []string{"../nixl", "../internal/nixl", "../kvmanager", "../transfer", "../bootstrap", "../sender", "../receiver", "../internal/cuda",
		"../examples/prefill", "../examples/decode", "../examples/demo", "../examples/kvbench"}
	out, err := exec.Command("go", append([]string{"list", "-deps"}, pkgs...)...).CombinedOutput()
	require.NoError(t, err, "go list: %s", out)
	for _, p := range strings.Fields(string(out)) {
		require.NotContains(t, p, "go-nvml", "%s is in the dependencies of %v", p, pkgs)
	}
}
