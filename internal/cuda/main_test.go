package cuda

import (
	"fmt"
	"os"
	"testing"

	"github.com/kvbridge/kvbridge/internal/cudadouble"
	"github.com/kvbridge/kvbridge/internal/leakcheck"
)

// doubleLib is the CUDA driver test double built for this test binary.
var doubleLib string

func TestMain(m *testing.M) {
	if os.Getenv("KVBRIDGE_GPU_CHILD") != "" {
		os.Exit(runIPCChild())
	}
	dir, err := os.MkdirTemp("", "kvbridge-cuda-double")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if doubleLib, err = cudadouble.Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := 1
	func() {
		defer os.RemoveAll(dir)
		code = leakcheck.Run(m)
	}()
	os.Exit(code)
}
