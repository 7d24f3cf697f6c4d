// Package cudadouble builds a test double of the CUDA driver (libcuda.so.1)
// for tests on machines without a GPU: device memory is host memory from
// memfd_create, copies are memmove, CUDA IPC works across processes. It is
// a double, named as one; the real driver path is the same binding code.
package cudadouble

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

//go:embed fake_libcuda.c.in
var source []byte

// Build compiles the double with gcc into dir and returns the library path
// (pass it to cuda.OpenDriver or as nixl.Config.CUDALib; a binary takes
// it from KVBRIDGE_CUDA_LIB).
func Build(dir string) (string, error) {
	src := filepath.Join(dir, "fake_libcuda.c")
	if err := os.WriteFile(src, source, 0o644); err != nil {
		return "", err
	}
	lib := filepath.Join(dir, "libcuda.so.1")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-O2", "-Wall", "-o", lib, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the CUDA double: %v: %s", err, out)
	}
	return lib, nil
}
