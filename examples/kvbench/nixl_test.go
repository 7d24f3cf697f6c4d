package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestNIXLRounds: the nixl mode's rounds start one program later each
// round, and each round's ratio is ours against that round's fastest
// reference (seconds: the smallest), not against medians across rounds.
func TestNIXLRounds(t *testing.T) {
	assert.Equal(t, []int{0, 1, 2}, rotated(3, 0))
	assert.Equal(t, []int{1, 2, 0}, rotated(3, 1))
	assert.Equal(t, []int{2, 0, 1}, rotated(3, 5))
	ours := []float64{2, 4, 5}
	a, b := []float64{1, 5, 4}, []float64{3, 2, 6}
	assert.Equal(t, []float64{0.5, 0.5, 0.8}, vsFastest(ours, a, b))
	assert.Equal(t, []float64{0.5, 1.25, 0.8}, vsFastest(ours, a))
	med, lo, hi := spread([]float64{0.9, 1.1, 0.8, 1.0, 0.95})
	assert.Equal(t, []float64{0.95, 0.8, 1.1}, []float64{med, lo, hi})
}
