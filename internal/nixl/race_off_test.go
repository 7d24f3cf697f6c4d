//go:build !race

package nixl

const raceOn = false
