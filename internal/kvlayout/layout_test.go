package kvlayout

import (
	"testing"

	"github.com/kvbridge/kvbridge/internal/mem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRuns(t *testing.T) {
	for _, tc := range []struct {
		src, dst []uint32
		want     []Run
	}{
		{nil, nil, nil},
		{[]uint32{5}, []uint32{9}, []Run{{Src: 5, Dst: 9, Len: 1}}},
		{[]uint32{1, 2, 3, 4}, []uint32{10, 11, 12, 13}, []Run{{Src: 1, Dst: 10, Len: 4}}},
		{[]uint32{1, 2, 3, 7, 8}, []uint32{10, 11, 20, 21, 22}, []Run{{Src: 1, Dst: 10, Len: 2}, {Src: 3, Dst: 20, Len: 1}, {Src: 7, Dst: 21, Len: 2}}},
		{[]uint32{3, 2, 1}, []uint32{1, 2, 3}, []Run{{Src: 3, Dst: 1, Len: 1}, {Src: 2, Dst: 2, Len: 1}, {Src: 1, Dst: 3, Len: 1}}},
	} {
		assert.Equal(t, tc.want, Runs(tc.src, tc.dst), "Runs(%v, %v)", tc.src, tc.dst)
	}
}

func TestLayoutValidate(t *testing.T) {
	good := Layout{Regions: []mem.Desc{{Addr: 1, Len: 64}, {Addr: 100, Len: 64}}, PageBytes: 16}
	require.NoError(t, ValidateLayout(good))
	require.Equal(t, 4, Pages(good))
	for _, l := range []Layout{
		{Regions: []mem.Desc{{Addr: 1, Len: 64}}, PageBytes: 16},
		{Regions: []mem.Desc{{Addr: 1, Len: 64}, {Addr: 100, Len: 32}}, PageBytes: 16},
		{Regions: []mem.Desc{{Addr: 1, Len: 64}, {Addr: 100, Len: 64}}, PageBytes: 0},
	} {
		assert.Error(t, ValidateLayout(l), "accepted %+v", l)
	}
}
