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
	assert.Equal(t, "libnixl_capi.so", libPath(Config{}), "the library read the environment")
	var c Config
	c.FromEnv()
	assert.Equal(t, "/from/env/libnixl_capi.so", c.NIXLLib)
	assert.Equal(t, "/from/env/libucp.so.0", c.UCXLib)
	c = Config{NIXLLib: "/given/libnixl_capi.so", UCXLib: "/given/libucp.so.0"}
	c.FromEnv()
	assert.Equal(t, "/given/libnixl_capi.so", c.NIXLLib, "FromEnv replaced a path the Config gave")
	assert.Equal(t, "/given/libucp.so.0", c.UCXLib, "FromEnv replaced a path the Config gave")
}

// TestOneUCXPerProcess: libucp is loaded once per process; an agent that
// names another one than the process loaded is refused, naming both.
func TestOneUCXPerProcess(t *testing.T) {
	a, err := Open(Config{Name: "one-ucx-a", Engine: EngineUCX, UCX: shmUCX})
	require.NoError(t, err)
	defer a.Close()
	_, err = Open(Config{Name: "one-ucx-b", Engine: EngineUCX, UCX: shmUCX, UCXLib: "/another/libucp.so.0"})
	require.ErrorIs(t, err, ErrInvalidRequest)
	require.ErrorContains(t, err, "Config.UCXLib /another/libucp.so.0")
	c, err := Open(Config{Name: "one-ucx-c", Engine: EngineUCX, UCX: shmUCX, UCXLib: ucxLib.path})
	require.NoError(t, err, "the path the process loaded")
	c.Close()
}
