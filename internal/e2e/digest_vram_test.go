package e2e

import (
	"os"
	"sync"
	"testing"

	"github.com/kvbridge/kvbridge/internal/cuda"
	"github.com/kvbridge/kvbridge/internal/cudadouble"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/rawagent"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/require"
)

// cudaDouble is the CUDA driver double this test binary loads, built once
// (the driver is the process's: cuda.OpenDriver takes one path); testMain
// removes its directory.
var cudaDouble struct {
	once     sync.Once
	dir, lib string
	err      error
}

func cudaDoubleLib(t *testing.T) string {
	t.Helper()
	cudaDouble.once.Do(func() {
		if cudaDouble.dir, cudaDouble.err = os.MkdirTemp("", "kvbridge-e2e-cuda-double"); cudaDouble.err == nil {
			cudaDouble.lib, cudaDouble.err = cudadouble.Build(cudaDouble.dir)
		}
	})
	require.NoError(t, cudaDouble.err, "building the CUDA double")
	return cudaDouble.lib
}

// vramCluster is newCluster with both ranks' KV regions in device memory
// of the CUDA double — the prefill rank's on its device 0, the decode
// rank's on 1, each region followed by its proof slot —, freed once the
// ranks are closed. The double's device memory is host memory, so the
// cluster's pKV and dKV read it in place (on a GPU they could not).
func vramCluster(t *testing.T, engine string, mut func(*kvmanager.Config)) *cluster {
	t.Helper()
	lib := cudaDoubleLib(t)
	drv, err := cuda.OpenDriver(lib)
	require.NoError(t, err)
	// Two devices: the prefill rank's KV on device 0, the decode rank's on 1.
	require.NoError(t, cudadouble.SetDevices(lib, 2))
	var gpus [2]*cuda.Context
	for dev := range gpus {
		gpus[dev], err = drv.Primary(dev)
		require.NoError(t, err)
		t.Cleanup(func() { gpus[dev].Release() }) // (after the ranks close: cleanups run last first)
	}
	var mu sync.Mutex
	var regions [2][][]byte
	c := newCluster(t, engine, func(cfg *kvmanager.Config) {
		cfg.Engine.CUDALib = lib
		cfg.Layout.Kind = transfer.VRAM
		dev := int(cfg.Role - 1) // prefill 0, decode 1
		gpu := gpus[dev]
		for i := range cfg.Layout.Regions {
			r := &cfg.Layout.Regions[i]
			p, err := gpu.Alloc(r.Len + transfer.ProofBytes)
			require.NoError(t, err)
			t.Cleanup(func() { gpu.Free(p) })
			r.Addr, r.Dev = uintptr(p), uint64(dev)
			mu.Lock()
			regions[cfg.Role-1] = append(regions[cfg.Role-1], nixl.HostBytes(*r))
			mu.Unlock()
		}
		mut(cfg)
	})
	c.pKV, c.dKV = regions[kvmanager.RolePrefill-1], regions[kvmanager.RoleDecode-1]
	for r, region := range c.pKV {
		for p := 0; p < pages; p++ {
			fillPage(region[p*pageBytes:(p+1)*pageBytes], uint64(r)<<32|uint64(p))
		}
	}
	return c
}

// TestDigestOverVRAM: TestDigestFailsAFlippedByte with both ranks' KV in
// VRAM (the CUDA double's, each rank's on its own device), on every
// engine that moves it (not a real NIXL: it cannot move the double's
// memory), pushed and pulled: rooms of every size succeed with their
// digests summed on each rank's device — by the digest kernel, launched
// there (the double counts launches a device; its device memory is host
// memory, so a host sum would pass everything else) — and checked; a bit
// flipped in flight (in device memory) fails that room corrupt, naming
// the page, layers and prefill rank, counted; the next succeeds. Then
// the decode rank's own launches fail: the room fails, not corrupt — the
// failure is the decode rank's, not the prefill rank's bytes —, counted
// in kvbridge_digest_errors_total, naming the error.
func TestDigestOverVRAM(t *testing.T) {
	for key, pull := range modes() {
		t.Run(key, func(t *testing.T) {
			engine, _ := splitMode(key)
			if engine == "libnixl-real" {
				t.Skip("a real NIXL cannot move the CUDA double's memory")
			}
			c := vramCluster(t, engine, func(cfg *kvmanager.Config) {
				cfg.Digest = cfg.Role == kvmanager.RoleDecode
				cfg.Pull = pull && cfg.Role == kvmanager.RoleDecode
			})
			launches := func() (n [2]int64) {
				for dev := range n {
					var err error
					n[dev], err = cudadouble.Launches(cudaDouble.lib, dev)
					require.NoError(t, err)
				}
				return n
			}
			before := launches()
			for i, tokens := range []int{1, 17, 1000} {
				c.roomByteExact(t, uint64(100+i), tokens, 64)
			}
			require.Zero(t, counter(c.decode.Manager, "kvbridge_digest_mismatches_total"))
			checked := counter(c.decode.Manager, "kvbridge_digest_pages_checked_total")
			require.NotZero(t, checked, "pages checked by digest")
			after := launches()
			// Each room's sums on each rank's device: a launch a room at least.
			require.GreaterOrEqual(t, after[0]-before[0], int64(3), "the prefill rank's digest kernels (device 0) for 3 rooms")
			require.GreaterOrEqual(t, after[1]-before[1], int64(3), "the decode rank's digest kernels (device 1) for 3 rooms")

			if pull {
				rawagent.Of(c.decode).CorruptReads(1, pageBytes)
			} else {
				rawagent.Of(c.prefill).CorruptWrites(1)
			}
			rm, rep := c.failedRoom(t, 200, 64*pageToks)
			require.Equal(t, kvmanager.CodeCorrupt, rep.Code, "code: %s", rep.Reason)
			require.Contains(t, rep.Reason, c.prefill.Endpoint(), "the failure names the prefill rank")
			require.Regexp(t, `position \d+ \(decode page \d+\), layers 0–\d+: CRC-32C [0-9a-f]{8}, the prefill rank's digest [0-9a-f]{8}`, rep.Reason)
			require.EqualValues(t, 1, counter(c.decode.Manager, "kvbridge_digest_mismatches_total"))
			rm.s.Clear()
			rm.r.Clear()
			c.roomByteExact(t, 201, 100, 64)

			require.NoError(t, cudadouble.FailLaunchesOn(cudaDouble.lib, 1)) // the decode rank's device
			t.Cleanup(func() { cudadouble.FailLaunchesOn(cudaDouble.lib, -1) })
			rm, rep = c.failedRoom(t, 202, 64*pageToks)
			require.Equal(t, kvmanager.CodeFailed, rep.Code, "a failure to sum here is not the prefill rank's corruption: %s", rep.Reason)
			require.Contains(t, rep.Reason, "this decode rank could not sum its")
			require.Contains(t, rep.Reason, "CUDA_ERROR_LAUNCH_FAILED")
			require.EqualValues(t, 1, counter(c.decode.Manager, "kvbridge_digest_mismatches_total"), "no mismatch counted")
			require.NotZero(t, counter(c.decode.Manager, "kvbridge_digest_errors_total"))
			rm.s.Clear()
			rm.r.Clear()
		})
	}
}
