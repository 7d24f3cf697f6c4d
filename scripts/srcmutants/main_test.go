package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
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
		edits := m.edits()
		for k, e := range edits {
			b, err := os.ReadFile(filepath.Join(root, e.file))
			require.NoError(t, err)
			// The file as the mutant's other edits leave it (one may add
			// the import this edit's text uses).
			src := string(b)
			for j, o := range edits {
				if j != k && o.file == e.file {
					src = strings.Replace(src, o.old, o.new, 1)
				}
			}
			for _, name := range undeclaredSelectors(src, e.new) {
				t.Errorf("mutant %q uses %s. in %s, which that file neither imports nor declares: it would not compile (and would stop make mutants)", m.name, name, e.file)
			}
		}
	}
}

// selectorBase matches the base of a selector such as os.Getenv.
var selectorBase = regexp.MustCompile(`\b([a-z][A-Za-z0-9_]*)\.[A-Za-z_]`)

// undeclaredSelectors lists the selector bases (os in os.Getenv) of a
// mutant's new text that its file names nowhere and the text does not
// declare: a package the file does not import (a mutant that no longer
// compiles after its file's imports changed, as nixl-lib-from-env did
// once nixl's FromEnv moved).
func undeclaredSelectors(src, text string) []string {
	var out []string
	seen := map[string]bool{}
	for _, m := range selectorBase.FindAllStringSubmatch(text, -1) {
		name := m[1]
		if seen[name] {
			continue
		}
		seen[name] = true
		word := regexp.MustCompile(`\b` + name + `\b`)
		declared := regexp.MustCompile(`(\bvar ` + name + `\b|\b` + name + `(, [A-Za-z_]+)* :?=|\bfunc\([^)]*\b` + name + `\b)`)
		if !word.MatchString(src) && !declared.MatchString(text) {
			out = append(out, name)
		}
	}
	return out
}
