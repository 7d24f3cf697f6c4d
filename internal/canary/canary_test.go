package canary

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestPlantFind: Plant writes the canary at every address (aligned or
// not), Find names the first still holding it — in any position, past
// the first — and −1 once each was overwritten.
func TestPlantFind(t *testing.T) {
	b := make([]byte, 1<<16)
	base := uint64(uintptr(unsafe.Pointer(&b[0])))
	var tails []uint64
	for k := range 1000 {
		tails = append(tails, base+uint64(k*61)) // unaligned ones too
	}
	const v = 0x5eed_cafe_f00d_d00d
	Plant(tails, v)
	for _, a := range tails {
		require.Equal(t, uint64(v), *(*uint64)(unsafe.Pointer(&b[a-base])))
	}
	require.Equal(t, 0, Find(tails, v))
	for _, a := range tails { // every byte of every tail overwritten
		for k := range 8 {
			b[a-base+uint64(k)] = 0x11
		}
	}
	require.Equal(t, -1, Find(tails, v))
	for _, i := range []int{999, 500, 7, 0} {
		*(*uint64)(unsafe.Pointer(&b[tails[i]-base])) = v
		require.Equal(t, i, Find(tails, v), "the first still holding it")
	}
	require.Equal(t, -1, Find(nil, v))
	Plant(nil, v)
}
