package kvlayout

import (
	"hash/crc32"
	"testing"

	"github.com/kvbridge/kvbridge/internal/mem"
	"github.com/stretchr/testify/require"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sums is the CRC-32C of each group of pieces, read from m.
func sums(m *memory, pieces []uint64, ends []int) []uint32 {
	var out []uint32
	i := 0
	for _, e := range ends {
		crc := uint32(0)
		for ; i < e; i++ {
			crc = crc32.Update(crc, castagnoli, m.at(mem.Desc{Addr: uintptr(pieces[2*i]), Len: pieces[2*i+1]}))
		}
		out = append(out, crc)
	}
	return out
}

// checkDigest (a case of TestSlicesMoveEveryHeadOnce, before the chunk's
// descriptors are applied): the source side's DigestPieces of the chunk's
// runs (regions: the prefill rank's all) and the destination side's
// (DigestUnits of the positions the chunk names, with LastUnits, in the
// decode rank's regions at the slice's offset) are one group per
// position, piece for piece the same lengths, each source piece moved by
// the chunk's descriptors exactly onto its destination piece, together
// every byte the descriptors move; so once the descriptors are applied the
// two sides' sums agree.
func checkDigest(t *testing.T, pl Layout, pmem *memory, dl Layout, dmem *memory, sl *Slice, pm PageMap, runs []Run, dst []uint32, off, n int, ld, rd []mem.Desc) {
	t.Helper()
	sp, se := DigestPieces(pl, sl, true, 0, len(pl.Regions), runs, nil, nil)
	du := DigestUnits(pm, dst, off, n, LastUnits(sl, runs), nil)
	dp, de := DigestPieces(dl, sl, false, sl.RegionOffset, sl.RegionOffset+len(pl.Regions), UnitRuns(du), nil, nil)
	require.Len(t, se, n, "source groups: one per position")
	require.Equal(t, se, de, "group ends, source and destination")
	require.Equal(t, len(sp), len(dp), "pieces")
	var moved, total uint64
	for _, d := range ld {
		moved += d.Len
	}
	for i := 0; i < len(sp); i += 2 {
		require.Equal(t, sp[i+1], dp[i+1], "piece %d: lengths", i/2)
		total += sp[i+1]
		found := false
		for k := range ld {
			if sp[i] >= uint64(ld[k].Addr) && sp[i]+sp[i+1] <= uint64(ld[k].Addr)+ld[k].Len {
				require.Equal(t, uint64(rd[k].Addr)+(sp[i]-uint64(ld[k].Addr)), dp[i], "piece %d: moved by descriptor %d elsewhere", i/2, k)
				found = true
				break
			}
		}
		require.True(t, found, "source piece %d at %#x: no descriptor moves it", i/2, sp[i])
	}
	require.Equal(t, moved, total, "bytes the descriptors move, bytes the digest covers")
	// The pieces are the descriptors' bytes: applied, the sums agree.
	for i := range ld {
		copy(dmem.at(rd[i]), pmem.at(ld[i]))
	}
	require.Equal(t, sums(pmem, sp, se), sums(dmem, dp, de), "sums after the write")
}
