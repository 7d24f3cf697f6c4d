// Package gpu finds the node's GPUs and drives the CUDA driver, for the
// examples, the benchmarks and the engines' VRAM paths. Nothing in it is
// required: everything builds and runs without a GPU, a driver or the CUDA
// toolkit.
//
//   - Package gpu/discover lists GPUs through NVML (github.com/NVIDIA/go-nvml):
//     UUID, name, memory, PCI bus id, NUMA node, NVLink peers.
//   - OpenDriver loads libcuda.so.1 at run time, or the path it is given (a
//     binary passes DriverPathFromEnv: $KVBRIDGE_CUDA_LIB; the package
//     reads no environment variable of its own), once per process: primary
//     contexts, device memory, copies (sync and on streams), events
//     (Stream.Record; Event.Query, and Event.Ready, the readiness hook a
//     layer-wise sender polls before posting a layer a kernel wrote), CUDA
//     IPC handles, pointer attributes. Every failure is a *CUDAError naming
//     the call; without a driver, ErrNoDriver.
//
// Usage:
//
//	devs, err := discover.Discover()     // errors.Is(err, discover.ErrNoGPU) on CPU nodes
//	drv, err := gpu.OpenDriver("")       // a binary: gpu.OpenDriver(gpu.DriverPathFromEnv())
//	ctx, err := drv.Primary(0)
//	p, err := ctx.Alloc(1 << 30)
//	h, err := ctx.IPCHandle(p)           // another process: ctx.IPCOpen(h)
package gpu
