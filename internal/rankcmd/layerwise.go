package rankcmd

import (
	"errors"

	"github.com/kvbridge/kvbridge/sender"
)

// sendLayers is one layer group of a chunk; until sender.SendLayers is in
// (issue 25) -layerwise is refused at start-up.
func sendLayers(*sender.Sender, []uint32, int, int, bool, int) error {
	return errors.New("-layerwise needs sender.SendLayers (issue 25)")
}

const layerwiseAvailable = false
