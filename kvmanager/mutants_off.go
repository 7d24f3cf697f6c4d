//go:build !kvbmutants

package kvmanager

// bugs is empty in a production build: no mutant is compiled in.
type bugs struct{}

func (bugs) on(bugID) bool { return false }

// mutantsBuilt reports whether this build can turn mutants on.
const mutantsBuilt = false

func processMutant() bugs { return bugs{} }

func withBugs(ids ...bugID) bugs { return bugs{} }
