package kvmanager

import "testing"

// TestMutantList prints the mutants this build knows (make mutants runs the
// package's tests once with each turned on in every core).
func TestMutantList(t *testing.T) {
	for id := bugID(1); id < bugCount; id++ {
		if id.String() == "none" {
			t.Fatalf("mutant %d has no name", id)
		}
		t.Logf("mutant %d %v", id, id)
	}
}
