package cuda

import (
	"bytes"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNoDriver(t *testing.T) {
	_, err := LoadDriver("/nonexistent/libcuda.so.1")
	require.ErrorIs(t, err, ErrNoDriver, "missing driver")
	require.ErrorContains(t, err, "libcuda.so.1", "missing driver")
	t.Setenv("KVB_CUDA_DOUBLE_DEVICES", "0")
	_, err = LoadDriver(doubleLib)
	var ce *CUDAError
	require.ErrorIs(t, err, ErrNoDriver, "driver without devices")
	require.ErrorAs(t, err, &ce, "driver without devices")
	require.Equal(t, "CUDA_ERROR_NO_DEVICE", ce.Name, "driver without devices: %v", err)
	require.Equal(t, "cuInit", ce.Call, "driver without devices: %v", err)
}

// TestLoadDriverNamesMissingSymbol: a library that is not the CUDA driver
// (here the C library) is refused by the shared loader (internal/dl),
// naming the library and the first symbol of the table it lacks.
func TestLoadDriverNamesMissingSymbol(t *testing.T) {
	_, err := LoadDriver("libc.so.6")
	require.ErrorIs(t, err, ErrNoDriver, "a library without the driver's symbols")
	require.ErrorContains(t, err, "libc.so.6: missing symbol cuInit", "a library without the driver's symbols")
}

// driverCases runs a test body on the CUDA double and, where one exists, on
// the real driver (reported as skipped, with the reason, where none is).
func driverCases(t *testing.T, body func(t *testing.T, d *Driver, double bool)) {
	t.Run("double", func(t *testing.T) {
		d, err := LoadDriver(doubleLib)
		require.NoError(t, err)
		body(t, d, true)
	})
	t.Run("real", func(t *testing.T) {
		d, err := LoadDriver("libcuda.so.1")
		if err != nil {
			t.Skipf("no GPU here: %v", err)
		}
		body(t, d, false)
	})
}

func TestDriverMemoryAndCopies(t *testing.T) {
	driverCases(t, func(t *testing.T, d *Driver, _ bool) {
		devices, err := d.DeviceCount()
		require.NoError(t, err, "devices")
		require.GreaterOrEqual(t, devices, 1, "devices")
		c, err := d.Primary(0)
		require.NoError(t, err)
		defer c.Release()
		const n = 1 << 20
		a, err := c.Alloc(n)
		require.NoError(t, err)
		defer c.Free(a)
		b, _ := c.Alloc(n)
		defer c.Free(b)
		src := bytes.Repeat([]byte("kvbridge"), n/8)
		require.NoError(t, c.CopyHtoD(a, src))
		require.NoError(t, c.CopyDtoD(b, a, n))
		got := make([]byte, n)
		require.NoError(t, c.CopyDtoH(got, b), "round trip through the device")
		require.Equal(t, src, got, "round trip through the device")
		s, err := c.NewStream()
		require.NoError(t, err)
		defer s.Destroy()
		require.NoError(t, s.CopyDtoDAsync(b+4096, a, 4096))
		require.NoError(t, s.CopyAsync(uintptr(a)+8192, uintptr(a), 8))
		require.NoError(t, s.Sync())
		dev, ord, err := c.PointerInfo(a + 100)
		require.NoError(t, err, "pointer info")
		require.True(t, dev, "pointer info: device")
		require.Zero(t, ord, "pointer info: ordinal")
		base, size, err := c.AddressRange(a + 100)
		require.NoError(t, err, "address range")
		require.Equal(t, a, base, "address range: base")
		require.GreaterOrEqual(t, size, uint64(n), "address range: size")
		_, err = c.IPCHandle(a)
		require.NoError(t, err)
	})
}

func TestDriverErrorsNameTheCall(t *testing.T) {
	d, err := LoadDriver(doubleLib)
	require.NoError(t, err)
	c, _ := d.Primary(0)
	t.Setenv("KVB_CUDA_DOUBLE_FAIL", "cuMemAlloc_v2")
	_, err = c.Alloc(1 << 40)
	var ce *CUDAError
	require.ErrorAs(t, err, &ce, "alloc failure")
	require.True(t, strings.HasPrefix(ce.Call, "cuMemAlloc"), "alloc failure: %v", err)
	require.Equal(t, "CUDA_ERROR_OUT_OF_MEMORY", ce.Name, "alloc failure: %v", err)
	os.Unsetenv("KVB_CUDA_DOUBLE_FAIL")
	_, err = d.Primary(7)
	require.ErrorAs(t, err, &ce, "bad ordinal")
	require.Equal(t, "CUDA_ERROR_INVALID_DEVICE", ce.Name, "bad ordinal: %v", err)
	p, _ := c.Alloc(64)
	h, _ := c.IPCHandle(p)
	_, err = c.IPCOpen(h)
	require.ErrorAs(t, err, &ce, "IPC open in the exporting process must fail as in CUDA")
	require.Equal(t, "cuIpcOpenMemHandle", ce.Call, "IPC open in the exporting process must fail as in CUDA: %v", err)
	require.NoError(t, c.Free(p))
	require.ErrorAs(t, c.Free(p), &ce, "double free")
}

// runIPCChild opens an IPC handle from the parent and writes a pattern.
func runIPCChild() int {
	d, err := LoadDriver(os.Getenv("KVBRIDGE_CUDA_LIB"))
	if err != nil {
		return 2
	}
	c, _ := d.Primary(0)
	raw, _ := hex.DecodeString(os.Getenv("KVBRIDGE_GPU_CHILD"))
	var h IPCHandle
	copy(h[:], raw)
	p, err := c.IPCOpen(h)
	if err != nil {
		return 3
	}
	if err := c.CopyHtoD(p, []byte("written by the child")); err != nil {
		return 4
	}
	if err := c.IPCClose(p); err != nil {
		return 5
	}
	return 0
}

func TestIPCAcrossProcesses(t *testing.T) {
	driverCases(t, func(t *testing.T, d *Driver, double bool) {
		c, _ := d.Primary(0)
		defer c.Release()
		p, err := c.Alloc(4096)
		require.NoError(t, err)
		defer c.Free(p)
		h, err := c.IPCHandle(p)
		require.NoError(t, err)
		lib := doubleLib
		if !double {
			lib = "libcuda.so.1"
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "KVBRIDGE_GPU_CHILD="+hex.EncodeToString(h[:]), "KVBRIDGE_CUDA_LIB="+lib)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "child: %s", out)
		got := make([]byte, 20)
		require.NoError(t, c.CopyDtoH(got, p), "after the child's write")
		require.Equal(t, "written by the child", string(got), "after the child's write")
	})
}

