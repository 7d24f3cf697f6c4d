package kvlayout

// DigestPieces appends to out the pieces a write of runs moves on one side
// — address and length pairs — grouped by the destination page each lands
// in, and to ends the piece count where each page's group ends
// (docs/PROTOCOL.md "Digest": a CRC-32C of each group). The groups follow
// the runs' destination units in order, a new group where a unit's
// destination page differs from the one before; inside a group the pieces
// go by region [rlo, rhi), then unit, then head (HND) or token (NHD):
// ExpandSlice's pieces before it merges contiguous ones, so both sides
// name the same bytes in the same order, the source side its own
// addresses (src: side is the prefill rank's layout, rlo and hi its own
// regions) and the destination side its own (side is the decode rank's
// layout, its regions). s nil or Full: whole pages of the same size (a
// unit is a page). A piece in a page past the side's regions is left out
// (CheckRuns refuses such a write before it is posted; a decode rank's
// pages outside its regions sum to what no write gives), so every address
// lies inside side's regions.
func DigestPieces(side Layout, s *Slice, src bool, rlo, rhi int, runs []Run, out []uint64, ends []int) ([]uint64, []int) {
	rlo, rhi = max(rlo, 0), min(rhi, len(side.Regions))
	pages := uint64(Pages(side))
	whole := s == nil || s.Full
	unit, sPer, dPer := 1, uint32(1), uint32(1)
	tok, head0, heads := 0, 0, 0
	var hb uint64
	if !whole {
		unit, hb = s.Unit(), uint64(s.HeadBytes)
		sPer, dPer = uint32(s.PageTokens/unit), uint32(s.dstTokens()/unit)
		tok, head0, heads = s.PageTokens, s.SrcHead, s.SrcHeads
		if !src {
			tok, head0, heads = s.dstTokens(), s.DstHead, s.DstHeads
		}
	}
	per := dPer // the side's units per page
	if src {
		per = sPer
	}
	// One page group: the units [g0, g1) of the runs' flattened list.
	group := func(us []unitPair) {
		for r := rlo; r < rhi; r++ {
			base := uint64(side.Regions[r].Addr)
			for _, u := range us {
				su := u.dst
				if src {
					su = u.src
				}
				if uint64(su/per) >= pages {
					continue
				}
				pg := base + uint64(su/per)*side.PageBytes
				if whole {
					out = append(out, pg, side.PageBytes)
					continue
				}
				t0 := uint64(su%per) * uint64(unit)
				if s.Layout == HND {
					n := uint64(unit) * hb
					for h := 0; h < s.Heads; h++ {
						out = append(out, pg+(uint64(head0+h)*uint64(tok)+t0)*hb, n)
					}
					continue
				}
				n := uint64(s.Heads) * hb // NHD: a token's heads
				for t := uint64(0); t < uint64(unit); t++ {
					out = append(out, pg+((t0+t)*uint64(heads)+uint64(head0))*hb, n)
				}
			}
		}
		ends = append(ends, len(out)/2)
	}
	var cur []unitPair
	for _, run := range runs {
		for k := uint32(0); k < run.Len; k++ {
			u := unitPair{run.Src + k, run.Dst + k}
			if len(cur) > 0 && cur[len(cur)-1].dst/dPer != u.dst/dPer {
				group(cur)
				cur = cur[:0]
			}
			cur = append(cur, u)
		}
	}
	if len(cur) > 0 {
		group(cur)
	}
	return out, ends
}

type unitPair struct{ src, dst uint32 }

// UnitRuns is the runs DigestPieces' destination side takes for the
// decode units us (their source units are not used there).
func UnitRuns(us []uint32) []Run {
	out := make([]Run, 0, len(us))
	for _, u := range us {
		if n := len(out); n > 0 && u == out[n-1].Dst+out[n-1].Len {
			out[n-1].Len++
			continue
		}
		out = append(out, Run{Src: u, Dst: u, Len: 1})
	}
	return out
}

// DigestUnits appends the decode units a write that filled the positions
// [off, off+n) of dst under page map pm filled: every unit of those pages
// but the last, and the first k units of the last (LastUnits: the write's
// notification tells k, as only the prefill rank knows where the room's
// last tokens fell). k is clipped to [1, the units of a page]. Positions
// outside dst, and units past 32 bits, are left out.
func DigestUnits(pm PageMap, dst []uint32, off, n, k int, out []uint32) []uint32 {
	dPer := 1
	if u := pm.Unit(); u > 0 && pm.Dst > u {
		dPer = pm.Dst / u
	}
	k = min(max(k, 1), dPer)
	end := min(off+n, len(dst))
	for pos := max(off, 0); pos < end; pos++ {
		m := dPer
		if pos == off+n-1 {
			m = k
		}
		for i := range m {
			if u := uint64(dst[pos])*uint64(dPer) + uint64(i); u <= 1<<32-1 {
				out = append(out, uint32(u))
			}
		}
	}
	return out
}

// LastUnits is how many units of its last destination page a write of
// runs fills (the digest notification's k): 1 + the last destination
// unit's index in its page; 1 when units are pages (s nil, or the decode
// page the smaller).
func LastUnits(s *Slice, runs []Run) int {
	if s == nil || s.Full || len(runs) == 0 {
		return 1
	}
	dPer := uint32(s.dstTokens() / s.Unit())
	last := runs[len(runs)-1]
	if last.Len == 0 {
		return 1
	}
	return int((last.Dst+last.Len-1)%dPer) + 1
}
