package apicheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// layers is the layering docs/PACKAGES.md draws: a package imports (in
// its non-test files) only packages of a lower layer. 0–3: the pure
// internals (the wire codec, memory spans, the public layout types of
// transfer, the layout arithmetic, the protocol core) and leaf helpers;
// 3–4: the data plane, the control plane (bootstrap's discovery and
// credentials, then internal/control's loop above it) and the transfer
// pool; 5: the rank shells; 6: the request handles; 7–9:
// what the example servers and the tests share, then the servers; 10: the
// example binaries. The example servers' shared code lives under
// examples/internal/ (layers 7–9); no package outside examples/, test
// files included, imports examples/, and within examples/ only
// examples/internal/ is imported.
var layers = map[string]int{
	"internal/wire": 0, "transfer": 0, "internal/mem": 1, "internal/cuda": 1, "gpu": 1, "internal/cpustat": 0, "internal/capture": 0,
	"internal/leakcheck": 0, "internal/dl": 0, "internal/rankhooks": 0, "internal/canary": 0, "internal/kvdigest": 0, "internal/testnet": 0, "internal/promread": 0, "internal/nixldouble": 0, "internal/cudadouble": 0, "internal/apicheck": 0,
	"internal/curve": 0, "internal/ident": 1, "internal/records": 1, "internal/wire/wiretest": 1,
	"internal/kvlayout": 2,
	"internal/core":     3,
	"nixl":              2,
	"internal/nixl":     3, "bootstrap": 3,
	"internal/rawagent": 4, "internal/nixl/ucx": 4, "internal/pool": 4, "internal/control": 4, "internal/discovery": 4,
	"kvmanager": 5,
	"sender":    6, "receiver": 6,
	"internal/testauth": 7, "internal/etcdtest": 7, "internal/kvmodel": 7, "internal/layerbench": 7,
	"examples/internal/cli": 7, "examples/internal/tinyllm": 7, "examples/internal/openai": 7,
	"examples/internal/rankcmd": 8,
	"internal/e2e":              9, "scripts/srcmutants": 9, "examples/internal/router": 9, "examples/internal/e2e": 9,
	"examples/prefill": 10, "examples/decode": 10, "examples/demo": 10, "examples/router": 10, "examples/kvbench": 10, "examples/gpucheck": 10,
}

type listed struct {
	ImportPath                         string
	Imports, TestImports, XTestImports []string
}

// TestLayering: every package of the module has a layer, imports only
// packages of lower layers, and nothing imports examples/.
func TestLayering(t *testing.T) {
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, stderr.String())
	dec := json.NewDecoder(bytes.NewReader(out))
	n := 0
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err)
		}
		n++
		name := strings.TrimPrefix(p.ImportPath, module)
		mine, ok := layers[name]
		if !assert.True(t, ok, "%s has no layer: add it to layers and to docs/PACKAGES.md", name) {
			continue
		}
		for _, imp := range p.Imports {
			dep, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			assert.Less(t, layers[dep], mine, "%s (layer %d) imports %s (layer %d): an arrow back up the layering", name, mine, dep, layers[dep])
		}
		for _, imp := range slices.Concat(p.Imports, p.TestImports, p.XTestImports) {
			dep, ok := strings.CutPrefix(imp, module)
			if !ok || !strings.HasPrefix(dep, "examples/") {
				continue
			}
			assert.True(t, strings.HasPrefix(name, "examples/"), "%s imports %s: nothing outside examples/ imports examples/", name, imp)
			assert.True(t, strings.HasPrefix(dep, "examples/internal/"), "%s imports %s: within examples/, only examples/internal/ is imported", name, imp)
		}
	}
	assert.Greater(t, n, 30, "go list found only %d packages", n)
}
