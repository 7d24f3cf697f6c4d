package canary

import (
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// mmapPages maps n pages of this process's memory outside Go's heap.
func mmapPages(t *testing.T, n int) []byte {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, n*syscall.Getpagesize(), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Munmap(b) })
	return b
}

func TestPlantFind(t *testing.T) {
	pg := syscall.Getpagesize()
	b := mmapPages(t, 4)
	base := uint64(uintptr(unsafe.Pointer(&b[0])))
	// Three tails a page, over 4 pages, and more than one batch.
	var tails []uint64
	for p := range 4 {
		for k := range 3 {
			tails = append(tails, base+uint64(p*pg+(k+1)*pg/3-8)&^7)
		}
	}
	for len(tails) < 1200 {
		tails = append(tails, tails[len(tails)%12])
	}
	const v = 0x5eed_cafe_f00d_d00d
	n, err := Plant(tails, v)
	require.NoError(t, err)
	require.Equal(t, len(tails), n)
	i, unreadable := Find(tails, v)
	require.Equal(t, 0, i)
	require.False(t, unreadable)
	// Overwrite all but one tail: Find names it, also past the first batch.
	for _, a := range tails[:12] {
		*(*uint64)(unsafe.Pointer(&b[a-base])) = 1
	}
	require.Equal(t, -1, first(tails, v))
	*(*uint64)(unsafe.Pointer(&b[tails[7]-base])) = v
	require.Equal(t, 7, first(tails, v))
	late := make([]uint64, 1000) // tail 7 only at 900, in the second batch
	for k := range late {
		late[k] = tails[0]
	}
	late[900] = tails[7]
	require.Equal(t, 900, first(late, v))
	*(*uint64)(unsafe.Pointer(&b[tails[7]-base])) = 2

	// A page made inaccessible: its tails are skipped when planting and
	// reported unreadable when found, not a fault.
	require.NoError(t, syscall.Mprotect(b[2*pg:3*pg], syscall.PROT_NONE))
	t.Cleanup(func() { syscall.Mprotect(b[2*pg:3*pg], syscall.PROT_READ|syscall.PROT_WRITE) })
	n, err = Plant(tails[:12], 3)
	require.NoError(t, err)
	require.Equal(t, 9, n, "the three tails of the inaccessible page skipped")
	*(*uint64)(unsafe.Pointer(&b[tails[0]-base])) = 4
	*(*uint64)(unsafe.Pointer(&b[tails[1]-base])) = 4
	*(*uint64)(unsafe.Pointer(&b[tails[2]-base])) = 4
	for _, k := range []int{3, 4, 5} {
		*(*uint64)(unsafe.Pointer(&b[tails[k]-base])) = 4
	}
	i, unreadable = Find(tails[:12], 3)
	require.Equal(t, 6, i)
	require.True(t, unreadable, "tail 6 is in the inaccessible page")
}

// first is Find's index, asserting the tail was readable.
func first(tails []uint64, v uint64) int {
	i, _ := Find(tails, v)
	return i
}

func TestEmpty(t *testing.T) {
	n, err := Plant(nil, 1)
	require.NoError(t, err)
	require.Zero(t, n)
	i, unreadable := Find(nil, 1)
	require.Equal(t, -1, i)
	require.False(t, unreadable)
}
