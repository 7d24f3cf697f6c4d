package cuda

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestCRC32CGroups: the digest kernel's sums of groups of pieces of device
// memory are the CRC-32C (Castagnoli) of their bytes, in order: on the
// CUDA double (its C equivalent of the kernel, as the launch's threads
// cover the groups) and, where there is one, on a GPU (the PTX itself).
// 300 groups take three blocks of 128 threads; groups of no piece, pieces
// of no byte, pieces out of order and crossing each other are summed as
// they come; the check value of "123456789" is e3069283.
func TestCRC32CGroups(t *testing.T) {
	driverCases(t, func(t *testing.T, d *Driver, _ bool) {
		c, err := d.Primary(0)
		require.NoError(t, err)
		defer c.Release()
		const n = 1 << 20
		dev, err := c.Alloc(n)
		require.NoError(t, err)
		defer c.Free(dev)
		host := make([]byte, n)
		r := rand.New(rand.NewPCG(52, 1))
		for i := range host {
			host[i] = byte(r.Uint32())
		}
		copy(host, "123456789")
		require.NoError(t, c.CopyHtoD(dev, host))

		table := crc32.MakeTable(crc32.Castagnoli)
		pieces, ends := []uint64{uint64(dev), 9}, []int{1}
		want := []uint32{0xe3069283}
		for g := 1; g < 300; g++ {
			sum := crc32.Update(0, table, nil)
			for range r.IntN(5) { // 0 … 4 pieces, some of no byte
				off, l := r.IntN(n-4096), r.IntN(4096)
				if r.IntN(6) == 0 {
					l = 0
				}
				pieces = append(pieces, uint64(dev)+uint64(off), uint64(l))
				sum = crc32.Update(sum, table, host[off:off+l])
			}
			ends = append(ends, len(pieces)/2)
			want = append(want, sum)
		}
		got, err := c.CRC32CGroups(pieces, ends, []uint32{7})
		require.NoError(t, err)
		require.Equal(t, uint32(7), got[0], "appended to out")
		require.Equal(t, want, got[1:], "the kernel's sums")

		_, err = c.CRC32CGroups(pieces[:3], []int{1}, nil)
		require.ErrorContains(t, err, "want address and length pairs")
		_, err = c.CRC32CGroups(pieces, []int{2, 1}, nil)
		require.ErrorContains(t, err, "group 1 ends at piece 1 (after 2")
		none, err := c.CRC32CGroups(nil, nil, nil)
		require.NoError(t, err)
		require.Empty(t, none, "no groups, no launch")
	})
}

// TestCRC32CGroupsOutsideDeviceMemory: on the double, a piece outside the
// device memory allocated there fails the launch as a GPU's fault does
// (CUDA_ERROR_ILLEGAL_ADDRESS), an error naming the kernel, not a crash.
func TestCRC32CGroupsOutsideDeviceMemory(t *testing.T) {
	d, err := LoadDriver(doubleLib)
	require.NoError(t, err)
	c, err := d.Primary(0)
	require.NoError(t, err)
	defer c.Release()
	host := make([]byte, 64)
	_, err = c.CRC32CGroups([]uint64{uint64(unsafePointer(host)), 64}, []int{1}, nil)
	require.ErrorContains(t, err, "cuLaunchKernel(kvb_crc32c_groups, 1 groups)")
	require.ErrorContains(t, err, "CUDA_ERROR_ILLEGAL_ADDRESS")
}

func unsafePointer(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// TestCRC32CGroupsAfterAFailedLoad (the double): a load of the kernel that
// fails for a passing reason (out of memory while the driver compiles it)
// is tried again at the next sum, not kept: the sum fails, then succeeds.
func TestCRC32CGroupsAfterAFailedLoad(t *testing.T) {
	d, err := LoadDriver(doubleLib) // (its own driver handle: a kernel not loaded yet)
	require.NoError(t, err)
	c, err := d.Primary(0)
	require.NoError(t, err)
	defer c.Release()
	dev, err := c.Alloc(64)
	require.NoError(t, err)
	defer c.Free(dev)
	t.Setenv("KVB_CUDA_DOUBLE_FAIL", "cuModuleLoadData")
	_, err = c.CRC32CGroups([]uint64{uint64(dev), 64}, []int{1}, nil)
	require.ErrorContains(t, err, "cuModuleLoadData (the digest kernel)")
	require.ErrorContains(t, err, "CUDA_ERROR_OUT_OF_MEMORY")
	t.Setenv("KVB_CUDA_DOUBLE_FAIL", "")
	sums, err := c.CRC32CGroups([]uint64{uint64(dev), 64}, []int{1}, nil)
	require.NoError(t, err, "the load tried again")
	require.Len(t, sums, 1)
}
