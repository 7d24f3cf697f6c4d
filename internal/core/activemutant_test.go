package core

import "testing"

// activeMutant names the source mutant laid over this package for the run
// (scripts/srcmutants replaces this file along with the mutated source);
// it is "" in every other build.
const activeMutant = ""

// fixedAndMutant runs body as the test (fixed true): it must pass on the
// code as it is. When mutant is the one laid over the package (make
// mutants), body also runs with fixed false, where it must see the bug as
// described — while the first run, which asserts the fixed behaviour,
// fails and catches the mutant. Only the first runs in make test.
func fixedAndMutant(t *testing.T, mutant string, body func(t *testing.T, fixed bool)) {
	if activeMutant == mutant { // first: a run with -failfast stops at the failure below
		t.Run("with "+mutant, func(t *testing.T) { body(t, false) })
	}
	t.Run("fixed", func(t *testing.T) { body(t, true) })
}
