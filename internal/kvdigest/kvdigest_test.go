package kvdigest

import (
	"hash/crc32"
	"math/rand/v2"
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// TestSumMatchesCRC32C: each group's sum is hash/crc32's Castagnoli CRC of
// its pieces' bytes concatenated, on the CPU's instruction (three streams
// over long pieces) and on the table, for pieces of every length 0–70 and
// up to 5,000, groups of 0–5 pieces anywhere in a buffer, and every
// length around the three-stream blocks.
func TestSumMatchesCRC32C(t *testing.T) {
	for _, table := range []bool{false, true} {
		useTable(table)
		rng := rand.New(rand.NewPCG(1, uint64(len(castagnoli))))
		buf := make([]byte, 1<<16)
		for i := range buf {
			buf[i] = byte(rng.Uint32())
		}
		base := uint64(uintptr(unsafe.Pointer(&buf[0])))
		for round := range 200 {
			var pieces []uint64
			var ends []int
			var want []uint32
			for range rng.IntN(6) {
				var cat []byte
				for range rng.IntN(6) {
					n := rng.IntN(71)
					if round%10 == 0 {
						n = rng.IntN(5000)
					}
					off := rng.IntN(len(buf) - n)
					pieces = append(pieces, base+uint64(off), uint64(n))
					cat = append(cat, buf[off:off+n]...)
				}
				ends = append(ends, len(pieces)/2)
				want = append(want, crc32.Checksum(cat, castagnoli))
			}
			got, err := Sum(pieces, ends, []uint32{7})
			require.NoError(t, err)
			require.Equal(t, append([]uint32{7}, want...), got, "table %v round %d: pieces %v ends %v", table, round, pieces, ends)
		}
		// Every length around the three-stream blocks (3 × 168, 3 × 1344
		// bytes) and their multiples, at odd offsets.
		for _, n := range []int{503, 504, 505, 1007, 1008, 4031, 4032, 4033, 4536, 8064, 8065, 12100, 60000} {
			off := n % 7
			got, err := Sum([]uint64{base + uint64(off), uint64(n)}, []int{1}, nil)
			require.NoError(t, err)
			require.Equal(t, crc32.Checksum(buf[off:off+n], castagnoli), got[0], "table %v: %d bytes", table, n)
		}
		runtime.KeepAlive(buf)
		require.Equal(t, crc32.Checksum([]byte("123456789"), castagnoli), Bytes([]byte("123456789")), "table %v: the check value", table)
		require.Equal(t, uint32(0xe3069283), Bytes([]byte("123456789")), "table %v: CRC-32C's published check value", table)
	}
	useTable(false)
}

// TestSumRefusesBadGroups: odd words, groups that end before the one
// before or past the pieces are refused, naming the group; nothing read.
func TestSumRefusesBadGroups(t *testing.T) {
	_, err := Sum([]uint64{1}, []int{1}, nil)
	require.ErrorContains(t, err, "pairs")
	_, err = Sum([]uint64{0, 0, 0, 0}, []int{2, 1}, nil)
	require.ErrorContains(t, err, "group 1 ends at piece 1 (after 2")
	_, err = Sum([]uint64{0, 0}, []int{2}, nil)
	require.ErrorContains(t, err, "group 0 ends at piece 2 (after 0, of 1)")
}

// BenchmarkSum: the digest's speed over 64 KiB pages in 1 KiB pieces
// (the CPU's instruction, and the table).
func BenchmarkSum(b *testing.B) {
	buf := make([]byte, 64<<20)
	base := uint64(uintptr(unsafe.Pointer(&buf[0])))
	var pieces []uint64
	var ends []int
	for off := 0; off < len(buf); off += 1024 {
		pieces = append(pieces, base+uint64(off), 1024)
		if (off+1024)%(64<<10) == 0 {
			ends = append(ends, len(pieces)/2)
		}
	}
	for _, table := range []bool{false, true} {
		name := "hardware"
		if table {
			name = "table"
		}
		b.Run(name, func(b *testing.B) {
			useTable(table)
			b.SetBytes(int64(len(buf)))
			out := make([]uint32, 0, len(ends))
			for b.Loop() {
				out, _ = Sum(pieces, ends, out[:0])
			}
		})
	}
	useTable(false)
	runtime.KeepAlive(buf)
}
