//go:build kvbmutants

package kvmanager

import (
	"fmt"
	"os"
	"strconv"
)

// bugs is the set of mutants turned on in one core.
type bugs uint64

func (b bugs) on(id bugID) bool { return b&(1<<id) != 0 }

// mutantsBuilt reports whether this build can turn mutants on.
const mutantsBuilt = true

// withBugs is the process's mutant plus ids.
func withBugs(ids ...bugID) bugs {
	b := processMutant()
	for _, id := range ids {
		b |= 1 << id
	}
	return b
}

// processMutant is the mutant KVBRIDGE_MUTANT (a number or a name) turns
// on in every core of the process.
var processMutant = func() func() bugs {
	v := os.Getenv("KVBRIDGE_MUTANT")
	if v == "" {
		return func() bugs { return 0 }
	}
	for id := bugID(1); id < bugCount; id++ {
		if v == id.String() || v == strconv.Itoa(int(id)) {
			fmt.Fprintf(os.Stderr, "kvmanager: mutant %d (%v) on in every core\n", id, id)
			return func() bugs { return 1 << id }
		}
	}
	panic("kvmanager: KVBRIDGE_MUTANT=" + v + ": no such mutant")
}()

// bugs holds one bit per mutant.
var _ [64 - bugCount]struct{}
