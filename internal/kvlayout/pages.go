package kvlayout

import (
	"fmt"
	"math"
)

// Pages of different sizes on the two sides (docs/PROTOCOL.md "Pages of
// different sizes"): a room's tokens fill prefill pages of Src tokens and
// decode pages of Dst tokens, one size dividing the other. Token t of the
// room is in prefill page t / Src and decode page t / Dst; the pages are
// paired up in units of the smaller page, each unit wholly inside one page
// of each side.

// PageMap maps a room's pages between two page sizes (tokens per page).
type PageMap struct{ Src, Dst int }

// Unit is the tokens of one unit: the smaller page.
func (pm PageMap) Unit() int { return min(pm.Src, pm.Dst) }

// Same reports whether both sides' pages hold the same tokens (units are
// then pages).
func (pm PageMap) Same() bool { return pm.Src == pm.Dst }

// Pair maps a chunk of prefill pages src, which fill the room's prefill
// page positions first, first+1, …, onto the decode rank's pages dst, which
// fill its page positions prefix, prefix+1, … (the positions before prefix
// it already holds). It returns the unit pairs to write (prefill unit →
// decode unit, in units of Unit(): page p's units are p·(page/unit) …), and
// the positions [off, off+n) of dst they write into (off −1 when none).
//
// A unit at a decode position before prefix is skipped (decode holds it).
// A prefill page may overhang the end of dst — its first unit lands in
// dst, later ones past it — and is cut there: with larger prefill pages
// the room's last page is only partly filled. A page that starts past the
// end of dst is an error: prefill sent more than decode asked for. (A decode rank that names fewer pages than its tokens need
// by less than one prefill page is not told apart from that cut: naming
// ⌈tokens / decode page tokens⌉ pages is the decode rank's part.)
func (pm PageMap) Pair(first int, src []uint32, prefix int, dst []uint32) (s, d []uint32, off, n int, err error) {
	if err := PageRatio(pm.Src, pm.Dst); err != nil {
		return nil, nil, -1, 0, err
	}
	unit := pm.Unit()
	sPer, dPer := pm.Src/unit, pm.Dst/unit
	off, last := -1, -1
	for i, pg := range src {
		for k := 0; k < sPer; k++ {
			v := (first+i)*sPer + k // the room's unit
			pos := v/dPer - prefix  // its position in dst
			if pos < 0 {
				continue // decode already holds this prefix page
			}
			if pos >= len(dst) {
				if k == 0 {
					return nil, nil, -1, 0, fmt.Errorf("decode gave %d destination pages (after a prefix of %d), prefill sent more", len(dst), prefix)
				}
				break // the page overhangs the room's last decode page (the pages after it start past it: refused)
			}
			// Unit numbers past uint32 would wrap onto small, valid ones.
			su, du := uint64(pg)*uint64(sPer)+uint64(k), uint64(dst[pos])*uint64(dPer)+uint64(v%dPer)
			if su > math.MaxUint32 || du > math.MaxUint32 {
				return nil, nil, -1, 0, fmt.Errorf("page %d → %d is past the largest unit number (%d and %d units a page)", pg, dst[pos], sPer, dPer)
			}
			if off < 0 {
				off = pos
			}
			last = pos
			s = append(s, uint32(su))
			d = append(d, uint32(du))
		}
	}
	if off < 0 {
		return nil, nil, -1, 0, nil
	}
	return s, d, off, last - off + 1, nil
}

// InPrefix reports whether a chunk that ends after the room's prefill page
// position end (exclusive) ends inside the decode rank's prefix of prefix
// decode pages (it then writes nothing where it ends).
func (pm PageMap) InPrefix(end, prefix int) bool { return end*pm.Src <= prefix*pm.Dst }

// Aligned reports whether a chunk that ends after the room's prefill page
// position end (exclusive) ends on a decode page boundary, as every chunk
// but a room's last must: a decode page is then written by one chunk only,
// and a chunk's notification names whole decode pages.
func (pm PageMap) Aligned(end int) bool { return end*pm.Src%pm.Dst == 0 }

// WrittenUnits appends the decode units that a chunk which wrote the
// positions [off, off+n) of dst (Pair's off and n) under page map pm
// surely filled: every unit of those pages, but when the chunk is the
// room's last (last) only the first of the last page it names if a decode
// page holds several units — the room's last tokens may fill only part of
// it (every other chunk ends on a decode page: Aligned). Positions
// outside dst, and units past 32 bits, are left out. (A function, not
// PageMap's method: package transfer exports PageMap, and this is the
// decode shell's alone.)
func WrittenUnits(pm PageMap, dst []uint32, off, n int, last bool, out []uint32) []uint32 {
	dPer := uint64(1)
	if u := pm.Unit(); u > 0 && pm.Dst > u {
		dPer = uint64(pm.Dst / u)
	}
	end := min(off+n, len(dst))
	for pos := max(off, 0); pos < end; pos++ {
		k := dPer
		if last && pos == end-1 {
			k = 1
		}
		for i := range k {
			if u := uint64(dst[pos])*dPer + i; u <= math.MaxUint32 {
				out = append(out, uint32(u))
			}
		}
	}
	return out
}
