package kvlayout

// TailBytes is the size of a write check's canary: the decode rank plants
// one at the end of every piece a write will fill (Tails), and a
// notification naming pieces that still end with it names bytes that did
// not land (docs/PROTOCOL.md "Writes checked before they count").
const TailBytes = 8

// Tails appends to out the address of the last TailBytes of every piece a
// write fills on the destination (decode) side for the destination units
// du of its regions [rlo, rhi): the descriptors ExpandSlice makes before it
// merges contiguous ones (whole pages or units for a Full slice or no
// slice, one per head under HND, one per token under NHD). Every descriptor
// a write posts, merged or not, ends at one of them. s nil: pages of the
// same size, whole (no rank mapping). Pieces under TailBytes are left out,
// and so are units past the regions' pages (a page a REQUEST names out of
// range, which the prefill rank refuses): every tail lies inside dst.
func Tails(dst Layout, s *Slice, rlo, rhi int, units []uint32, out []uint64) []uint64 {
	rlo, rhi = max(rlo, 0), min(rhi, len(dst.Regions))
	pages := uint64(Pages(dst))
	if s == nil || s.Full { // (Full: pages of the same size)
		if dst.PageBytes < TailBytes {
			return out
		}
		for r := rlo; r < rhi; r++ {
			base := uint64(dst.Regions[r].Addr)
			for _, u := range units {
				if uint64(u) < pages {
					out = append(out, base+(uint64(u)+1)*dst.PageBytes-TailBytes)
				}
			}
		}
		return out
	}
	hb := uint64(s.HeadBytes)
	unit, dTok := s.Unit(), s.dstTokens()
	dPer := uint32(dTok / unit)
	for r := rlo; r < rhi; r++ {
		base := uint64(dst.Regions[r].Addr)
		for _, du := range units {
			if uint64(du/dPer) >= pages {
				continue
			}
			rp := base + uint64(du/dPer)*dst.PageBytes
			dt := uint64(du%dPer) * uint64(unit)
			if s.Layout == HND {
				n := uint64(unit) * hb
				if n < TailBytes {
					continue
				}
				for h := 0; h < s.Heads; h++ {
					out = append(out, rp+(uint64(s.DstHead+h)*uint64(dTok)+dt)*hb+n-TailBytes)
				}
				continue
			}
			n := uint64(s.Heads) * hb // NHD: a token's heads
			if n < TailBytes {
				continue
			}
			for t := uint64(0); t < uint64(unit); t++ {
				out = append(out, rp+((dt+t)*uint64(s.DstHeads)+uint64(s.DstHead))*hb+n-TailBytes)
			}
		}
	}
	return out
}