// TestDriverPathOnlyGiven: OpenDriver loads the path it is given, and with
// none the driver already open or libcuda.so.1, whatever KVBRIDGE_CUDA_LIB
// says (a binary reads it with DriverPathFromEnv and passes it, issue 50);
// once one driver is open a call naming another path is refused.
func TestDriverPathOnlyGiven(t *testing.T) {
	forget := func() {
		driverOnce.Lock()
		driverOnce.d, driverOnce.path, driverOnce.err = nil, "", nil
		driverOnce.Unlock()
	}
	forget()
	t.Cleanup(forget)
	const fromEnv = "/nonexistent/kvbridge-env-libcuda.so.1"
	t.Setenv("KVBRIDGE_CUDA_LIB", fromEnv)
	require.Equal(t, fromEnv, DriverPathFromEnv(), "DriverPathFromEnv")
	if _, err := OpenDriver(""); err != nil {
		require.NotContains(t, err.Error(), fromEnv, "OpenDriver(\"\") took the path from KVBRIDGE_CUDA_LIB")
		require.ErrorContains(t, err, "libcuda.so.1", "OpenDriver(\"\") without a driver")
	}
	forget()
	d, err := OpenDriver(doubleLib)
	require.NoError(t, err, "OpenDriver(the double)")
	again, err := OpenDriver("")
	require.NoError(t, err, "OpenDriver(\"\") after the double")
	require.Same(t, d, again, "OpenDriver(\"\") after the double: the driver already open")
	again, err = OpenDriver(doubleLib)
	require.NoError(t, err, "OpenDriver(the double) again")
	require.Same(t, d, again, "OpenDriver(the double) again")
	_, err = OpenDriver(fromEnv)
	require.ErrorContains(t, err, "already loaded the CUDA driver from "+doubleLib, "a second driver path in one process")
	require.ErrorContains(t, err, fromEnv, "a second driver path in one process")
}
