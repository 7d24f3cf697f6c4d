package main

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kvbridge/kvbridge/internal/cpustat"
	"github.com/kvbridge/kvbridge/internal/cuda"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/transfer"
)

// -mem VRAM: the ranks' KV memory is device memory of device 0, allocated
// through the gpu package (both ranks in this process, on the same
// device), and every figure's reference is cuMemcpyDtoD between two
// buffers of that device in the same run. Without a GPU the run is refused
// with the reason, unless the CUDA driver double is loaded
// (KVBRIDGE_CUDA_LIB, as gpucheck's tests and kvbench's do): then the same
// code runs on host memory standing in for the device, which tests the
// paths, not a GPU. kvbench never reads device memory as host memory: it
// goes through cuMemcpyHtoD / DtoH.

// vramModes are the modes -mem VRAM measures: the ones that move KV memory
// between two ranks' registered regions.
var vramModes = []string{"engine", "paged", "rooms", "digest"}

// openGPU retains device 0's primary context, or says in one line why
// there is none.
func openGPU() (*cuda.Context, error) {
	drv, err := cuda.OpenDriver(cuda.DriverPathFromEnv())
	if err != nil {
		return nil, err
	}
	n, err := drv.DeviceCount()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, errors.New("the CUDA driver sees no device")
	}
	return drv.Primary(0)
}

// setMem parses -mem for mode; for VRAM it opens the device. The returned
// code is the exit status of a refusal (0: go on).
func (b *bench) setMem(mem, mode string) (int, error) {
	switch mem {
	case "DRAM":
		b.mem = nixl.DRAM
		return 0, nil
	case "VRAM":
	default:
		return 2, fmt.Errorf("memory kind %q: DRAM or VRAM", mem)
	}
	if mode != "all" && !slices.Contains(vramModes, mode) {
		return 2, fmt.Errorf("-mode %s does not measure KV memory moved between ranks; -mem VRAM applies to %s", mode, strings.Join(vramModes, ", "))
	}
	ctx, err := openGPU()
	if err != nil {
		return 1, fmt.Errorf("-mem VRAM needs a GPU (or the CUDA driver double in KVBRIDGE_CUDA_LIB): %s",
			strings.ReplaceAll(err.Error(), "\n", " "))
	}
	b.mem, b.gpu = nixl.VRAM, ctx
	return 0, nil
}

// kvBuf is one buffer of KV memory of the run's kind, registered with an
// agent: host is the buffer itself for DRAM, nil for VRAM.
type kvBuf struct {
	nixl.Desc
	host []byte
}

// allocKV allocates size bytes of b.mem's kind and registers them with a.
// VRAM is freed by freeVRAM, once the agents that registered it are
// closed.
func (b *bench) allocKV(a *nixl.Agent, size uint64) (kvBuf, error) {
	if b.mem == nixl.DRAM {
		_, buf, err := a.Alloc(size)
		return kvBuf{Desc: nixl.BytesDesc(buf), host: buf}, err
	}
	p, err := b.devAlloc(size)
	if err != nil {
		return kvBuf{}, err
	}
	k := kvBuf{Desc: nixl.Desc{Addr: uintptr(p), Len: size, Dev: uint64(b.gpu.Ordinal)}}
	_, err = a.Register(nixl.VRAM, []nixl.Desc{k.Desc})
	return k, err
}

func (b *bench) devAlloc(size uint64) (cuda.DevicePtr, error) {
	p, err := b.gpu.Alloc(size)
	if err != nil {
		return 0, fmt.Errorf("allocating %d MiB of device memory: %w", size>>20, err)
	}
	b.vram = append(b.vram, p)
	return p, nil
}

// freeVRAM frees the device memory allocKV and cluster allocated.
func (b *bench) freeVRAM() {
	for _, p := range b.vram {
		b.gpu.Free(p)
	}
	b.vram = nil
}

func (b *bench) put(k kvBuf, data []byte) error {
	if k.host != nil {
		copy(k.host, data)
		return nil
	}
	return b.gpu.CopyHtoD(cuda.DevicePtr(k.Addr), data)
}

// check says whether k holds want.
func (b *bench) check(k kvBuf, want []byte) error {
	got := k.host
	if got == nil {
		got = make([]byte, len(want))
		if err := b.gpu.CopyDtoH(got, cuda.DevicePtr(k.Addr)); err != nil {
			return err
		}
	}
	if !bytes.Equal(got[:len(want)], want) {
		return fmt.Errorf("the target's %s does not hold what was written", b.mem)
	}
	return nil
}

// dtodGBps is -mem VRAM's reference: cuMemcpyDtoD of size bytes between
// two buffers of the device, iters times (after one untimed): GB/s and
// this process's CPU s/GB. A 1-byte cuMemcpyDtoH after the copies waits
// for them, since a device-to-device copy may return before it is done.
func (b *bench) dtodGBps(size uint64, iters int) (float64, float64, error) {
	src, err := b.devAlloc(size)
	if err != nil {
		return 0, 0, err
	}
	dst, err := b.devAlloc(size)
	if err != nil {
		return 0, 0, err
	}
	var one [1]byte
	copies := func(n int) error {
		for i := 0; i < n; i++ {
			if err := b.gpu.CopyDtoD(dst, src, size); err != nil {
				return err
			}
		}
		return b.gpu.CopyDtoH(one[:], dst)
	}
	if err := copies(1); err != nil {
		return 0, 0, err
	}
	wall, cpu, err := cpuOver(func() error { return copies(iters) })
	if err != nil {
		return 0, 0, err
	}
	bytes := float64(size) * float64(iters)
	return bytes / wall.Seconds() / 1e9, cpustat.PerGB(cpu, bytes), nil
}

// vramRegions allocates the device memory of a rank's KV regions (one
// allocation, cut into the layout's regions, each followed by its
// ownership proof slot).
func (b *bench) vramRegions(regions []nixl.Desc) error {
	var total uint64
	for _, r := range regions {
		total += r.Len + transfer.ProofBytes
	}
	p, err := b.devAlloc(total)
	if err != nil {
		return err
	}
	off := uintptr(p)
	for i := range regions {
		regions[i].Addr, regions[i].Dev = off, uint64(b.gpu.Ordinal)
		off += uintptr(regions[i].Len + transfer.ProofBytes)
	}
	return nil
}

// addDtoD adds the cuMemcpyDtoD reference of size bytes to r (-mem VRAM).
func (b *bench) addDtoD(r *Row, size uint64, iters int) error {
	if b.mem != nixl.VRAM {
		return nil
	}
	v, cpu, err := b.dtodGBps(size, iters)
	if err != nil {
		return err
	}
	r.References["cuMemcpyDtoD"] = v
	if r.RefCPU == nil {
		r.RefCPU = map[string]float64{}
	}
	r.RefCPU["cuMemcpyDtoD"] = cpu
	return nil
}

// memSuffix marks the rows of a -mem VRAM run.
func (b *bench) memSuffix() string {
	if b.mem == nixl.VRAM {
		return " VRAM"
	}
	return ""
}
