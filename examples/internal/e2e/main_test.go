// Package e2e holds the example servers' end-to-end tests: example prefill
// and decode ranks (examples/internal/rankcmd, the example binaries' body,
// run as re-executions of the test binary) computing real KV with a small
// model, behind the example router and the P/D wires (SGLang's, vLLM's).
// The library's own end-to-end tests are internal/e2e.
package e2e

import (
	"os"
	"testing"

	"github.com/kvbridge/kvbridge/internal/leakcheck"
	"github.com/kvbridge/kvbridge/internal/testnet"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }

// freePort returns a tcp port on 127.0.0.1 free a moment ago.
func freePort(t *testing.T) string { return testnet.FreePort(t) }
