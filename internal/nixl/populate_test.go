package nixl

import (
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// resident counts the pages of b the kernel has in memory (mincore).
func resident(t *testing.T, b []byte) int {
	t.Helper()
	ps := syscall.Getpagesize()
	vec := make([]byte, (len(b)+ps-1)/ps)
	if _, _, e := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// Populate makes fresh memory resident without changing it.
func TestPopulate(t *testing.T) {
	const size = 16 << 20
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	require.NoError(t, err)
	defer syscall.Munmap(b)
	b[12345] = 0x5a
	pages := size / syscall.Getpagesize()
	require.LessOrEqual(t, resident(t, b), pages/2, "pages resident (of %d) before Populate: the test cannot tell", pages)
	require.NoError(t, Populate(Desc{Addr: uintptr(unsafe.Pointer(&b[1])), Len: size - 1}))
	require.Equal(t, pages, resident(t, b), "pages resident after Populate")
	require.Equal(t, byte(0x5a), b[12345], "Populate changed the memory")
	require.Zero(t, b[0], "Populate changed the memory")
	require.Zero(t, b[size-1], "Populate changed the memory")
}

// TestLibraryPathsOnlyThroughFromEnv: the package reads no environment
// variable itself (issue 50): a Config without NIXLLib loads from the
// loader's path whatever KVBRIDGE_NIXL_LIB says, and FromEnv — which the
// example binaries call — fills only the paths a Config leaves empty.
func TestLibraryPathsOnlyThroughFromEnv(t *testing.T) {
	t.Setenv("KVBRIDGE_NIXL_LIB", "/from/env/libnixl_capi.so")
	t.Setenv(UCXLibEnv, "/from/env/libucp.so.0")
	t.Setenv("KVBRIDGE_CUDA_LIB", "/from/env/libcuda.so.1")
	assert.Equal(t, "libnixl_capi.so", libPath(Config{}), "the library read the environment")
	var c Config
	c.FromEnv()
	assert.Equal(t, "/from/env/libnixl_capi.so", c.NIXLLib)
	assert.Equal(t, "/from/env/libucp.so.0", c.UCXLib)
	assert.Equal(t, "/from/env/libcuda.so.1", c.CUDALib)
	c = Config{NIXLLib: "/given/libnixl_capi.so", UCXLib: "/given/libucp.so.0", CUDALib: "/given/libcuda.so.1"}
	c.FromEnv()
	assert.Equal(t, "/given/libnixl_capi.so", c.NIXLLib, "FromEnv replaced a path the Config gave")
	assert.Equal(t, "/given/libucp.so.0", c.UCXLib, "FromEnv replaced a path the Config gave")
	assert.Equal(t, "/given/libcuda.so.1", c.CUDALib, "FromEnv replaced a path the Config gave")
}

// TestCUDADriverOnlyThroughConfig: the VRAM engines load the CUDA driver
// Config.CUDALib names, whatever KVBRIDGE_CUDA_LIB says (issue 50); empty,
// the driver this process already opened (here the test binary's: the GPU's
// or the double). An agent naming another driver than the process's is
// refused, naming the field.
func TestCUDADriverOnlyThroughConfig(t *testing.T) {
	vramCases(t, func(t *testing.T) {
		t.Setenv("KVBRIDGE_CUDA_LIB", "/nonexistent/kvbridge-env-libcuda.so.1")
		p, _ := devAlloc(t, 1<<20)
		for _, engine := range []string{EngineLoopback, EngineUCX} {
			a, err := Open(Config{Name: "cuda-env-" + engine, Engine: engine, UCX: shmUCX})
			require.NoError(t, err, engine)
			_, err = a.Register(VRAM, []Desc{{Addr: uintptr(p), Len: 1 << 20}})
			require.NoError(t, err, "%s: VRAM with KVBRIDGE_CUDA_LIB naming no driver and Config.CUDALib empty", engine)
			require.NoError(t, a.Close(), engine)
			a, err = Open(Config{Name: "cuda-other-" + engine, Engine: engine, UCX: shmUCX, CUDALib: "/another/libcuda.so.1"})
			require.NoError(t, err, engine)
			_, err = a.Register(VRAM, []Desc{{Addr: uintptr(p), Len: 1 << 20}})
			require.ErrorIs(t, err, ErrInvalidRequest, "%s: another CUDA driver than the process's", engine)
			require.ErrorContains(t, err, "Config.CUDALib /another/libcuda.so.1", "%s: another CUDA driver than the process's", engine)
			require.NoError(t, a.Close(), engine)
		}
	})
}
