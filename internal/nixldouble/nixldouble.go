// Package nixldouble builds a test double of NIXL's C API
// (libnixl_capi.so, with the libnixl.so it needs loaded first) for tests on
// machines without NIXL, and reads the counters the double keeps. It is a
// double, named as one: the libnixl engine's code is the same against it and
// against a real NIXL (KVBRIDGE_NIXL_LIB). Where real NIXL 1.4.0 was seen to
// behave differently from what a naive double would do, the double behaves
// like NIXL; the C source lists those cases.
package nixldouble

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

static void *nd_sym(const char *lib, const char *name) {
	void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
	if (h == NULL) return NULL;
	void *f = dlsym(h, name);
	dlclose(h);
	return f;
}
static long nd_call_long(void *f) { return ((long (*)(void))f)(); }
static int nd_agent_config(void *f, const char *name, int *sync, uint64_t *delay) {
	return ((int (*)(const char *, int *, uint64_t *))f)(name, sync, delay);
}
static int nd_engine_config(void *f, const char *n, char *out, size_t len) { return ((int (*)(const char *, char *, size_t))f)(n, out, len); }
static int nd_call_name(void *f, const char *name) { return ((int (*)(const char *))f)(name); }
*/
import "C"

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
	"unsafe"
)

//go:embed nixl_capi_double.c.in
var capiSource []byte

//go:embed core.c.in
var coreSource []byte

// Build compiles the double with gcc into dir and returns the path of its
// libnixl_capi.so (pass it as KVBRIDGE_NIXL_LIB or Config.NIXLLib).
func Build(dir string) (string, error) {
	capi, core := filepath.Join(dir, "nixl_capi_double.c"), filepath.Join(dir, "core.c")
	if err := os.WriteFile(capi, capiSource, 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(core, coreSource, 0o644); err != nil {
		return "", err
	}
	lib := filepath.Join(dir, "libnixl_capi.so")
	for _, c := range [][]string{
		{"gcc", "-shared", "-fPIC", "-O2", "-o", filepath.Join(dir, "libnixl.so"), core},
		{"gcc", "-shared", "-fPIC", "-O2", "-Wall", "-o", lib, capi, "-lpthread"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			return "", fmt.Errorf("building the NIXL double: %v: %s", err, out)
		}
	}
	return lib, nil
}

func sym(lib, name string) (unsafe.Pointer, error) {
	cl, cn := C.CString(lib), C.CString(name)
	defer C.free(unsafe.Pointer(cl))
	defer C.free(unsafe.Pointer(cn))
	f := C.nd_sym(cl, cn)
	if f == nil {
		return nil, fmt.Errorf("nixldouble: %s has no %s (not the double, or not loaded in this process)", lib, name)
	}
	return f, nil
}

// Violations counts the calls that overlapped another call on an agent
// created without thread sync (as NIXL's nixl_capi_create_agent makes them).
func Violations(lib string) (int64, error) {
	f, err := sym(lib, "nixl_double_violations")
	if err != nil {
		return 0, err
	}
	return int64(C.nd_call_long(f)), nil
}

// LiveRequests counts the transfer requests made and not destroyed.
func LiveRequests(lib string) (int64, error) {
	f, err := sym(lib, "nixl_double_live_requests")
	if err != nil {
		return 0, err
	}
	return int64(C.nd_call_long(f)), nil
}

// PrepCalls counts the calls of nixl_capi_prep_xfer_dlist.
func PrepCalls(lib string) (int64, error) {
	f, err := sym(lib, "nixl_double_prep_calls")
	if err != nil {
		return 0, err
	}
	return int64(C.nd_call_long(f)), nil
}

// NotifCalls counts the calls of nixl_capi_get_notifs (a rank's notifier
// polls it on this engine).
func NotifCalls(lib string) (int64, error) {
	f, err := sym(lib, "nixl_double_notif_calls")
	if err != nil {
		return 0, err
	}
	return int64(C.nd_call_long(f)), nil
}

// Thread sync modes, as nixl_capi_thread_sync_t.
const (
	SyncNone   = 0
	SyncStrict = 1
	SyncRW     = 2
)

// AgentConfig returns how the named live agent was created: its thread
// sync mode and its progress thread's delay.
func AgentConfig(lib, agent string) (sync int, delay time.Duration, err error) {
	f, err := sym(lib, "nixl_double_agent_config")
	if err != nil {
		return 0, 0, err
	}
	cn := C.CString(agent)
	defer C.free(unsafe.Pointer(cn))
	var s C.int
	var d C.uint64_t
	if C.nd_agent_config(f, cn, &s, &d) == 0 {
		return 0, 0, fmt.Errorf("nixldouble: no live agent %q", agent)
	}
	return int(s), time.Duration(d) * time.Microsecond, nil
}

// EngineConfig returns the "engine_config" backend parameter (UCX
// settings) the named live agent's UCX backend was created with.
func EngineConfig(lib, agent string) (string, error) {
	f, err := sym(lib, "nixl_double_engine_config")
	if err != nil {
		return "", err
	}
	cn := C.CString(agent)
	defer C.free(unsafe.Pointer(cn))
	var out [512]C.char
	if C.nd_engine_config(f, cn, &out[0], C.size_t(len(out))) == 0 {
		return "", fmt.Errorf("nixldouble: no live agent %q", agent)
	}
	return C.GoString(&out[0]), nil
}

// AgentProgressThread reports whether the named live agent was created
// with NIXL's progress thread.
func AgentProgressThread(lib, agent string) (bool, error) {
	f, err := sym(lib, "nixl_double_agent_prog")
	if err != nil {
		return false, err
	}
	cn := C.CString(agent)
	defer C.free(unsafe.Pointer(cn))
	switch C.nd_call_name(f, cn) {
	case 0:
		return false, nil
	case 1:
		return true, nil
	}
	return false, fmt.Errorf("nixldouble: no live agent %q", agent)
}

// Kill models a kill -9 of the named agent's process: nothing reaches its
// memory any more, and its peers' endpoints to it fail (their error
// callbacks run on their progress threads, or inside their next post,
// status or notifications call). The agent itself must still be destroyed.
func Kill(lib, agent string) error {
	f, err := sym(lib, "nixl_double_kill")
	if err != nil {
		return err
	}
	cn := C.CString(agent)
	defer C.free(unsafe.Pointer(cn))
	if C.nd_call_name(f, cn) == 0 {
		return fmt.Errorf("nixldouble: no live agent %q", agent)
	}
	return nil
}

// EndpointFailures counts the endpoints whose error callback ran.
func EndpointFailures(lib string) (int64, error) {
	f, err := sym(lib, "nixl_double_ep_failures")
	if err != nil {
		return 0, err
	}
	return int64(C.nd_call_long(f)), nil
}
