package gpu

import (
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestNoDriver(t *testing.T) {
	_, err := LoadDriver("/nonexistent/libcuda.so.1")
	if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Fatalf("missing driver: %v", err)
	}
	t.Setenv("KVB_CUDA_DOUBLE_DEVICES", "0")
	_, err = LoadDriver(doubleLib)
	var ce *CUDAError
	if !errors.Is(err, ErrNoDriver) || !errors.As(err, &ce) || ce.Name != "CUDA_ERROR_NO_DEVICE" || ce.Call != "cuInit" {
		t.Fatalf("driver without devices: %v", err)
	}
}

// TestLoadDriverNamesMissingSymbol: a library that is not the CUDA driver
// (here the C library) is refused by the shared loader (internal/dl),
// naming the library and the first symbol of the table it lacks.
func TestLoadDriverNamesMissingSymbol(t *testing.T) {
	_, err := LoadDriver("libc.so.6")
	if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "libc.so.6: missing symbol cuInit") {
		t.Fatalf("a library without the driver's symbols: %v", err)
	}
}

// driverCases runs a test body on the CUDA double and, where one exists, on
// the real driver (reported as skipped, with the reason, where none is).
func driverCases(t *testing.T, body func(t *testing.T, d *Driver, double bool)) {
	t.Run("double", func(t *testing.T) {
		d, err := LoadDriver(doubleLib)
		if err != nil {
			t.Fatal(err)
		}
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
		if n, err := d.DeviceCount(); err != nil || n < 1 {
			t.Fatalf("devices %d %v", n, err)
		}
		c, err := d.Primary(0)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		const n = 1 << 20
		a, err := c.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Free(a)
		b, _ := c.Alloc(n)
		defer c.Free(b)
		src := bytes.Repeat([]byte("kvbridge"), n/8)
		if err := c.CopyHtoD(a, src); err != nil {
			t.Fatal(err)
		}
		if err := c.CopyDtoD(b, a, n); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, n)
		if err := c.CopyDtoH(got, b); err != nil || !bytes.Equal(got, src) {
			t.Fatalf("round trip through the device: %v", err)
		}
		s, err := c.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Destroy()
		if err := s.CopyDtoDAsync(b+4096, a, 4096); err != nil {
			t.Fatal(err)
		}
		if err := s.CopyAsync(uintptr(a)+8192, uintptr(a), 8); err != nil {
			t.Fatal(err)
		}
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
		if dev, ord, err := c.PointerInfo(a + 100); err != nil || !dev || ord != 0 {
			t.Fatalf("pointer info: %v %d %v", dev, ord, err)
		}
		if base, size, err := c.AddressRange(a + 100); err != nil || base != a || size < n {
			t.Fatalf("address range: %#x %d %v", base, size, err)
		}
		if _, err := c.IPCHandle(a); err != nil {
			t.Fatal(err)
		}
	})
}

func TestDriverErrorsNameTheCall(t *testing.T) {
	d, err := LoadDriver(doubleLib)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := d.Primary(0)
	t.Setenv("KVB_CUDA_DOUBLE_FAIL", "cuMemAlloc_v2")
	_, err = c.Alloc(1 << 40)
	var ce *CUDAError
	if !errors.As(err, &ce) || !strings.HasPrefix(ce.Call, "cuMemAlloc") || ce.Name != "CUDA_ERROR_OUT_OF_MEMORY" {
		t.Fatalf("alloc failure: %v", err)
	}
	os.Unsetenv("KVB_CUDA_DOUBLE_FAIL")
	if _, err := d.Primary(7); !errors.As(err, &ce) || ce.Name != "CUDA_ERROR_INVALID_DEVICE" {
		t.Fatalf("bad ordinal: %v", err)
	}
	p, _ := c.Alloc(64)
	h, _ := c.IPCHandle(p)
	if _, err := c.IPCOpen(h); !errors.As(err, &ce) || ce.Call != "cuIpcOpenMemHandle" {
		t.Fatalf("IPC open in the exporting process must fail as in CUDA: %v", err)
	}
	if err := c.Free(p); err != nil {
		t.Fatal(err)
	}
	if err := c.Free(p); !errors.As(err, &ce) {
		t.Fatalf("double free: %v", err)
	}
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
		if err != nil {
			t.Fatal(err)
		}
		defer c.Free(p)
		h, err := c.IPCHandle(p)
		if err != nil {
			t.Fatal(err)
		}
		lib := doubleLib
		if !double {
			lib = "libcuda.so.1"
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "KVBRIDGE_GPU_CHILD="+hex.EncodeToString(h[:]), "KVBRIDGE_CUDA_LIB="+lib)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("child: %v %s", err, out)
		}
		got := make([]byte, 20)
		if err := c.CopyDtoH(got, p); err != nil || string(got) != "written by the child" {
			t.Fatalf("after the child's write: %q %v", got, err)
		}
	})
}
