// Package cudadouble builds a test double of the CUDA driver (libcuda.so.1)
// for tests on machines without a GPU: device memory is host memory from
// memfd_create, copies are memmove, CUDA IPC works across processes. It is
// a double, named as one; the real driver path is the same binding code.
package cudadouble

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

// cd_launches calls the loaded double's cuDoubleLaunches(dev) (-2: lib is
// not loaded in this process; -3: it has no such function; -1: no such
// device).
static long cd_launches(const char *lib, int dev)
{
	void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
	if (h == NULL) return -2;
	long (*f)(int) = (long (*)(int))dlsym(h, "cuDoubleLaunches");
	long n = f ? f(dev) : -3;
	dlclose(h);
	return n;
}

// cd_call_int calls the loaded double's function name(v) (-2: lib is not
// loaded; -3: no such function).
static int cd_call_int(const char *lib, const char *name, int v)
{
	void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
	if (h == NULL) return -2;
	void (*f)(int) = (void (*)(int))dlsym(h, name);
	if (f != NULL) f(v);
	dlclose(h);
	return f != NULL ? 0 : -3;
}
*/
import "C"

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"unsafe"
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

// Launches counts the kernels the double at lib, loaded in this process,
// has launched on device dev (cuLaunchKernel: the digest's kernel, which
// the double runs in C) — a test's evidence that the sums came from the
// device path, and on which device.
func Launches(lib string, dev int) (int64, error) {
	cl := C.CString(lib)
	defer C.free(unsafe.Pointer(cl))
	switch n := int64(C.cd_launches(cl, C.int(dev))); n {
	case -1:
		return 0, fmt.Errorf("cudadouble: no device %d (0 … 63)", dev)
	case -2:
		return 0, fmt.Errorf("cudadouble: %s is not loaded in this process", lib)
	case -3:
		return 0, fmt.Errorf("cudadouble: %s has no cuDoubleLaunches", lib)
	default:
		return n, nil
	}
}

// SetDevices sets how many devices the double at lib, loaded in this
// process, has (-1: back to KVB_CUDA_DOUBLE_DEVICES, default 1), without
// changing the environment while its threads read it.
func SetDevices(lib string, n int) error { return call(lib, "cuDoubleSetDevices", n) }

// FailLaunchesOn makes the double's kernel launches on device dev fail
// (CUDA_ERROR_LAUNCH_FAILED); -1 for none.
func FailLaunchesOn(lib string, dev int) error { return call(lib, "cuDoubleFailLaunchOn", dev) }

func call(lib, name string, v int) error {
	cl, cn := C.CString(lib), C.CString(name)
	defer C.free(unsafe.Pointer(cl))
	defer C.free(unsafe.Pointer(cn))
	switch C.cd_call_int(cl, cn, C.int(v)) {
	case -2:
		return fmt.Errorf("cudadouble: %s is not loaded in this process", lib)
	case -3:
		return fmt.Errorf("cudadouble: %s has no %s", lib, name)
	}
	return nil
}
