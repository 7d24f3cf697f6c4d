// Package cuda drives the CUDA driver, loaded at run time, for the
// engines' VRAM paths, the ownership proof's read of device memory, the
// examples and the benchmarks. It is internal (issue 50): an engine brings
// its own CUDA runtime and hands kvbridge addresses (transfer.Desc) and,
// for a layer-wise send, its own event query (transfer.Ready). Nothing in
// it is required: everything builds and runs without a GPU, a driver or
// the CUDA toolkit.
//
// OpenDriver loads libcuda.so.1, or the path it is given (a binary passes
// DriverPathFromEnv: $KVBRIDGE_CUDA_LIB; the package reads no environment
// variable of its own), once per process: primary contexts, device memory,
// copies (sync and on streams), events (Stream.Record; Event.Query, and
// Event.Ready, a readiness hook of transfer.Ready's type), CUDA IPC
// handles, pointer attributes. Every failure is a *CUDAError naming the
// call; without a driver, ErrNoDriver.
//
// Usage:
//
//	drv, err := cuda.OpenDriver("")      // a binary: cuda.OpenDriver(cuda.DriverPathFromEnv())
//	ctx, err := drv.Primary(0)
//	p, err := ctx.Alloc(1 << 30)
//	h, err := ctx.IPCHandle(p)           // another process: ctx.IPCOpen(h)
package cuda
