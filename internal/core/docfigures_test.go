package core

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDocFigures: the counts docs/ARCHITECTURE.md gives for what the core
// is checked with — the exhaustive configurations — are the code's (the
// mutants' are scripts/srcmutants'), so they cannot go stale unnoticed.
func TestDocFigures(t *testing.T) {
	b, err := os.ReadFile("../../docs/ARCHITECTURE.md")
	require.NoError(t, err)
	doc := strings.Join(strings.Fields(string(b)), " ")
	for _, want := range []string{
		fmt.Sprintf("every interleaving of %d small configurations", len(simExhaustiveConfigs())),
	} {
		assert.True(t, strings.Contains(doc, want), "docs/ARCHITECTURE.md does not say %q: update its figure", want)
	}
}
