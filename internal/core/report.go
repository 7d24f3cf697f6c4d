package core

import (
	"maps"
	"slices"
)

// LoadReport says what of a decode room's KV cache landed, so that an
// engine whose load failed can recompute only the rest (vLLM's
// kv_load_failure_policy). It is given once nothing else can land in the
// room's pages: after Success, or after a failure once every prefill rank
// that got the room's REQUEST answered a drained ABORT_ACK or the
// quarantine released the pages. A notification that arrives later still
// (it was in flight) is recorded too, so a later report may list more,
// never less.
type LoadReport struct {
	Status Poll
	// Code is the failure's code — the STATUS codes (CodeAborted for a
	// local abort, CodeCleared, CodePeerUnreachable, CodePeerRestarted,
	// a prefill rank's STATUS code, CodeNotDelivered for bytes a
	// notification named that did not land, CodeFailed for a deadline or any
	// other failure) — and Reason its text; both empty on Success.
	Code, Reason string
	Sources      []SourceReport
}

// SourceReport is what one prefill rank of the room (Source: its index
// in the room, the uid of its notifications) delivered.
type SourceReport struct {
	Source int
	Dummy  bool // it writes nothing into this rank
	// Proven: nothing more of it can land (it delivered everything, never
	// got the REQUEST, or acknowledged the abort as drained). A source
	// whose pages only the quarantine released is not proven, and its
	// Landed is empty: what its notifications said cannot be trusted to
	// be all that reached the pages.
	Proven bool
	// LayerLo, LayerHi: the layers it writes, this rank's numbering (as
	// its notifications said; both 0 when none came, or when they were of
	// the earlier revision, which tells no layers: then Whole is empty).
	LayerLo, LayerHi int
	Landed           []Landed
}

// Landed is a rectangle of a room's KV cache that landed whole: the
// positions [First, First+Count) of the RequestSpec's DstPages (the pages
// after its Prefix), layers [LayerLo, LayerHi) in this rank's numbering.
// From one source it holds that source's heads of those layers.
type Landed struct {
	First, Count     int
	LayerLo, LayerHi int
}

// loadReport is Core.Report for a decode core.
func (c *decodeCore) loadReport(id uint64) (LoadReport, bool) {
	rm, ok := c.reg.rooms[id]
	if !ok || rm.dec == nil || !rm.status.Terminal() {
		return LoadReport{}, false
	}
	_, held := c.holds[id]
	if held {
		return LoadReport{}, false // something may still land
	}
	r := LoadReport{Status: rm.status}
	if rm.status == Failed {
		r.Code, r.Reason = rm.dec.code, rm.reason
	}
	for _, s := range rm.dec.sources {
		sr := SourceReport{Source: s.uid, Dummy: s.link.Dummy, Proven: rm.status == Success || !s.sent || s.acked}
		if s.spanHi > 0 && !s.legacy {
			sr.LayerLo, sr.LayerHi = s.spanLo, s.spanHi
		}
		if sr.Proven {
			sr.Landed = s.landed()
		}
		r.Sources = append(r.Sources, sr)
	}
	return r, true
}

// landed lists what landed of a source: per chunk (in chunk order) the
// runs of its layers that landed.
func (s *source) landed() []Landed {
	var out []Landed
	for _, k := range slices.Sorted(maps.Keys(s.chunks)) {
		cs := s.chunks[k]
		if cs.off < 0 || cs.n == 0 {
			continue // positions not told, or none written
		}
		for l := 0; l < cs.spanHi-cs.spanLo; {
			if cs.got[l/64]&(1<<(l%64)) == 0 {
				l++
				continue
			}
			e := l
			for e < cs.spanHi-cs.spanLo && cs.got[e/64]&(1<<(e%64)) != 0 {
				e++
			}
			out = append(out, Landed{First: cs.off, Count: cs.n, LayerLo: cs.spanLo + l, LayerHi: cs.spanLo + e})
			l = e
		}
	}
	return out
}

// Whole returns the rectangles of the room's KV cache that every source
// writing them delivered — a page position and layer is whole when each
// non-dummy source whose layers include that layer landed it there
// (several sources write one page's heads when the prefill TP is larger
// than decode's). It is empty unless every non-dummy source is Proven and
// has said which layers it writes (one that delivered nothing has not).
func (r LoadReport) Whole() []Landed {
	var srcs []SourceReport
	lo, hi := -1, -1
	for _, s := range r.Sources {
		if s.Dummy {
			continue
		}
		if !s.Proven || s.LayerHi <= s.LayerLo {
			return nil
		}
		srcs = append(srcs, s)
		if lo < 0 || s.LayerLo < lo {
			lo = s.LayerLo
		}
		hi = max(hi, s.LayerHi)
	}
	var out []Landed
	var open []int // indices into out of the rectangles still growing
	var prev []span
	for layer := lo; layer < hi+1 && len(srcs) > 0; layer++ {
		var cur []span
		if layer < hi {
			first := true
			for _, s := range srcs {
				if layer < s.LayerLo || layer >= s.LayerHi {
					continue
				}
				var mine []span
				for _, l := range s.Landed {
					if l.LayerLo <= layer && layer < l.LayerHi {
						mine = append(mine, span{l.First, l.First + l.Count})
					}
				}
				mine = mergeSpans(mine)
				if first {
					cur, first = mine, false
				} else {
					cur = intersectSpans(cur, mine)
				}
			}
		}
		if layer > lo && slices.Equal(cur, prev) {
			continue
		}
		for _, i := range open {
			out[i].LayerHi = layer
		}
		open = open[:0]
		for _, p := range cur {
			open = append(open, len(out))
			out = append(out, Landed{First: p.lo, Count: p.hi - p.lo, LayerLo: layer})
		}
		prev = cur
	}
	return out
}

type span struct{ lo, hi int }

// mergeSpans sorts and merges intervals that overlap or touch.
func mergeSpans(s []span) []span {
	slices.SortFunc(s, func(a, b span) int { return a.lo - b.lo })
	var out []span
	for _, x := range s {
		if n := len(out); n > 0 && x.lo <= out[n-1].hi {
			out[n-1].hi = max(out[n-1].hi, x.hi)
			continue
		}
		out = append(out, x)
	}
	return out
}

// intersectSpans intersects two sorted disjoint interval lists.
func intersectSpans(a, b []span) []span {
	var out []span
	for i, j := 0, 0; i < len(a) && j < len(b); {
		lo, hi := max(a[i].lo, b[j].lo), min(a[i].hi, b[j].hi)
		if lo < hi {
			out = append(out, span{lo, hi})
		}
		if a[i].hi < b[j].hi {
			i++
		} else {
			j++
		}
	}
	return out
}
