package cuda

/*
#cgo LDFLAGS: -ldl
#cgo CFLAGS: -I${SRCDIR}/../dl
#include <stdlib.h>
#include "cuda.h"

static int cu_init(kvb_cuda *c) { return c->init(0); }
static int cu_driver_version(kvb_cuda *c, int *v) { return c->driver_version(v); }
static int cu_device_count(kvb_cuda *c, int *n) { return c->device_count(n); }
static int cu_primary_release(kvb_cuda *c, int ordinal) {
	cu_device d;
	int r = c->device_get(&d, ordinal);
	return r ? r : c->primary_release(d);
}
static int cu_set(kvb_cuda *c, cu_context ctx) { return c->ctx_set_current(ctx); }
static int cu_dtod(kvb_cuda *c, cu_ptr d, cu_ptr s, size_t n) { return c->memcpy_dtod(d, s, n); }
static int cu_copy(kvb_cuda *c, cu_ptr d, cu_ptr s, size_t n) { return c->memcpy_any(d, s, n); }
static int cu_htod_async(kvb_cuda *c, cu_ptr d, uintptr_t s, size_t n, cu_stream st) { return c->memcpy_htod_async(d, (const void *)s, n, st); }
static int cu_dtoh_async(kvb_cuda *c, uintptr_t d, cu_ptr s, size_t n, cu_stream st) { return c->memcpy_dtoh_async((void *)d, s, n, st); }
static int cu_dtod_async(kvb_cuda *c, cu_ptr d, cu_ptr s, size_t n, cu_stream st) { return c->memcpy_dtod_async(d, s, n, st); }
static int cu_copy_async(kvb_cuda *c, cu_ptr d, cu_ptr s, size_t n, cu_stream st) { return c->memcpy_any_async(d, s, n, st); }
static int cu_copy_batch_async(kvb_cuda *c, const uint64_t *d, const uint64_t *s, const uint64_t *n, int count, cu_stream st, int *failed) {
	for (int i = 0; i < count; i++) {
		int r = c->memcpy_any_async(d[i], s[i], n[i], st);
		if (r) { *failed = i; return r; }
	}
	return 0;
}
static int cu_stream_create(kvb_cuda *c, cu_stream *s) { return c->stream_create(s, 1); } // non-blocking
static int cu_stream_sync(kvb_cuda *c, cu_stream s) { return c->stream_sync(s); }
static int cu_stream_destroy(kvb_cuda *c, cu_stream s) { return c->stream_destroy(s); }
static int cu_ipc_get(kvb_cuda *c, void *h, cu_ptr p) { return c->ipc_get((cu_ipc_handle *)h, p); }
static int cu_ipc_open(kvb_cuda *c, cu_ptr *p, const void *h) {
	cu_ipc_handle hh;
	for (int i = 0; i < 64; i++) hh.reserved[i] = ((const char *)h)[i];
	return c->ipc_open(p, hh, 1); // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
}
static int cu_ipc_close(kvb_cuda *c, cu_ptr p) { return c->ipc_close(p); }
static int cu_attr_int(kvb_cuda *c, int attr, cu_ptr p, unsigned int *v) { return c->pointer_attr(v, attr, p); }
static int cu_range(kvb_cuda *c, cu_ptr p, cu_ptr *base, size_t *n) { return c->address_range(base, n, p); }
static const char *cu_error_name(kvb_cuda *c, int r) {
	const char *s = NULL;
	if (c->error_name(r, &s) != 0 || s == NULL) return "CUDA_ERROR_UNKNOWN";
	return s;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	_ "github.com/kvbridge/kvbridge/internal/dl" // kvb_dl.h, the one dlopen loader (included by the C files)
)

// ErrNoDriver: libcuda.so.1 is absent or has no usable device.
var ErrNoDriver = errors.New("cuda: CUDA driver not available")

// CUDAError is a failed CUDA driver call.
type CUDAError struct {
	Call string
	Code int
	Name string // e.g. CUDA_ERROR_OUT_OF_MEMORY
}

func (e *CUDAError) Error() string { return fmt.Sprintf("cuda: %s: %s (%d)", e.Call, e.Name, e.Code) }

// DevicePtr is a CUDA device address.
type DevicePtr uint64

// IPCHandle is a CUDA IPC memory handle (64 opaque bytes).
type IPCHandle [64]byte

// Driver is the CUDA driver, loaded once per process.
type Driver struct {
	lib     *C.kvb_cuda
	version int
}

var driverOnce struct {
	sync.Mutex
	d    *Driver
	path string // what d was loaded from; or, with err, what failed
	err  error
}

// DriverPathFromEnv is the CUDA driver path $KVBRIDGE_CUDA_LIB names (""
// when unset), for a binary to pass to OpenDriver (nixl.Config.FromEnv
// reads it into Config.CUDALib). The package reads no environment
// variable of its own.
func DriverPathFromEnv() string { return os.Getenv("KVBRIDGE_CUDA_LIB") }

// OpenDriver loads the CUDA driver from path (empty: the driver this
// process already opened, else libcuda.so.1 from the loader's search path)
// and initialises it, once per process: a later call naming another path
// is refused. Without a driver it returns ErrNoDriver; it never crashes
// the process.
func OpenDriver(path string) (*Driver, error) {
	driverOnce.Lock()
	defer driverOnce.Unlock()
	switch {
	case driverOnce.d != nil && (path == "" || path == driverOnce.path):
		return driverOnce.d, nil
	case driverOnce.d != nil:
		return nil, fmt.Errorf("cuda: this process already loaded the CUDA driver from %s, not %s (one driver per process)", driverOnce.path, path)
	}
	if path == "" {
		path = "libcuda.so.1"
	}
	if driverOnce.err != nil && path == driverOnce.path {
		return nil, driverOnce.err
	}
	d, err := LoadDriver(path)
	if err != nil {
		driverOnce.path, driverOnce.err = path, err
		return nil, err
	}
	driverOnce.d, driverOnce.path, driverOnce.err = d, path, nil
	return d, nil
}

// LoadDriver loads and initialises the CUDA driver at path, without the
// process-wide caching of OpenDriver (for probes and tests).
func LoadDriver(path string) (*Driver, error) {
	// dlerror is per thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var errbuf [1024]C.char
	lib := C.kvb_cuda_load(cpath, &errbuf[0], C.size_t(len(errbuf)))
	if lib == nil {
		return nil, fmt.Errorf("%w: %s", ErrNoDriver, C.GoString(&errbuf[0]))
	}
	d := &Driver{lib: lib}
	if err := d.check("cuInit", C.cu_init(lib)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoDriver, err)
	}
	var v C.int
	if err := d.check("cuDriverGetVersion", C.cu_driver_version(lib, &v)); err != nil {
		return nil, err
	}
	d.version = int(v)
	return d, nil
}

func (d *Driver) check(call string, r C.int) error {
	if r == 0 {
		return nil
	}
	return &CUDAError{Call: call, Code: int(r), Name: C.GoString(C.cu_error_name(d.lib, r))}
}

// Version is the driver's CUDA version (e.g. 12040).
func (d *Driver) Version() int { return d.version }

// DeviceCount returns the number of CUDA devices.
func (d *Driver) DeviceCount() (int, error) {
	var n C.int
	err := d.check("cuDeviceGetCount", C.cu_device_count(d.lib, &n))
	return int(n), err
}

// Context is a device's primary context. CUDA contexts are per thread, so
// every call locks the goroutine to its thread and makes the context
// current first.
type Context struct {
	d       *Driver
	Ordinal int
	ctx     C.cu_context
}

// Primary retains device ordinal's primary context.
func (d *Driver) Primary(ordinal int) (*Context, error) {
	var ctx C.cu_context
	if err := d.check(fmt.Sprintf("cuDevicePrimaryCtxRetain(device %d)", ordinal), C.cu_primary(d.lib, C.int(ordinal), &ctx)); err != nil {
		return nil, err
	}
	return &Context{d: d, Ordinal: ordinal, ctx: ctx}, nil
}

// Release releases the primary context.
func (c *Context) Release() error {
	return c.d.check("cuDevicePrimaryCtxRelease", C.cu_primary_release(c.d.lib, C.int(c.Ordinal)))
}

// on runs f with the context current on a locked thread.
func (c *Context) on(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.d.check("cuCtxSetCurrent", C.cu_set(c.d.lib, c.ctx)); err != nil {
		return err
	}
	return f()
}

// Alloc allocates n bytes of device memory.
func (c *Context) Alloc(n uint64) (DevicePtr, error) {
	var p C.cu_ptr
	err := c.on(func() error { return c.d.check(fmt.Sprintf("cuMemAlloc(%d)", n), C.cu_alloc(c.d.lib, &p, C.size_t(n))) })
	return DevicePtr(p), err
}

// Free frees device memory.
func (c *Context) Free(p DevicePtr) error {
	return c.on(func() error { return c.d.check("cuMemFree", C.cu_free(c.d.lib, C.cu_ptr(p))) })
}

func hostAddr(b []byte) C.uintptr_t {
	if len(b) == 0 {
		return 0
	}
	return C.uintptr_t(uintptr(unsafe.Pointer(&b[0])))
}

// CopyHtoD copies host bytes to device memory (synchronous).
func (c *Context) CopyHtoD(dst DevicePtr, src []byte) error {
	var pin runtime.Pinner
	defer pin.Unpin()
	if len(src) > 0 {
		pin.Pin(&src[0])
	}
	return c.on(func() error {
		return c.d.check("cuMemcpyHtoD", C.cu_htod(c.d.lib, C.cu_ptr(dst), hostAddr(src), C.size_t(len(src))))
	})
}

// CopyDtoH copies device memory to host bytes (synchronous).
func (c *Context) CopyDtoH(dst []byte, src DevicePtr) error {
	var pin runtime.Pinner
	defer pin.Unpin()
	if len(dst) > 0 {
		pin.Pin(&dst[0])
	}
	return c.on(func() error {
		return c.d.check("cuMemcpyDtoH", C.cu_dtoh(c.d.lib, hostAddr(dst), C.cu_ptr(src), C.size_t(len(dst))))
	})
}

// CopyDtoD copies between device buffers (synchronous).
func (c *Context) CopyDtoD(dst, src DevicePtr, n uint64) error {
	return c.on(func() error {
		return c.d.check("cuMemcpyDtoD", C.cu_dtod(c.d.lib, C.cu_ptr(dst), C.cu_ptr(src), C.size_t(n)))
	})
}

// Copy copies between any two addresses under unified addressing (host or
// device, inferred from the pointers), synchronously.
func (c *Context) Copy(dst, src uintptr, n uint64) error {
	return c.on(func() error {
		return c.d.check("cuMemcpy", C.cu_copy(c.d.lib, C.cu_ptr(dst), C.cu_ptr(src), C.size_t(n)))
	})
}

// Stream is a CUDA stream of one context.
type Stream struct {
	c *Context
	s C.cu_stream
}

// NewStream creates a non-blocking stream.
func (c *Context) NewStream() (*Stream, error) {
	var s C.cu_stream
	err := c.on(func() error { return c.d.check("cuStreamCreate", C.cu_stream_create(c.d.lib, &s)) })
	if err != nil {
		return nil, err
	}
	return &Stream{c: c, s: s}, nil
}

// CopyAsync queues a unified-addressing copy on the stream.
func (s *Stream) CopyAsync(dst, src uintptr, n uint64) error {
	return s.c.on(func() error {
		return s.c.d.check("cuMemcpyAsync", C.cu_copy_async(s.c.d.lib, C.cu_ptr(dst), C.cu_ptr(src), C.size_t(n), s.s))
	})
}

// CopyBatchAsync queues many unified-addressing copies (dst[i] ← src[i],
// n[i] bytes) in one call.
func (s *Stream) CopyBatchAsync(dst, src []uintptr, n []uint64) error {
	if len(dst) == 0 {
		return nil
	}
	buf := (*C.uint64_t)(C.malloc(C.size_t(24 * len(dst))))
	defer C.free(unsafe.Pointer(buf))
	all := unsafe.Slice(buf, 3*len(dst))
	for i := range dst {
		all[i], all[len(dst)+i], all[2*len(dst)+i] = C.uint64_t(dst[i]), C.uint64_t(src[i]), C.uint64_t(n[i])
	}
	return s.c.on(func() error {
		var failed C.int
		r := C.cu_copy_batch_async(s.c.d.lib, &all[0], &all[len(dst)], &all[2*len(dst)], C.int(len(dst)), s.s, &failed)
		if r != 0 {
			return s.c.d.check(fmt.Sprintf("cuMemcpyAsync(copy %d of %d)", int(failed), len(dst)), r)
		}
		return nil
	})
}

// CopyDtoDAsync queues a device-to-device copy.
func (s *Stream) CopyDtoDAsync(dst, src DevicePtr, n uint64) error {
	return s.c.on(func() error {
		return s.c.d.check("cuMemcpyDtoDAsync", C.cu_dtod_async(s.c.d.lib, C.cu_ptr(dst), C.cu_ptr(src), C.size_t(n), s.s))
	})
}

// CopyHtoDAsync queues a host-to-device copy; src must stay untouched (and,
// if Go memory, pinned) until Sync.
func (s *Stream) CopyHtoDAsync(dst DevicePtr, src uintptr, n uint64) error {
	return s.c.on(func() error {
		return s.c.d.check("cuMemcpyHtoDAsync", C.cu_htod_async(s.c.d.lib, C.cu_ptr(dst), C.uintptr_t(src), C.size_t(n), s.s))
	})
}

// CopyDtoHAsync queues a device-to-host copy into dst (see CopyHtoDAsync).
func (s *Stream) CopyDtoHAsync(dst uintptr, src DevicePtr, n uint64) error {
	return s.c.on(func() error {
		return s.c.d.check("cuMemcpyDtoHAsync", C.cu_dtoh_async(s.c.d.lib, C.uintptr_t(dst), C.cu_ptr(src), C.size_t(n), s.s))
	})
}

// Sync waits for everything queued on the stream.
func (s *Stream) Sync() error {
	return s.c.on(func() error { return s.c.d.check("cuStreamSynchronize", C.cu_stream_sync(s.c.d.lib, s.s)) })
}

// Destroy destroys the stream.
func (s *Stream) Destroy() error {
	return s.c.on(func() error { return s.c.d.check("cuStreamDestroy", C.cu_stream_destroy(s.c.d.lib, s.s)) })
}

// IPCHandle exports the allocation holding p to other processes.
func (c *Context) IPCHandle(p DevicePtr) (IPCHandle, error) {
	var h IPCHandle
	hp := C.malloc(64)
	defer C.free(hp)
	err := c.on(func() error { return c.d.check("cuIpcGetMemHandle", C.cu_ipc_get(c.d.lib, hp, C.cu_ptr(p))) })
	copy(h[:], C.GoBytes(hp, 64))
	return h, err
}

// IPCOpen maps another process's allocation; it returns the allocation's
// base address in this process.
func (c *Context) IPCOpen(h IPCHandle) (DevicePtr, error) {
	var p C.cu_ptr
	hp := C.CBytes(h[:])
	defer C.free(hp)
	err := c.on(func() error { return c.d.check("cuIpcOpenMemHandle", C.cu_ipc_open(c.d.lib, &p, hp)) })
	return DevicePtr(p), err
}

// IPCClose unmaps an allocation opened with IPCOpen.
func (c *Context) IPCClose(p DevicePtr) error {
	return c.on(func() error { return c.d.check("cuIpcCloseMemHandle", C.cu_ipc_close(c.d.lib, C.cu_ptr(p))) })
}

// AddressRange returns the allocation that contains p.
func (c *Context) AddressRange(p DevicePtr) (base DevicePtr, size uint64, err error) {
	var b C.cu_ptr
	var n C.size_t
	err = c.on(func() error { return c.d.check("cuMemGetAddressRange", C.cu_range(c.d.lib, C.cu_ptr(p), &b, &n)) })
	return DevicePtr(b), uint64(n), err
}

// PointerInfo says whether p is device memory and on which device.
func (c *Context) PointerInfo(p DevicePtr) (device bool, ordinal int, err error) {
	var mt, ord C.uint
	err = c.on(func() error {
		if err := c.d.check("cuPointerGetAttribute(MEMORY_TYPE)", C.cu_attr_int(c.d.lib, C.KVB_CU_MEMTYPE_ATTR, C.cu_ptr(p), &mt)); err != nil {
			return err
		}
		return c.d.check("cuPointerGetAttribute(DEVICE_ORDINAL)", C.cu_attr_int(c.d.lib, C.KVB_CU_ORDINAL_ATTR, C.cu_ptr(p), &ord))
	})
	return mt == 2, int(ord), err // CU_MEMORYTYPE_DEVICE
}
