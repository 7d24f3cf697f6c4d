package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDocFigures: docs/ARCHITECTURE.md's count of source mutants is the
// length of the list here, and names each mutant it names that exists.
func TestDocFigures(t *testing.T) {
	b, err := os.ReadFile("../../docs/ARCHITECTURE.md")
	require.NoError(t, err)
	doc := strings.Join(strings.Fields(string(b)), " ")
	n := len(mutants)
	for _, want := range []string{
		fmt.Sprintf("%d source mutants laid over the code", n),
		fmt.Sprintf("%d of %d caught);", n, n),
		fmt.Sprintf("(`scripts/srcmutants`; %d in all", n),
	} {
		assert.True(t, strings.Contains(doc, want), "docs/ARCHITECTURE.md does not say %q: update its figure", want)
	}
	seen := map[string]bool{}
	for _, m := range mutants {
		assert.False(t, seen[m.name], "mutant %q listed twice", m.name)
		seen[m.name] = true
	}
}

// TestMutantsMatchTheCode: every mutant's text occurs exactly once where it
// edits (make mutants would stop on the first that does not), so a change
// that moves the code fails make test, not a later make mutants.
func TestMutantsMatchTheCode(t *testing.T) {
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	tmp := t.TempDir()
	for i, m := range mutants {
		_, err := overlay(root, tmp, i, m)
		assert.NoError(t, err, "mutant %q", m.name)
	}
}
