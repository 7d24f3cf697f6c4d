//go:build race

package nixl

// raceOn: built with the race detector, which slows the engine below the
// rates some tests need (TestUCXNoLostWakeCrossProcess).
const raceOn = true
