//go:build !race

package core

// raceOn: see race_on_test.go.
const raceOn = false

const (
	raceStates = 0 // unused: no bound
	raceSeeds  = 1
)
