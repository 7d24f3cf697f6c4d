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
// of the CUDA double (its device 0, each region followed by its proof
// slot), freed once the ranks are closed. The double's device memory is
// host memory, so the cluster's pKV and dKV read it in place (on a GPU
// they could not).
func vramCluster(t *testing.T, engine string, mut func(*kvmanager.Config)) *cluster {
	t.Helper()
	lib := cudaDoubleLib(t)
	drv, err := cuda.OpenDriver(lib)
	require.NoError(t, err)
	gpu, err := drv.Primary(0)
	require.NoError(t, err)
	var mu sync.Mutex
	var regions [2][][]byte
	t.Cleanup(func() { gpu.Release() }) // (after the ranks close: cleanups run last first)
	c := newCluster(t, engine, func(cfg *kvmanager.Config) {
		cfg.Engine.CUDALib = lib
		cfg.Layout.Kind = transfer.VRAM
		for i := range cfg.Layout.Regions {
			r := &cfg.Layout.Regions[i]
			p, err := gpu.Alloc(r.Len + transfer.ProofBytes)
			require.NoError(t, err)
			t.Cleanup(func() { gpu.Free(p) })
			r.Addr, r.Dev = uintptr(p), 0
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
// VRAM (the CUDA double's), on every engine that moves it (not a real
// NIXL: it cannot move the double's memory), pushed and pulled: rooms of
// every size succeed with their digests summed on the devices — by the
// digest kernel, launched (the double counts its launches) — and checked;
// a bit flipped in flight (in device memory) fails that room corrupt,
// naming the page, layers and prefill rank, counted; the next succeeds.
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
			before, err := cudadouble.Launches(cudaDouble.lib)
			require.NoError(t, err)
			for i, tokens := range []int{1, 17, 1000} {
				c.roomByteExact(t, uint64(100+i), tokens, 64)
			}
			require.Zero(t, counter(c.decode.Manager, "kvbridge_digest_mismatches_total"))
			checked := counter(c.decode.Manager, "kvbridge_digest_pages_checked_total")
			require.NotZero(t, checked, "pages checked by digest")
			after, err := cudadouble.Launches(cudaDouble.lib)
			require.NoError(t, err)
			// Each chunk's sums on both ranks: at least one launch a side.
			require.GreaterOrEqual(t, after-before, int64(2*3), "digest kernels launched for 3 rooms on both ranks")

			if pull {
				rawagent.Of(c.decode).CorruptReads(1, pageBytes)
			} else {
				rawagent.Of(c.prefill).CorruptWrites(1)
			}
			rm := c.start(t, 200, 64*pageToks)
			ready(t, rm.s)
			c.sendAll(t, rm, 64)
			waitStatus(t, rm.r, kvmanager.Failed)
			select {
			case <-rm.r.Released():
			case <-ctx(t).Done():
				t.Fatal("the corrupted room's pages never released")
			}
			rep, ok := rm.r.Report()
			require.True(t, ok, "the corrupted room's load report")
			require.Equal(t, kvmanager.CodeCorrupt, rep.Code, "code: %s", rep.Reason)
			require.Contains(t, rep.Reason, c.prefill.Endpoint(), "the failure names the prefill rank")
			require.Regexp(t, `position \d+ \(decode page \d+\), layers 0–\d+: CRC-32C [0-9a-f]{8}, the prefill rank's digest [0-9a-f]{8}`, rep.Reason)
			require.EqualValues(t, 1, counter(c.decode.Manager, "kvbridge_digest_mismatches_total"))
			rm.s.Clear()
			rm.r.Clear()
			c.roomByteExact(t, 201, 100, 64)
		})
	}
}
