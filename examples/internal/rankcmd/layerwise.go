package rankcmd

import "github.com/kvbridge/kvbridge/sender"

// sendLayers is one layer group of a chunk (sender.SendLayers: layers
// [lo, hi) of this rank's own, the data already in place).
func sendLayers(s *sender.Sender, pages []uint32, lo, hi int, last bool, aux int) error {
	return s.SendLayers(pages, lo, hi, last, aux, nil)
}

const layerwiseAvailable = true

// sendChunk sends one chunk of a fill-pattern room: one Send, or with
// -layerwise one SendLayers per layer group of this rank's layers.
func (r *Rank) sendChunk(s *sender.Sender, pages []uint32, last bool, aux int) error {
	if !r.layerwise {
		return s.Send(pages, last, aux)
	}
	_, n := r.Mapping.StageLayers(r.Par.PPSize, r.Par.PPRank)
	for lo := 0; lo < n; lo += r.layerGroup {
		if err := sendLayers(s, pages, lo, min(lo+r.layerGroup, n), last, aux); err != nil {
			return err
		}
	}
	return nil
}
