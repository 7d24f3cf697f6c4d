package kvmanager

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestDocFigures: the counts docs/ARCHITECTURE.md gives for what the core
// is checked with — its mutants and the exhaustive configurations — are
// the code's, so they cannot go stale unnoticed.
func TestDocFigures(t *testing.T) {
	b, err := os.ReadFile("../docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Join(strings.Fields(string(b)), " ")
	n := int(bugCount) - 1
	for _, want := range []string{
		fmt.Sprintf("%d realistic bugs in the core", n),
		fmt.Sprintf("(%d of %d caught;", n, n),
		fmt.Sprintf("every interleaving of %d small configurations", len(simExhaustiveConfigs())),
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("docs/ARCHITECTURE.md does not say %q: update its figure", want)
		}
	}
}
