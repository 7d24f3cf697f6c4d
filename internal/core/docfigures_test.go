package core

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestDocFigures: the counts docs/ARCHITECTURE.md gives for what the core
// is checked with — the exhaustive configurations — are the code's (the
// mutants' are scripts/srcmutants'), so they cannot go stale unnoticed.
func TestDocFigures(t *testing.T) {
	b, err := os.ReadFile("../../docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Join(strings.Fields(string(b)), " ")
	for _, want := range []string{
		fmt.Sprintf("every interleaving of %d small configurations", len(simExhaustiveConfigs())),
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("docs/ARCHITECTURE.md does not say %q: update its figure", want)
		}
	}
}
