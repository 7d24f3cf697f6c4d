//go:build race

package core

// raceOn: built with the race detector, which slows the simulator and the
// model checker about nine times. Under it the checkers run a bounded
// share of their exploration (raceStates, raceSeeds): enough to run every
// configuration's harness and the core under the detector. make test also
// runs them whole without it (the Makefile's test-checkers), where their
// coverage is asserted.
const raceOn = true

// raceStates bounds each exhaustive exploration under the race detector;
// raceSeeds divides the swarms' seed counts.
const (
	raceStates = 500
	raceSeeds  = 12
)
