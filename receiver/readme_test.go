package receiver_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestREADMEExample: README's embedding example is this package's
// Example, character for character, so the code a reader copies compiles
// and runs (go test runs the Example and checks its output).
func TestREADMEExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	src, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	_, example, ok := strings.Cut(string(src), "\nfunc Example() {\n")
	example, _, ok2 := strings.Cut(example, "\n}\n")
	_, block, ok3 := strings.Cut(string(readme), "\n## A prefill and a decode rank in one program\n")
	_, block, ok4 := strings.Cut(block, "\n```go\nfunc Example() {\n")
	block, _, ok5 := strings.Cut(block, "\n}\n```\n")
	require.True(t, ok && ok2 && ok3 && ok4 && ok5, "example found %v %v, README's section and code block found %v %v %v", ok, ok2, ok3, ok4, ok5)
	assert.Equal(t, example, block, "README's example differs from receiver.Example: paste example_test.go's Example into README.")
}

// TestDocLinks: every relative link in README.md and docs/*.md names a
// file that exists and, with a #fragment, a heading in it (GitHub's
// anchors), so the split of README into docs/ cannot leave a link behind.
func TestDocLinks(t *testing.T) {
	files, err := filepath.Glob("../docs/*.md")
	require.NoError(t, err)
	files = append(files, "../README.md", "../DEVELOPERS.md", "../BENCHMARKS.md")
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), path)
			}
			body, err := os.ReadFile(dest)
			if !assert.NoError(t, err, "%s: link %q", f, target) {
				continue
			}
			checked++
			if frag != "" {
				assert.Contains(t, anchors(string(body)), frag, "%s: link %q: %s has no heading with that anchor", f, target, dest)
			}
		}
	}
	require.GreaterOrEqual(t, checked, 20, "links checked: the pattern finds none")
}

// anchors are the GitHub anchors of a Markdown file's headings.
func anchors(md string) []string {
	var out []string
	drop := regexp.MustCompile(`[^\p{L}\p{N}\- ]`)
	for _, l := range strings.Split(md, "\n") {
		if h, ok := strings.CutPrefix(strings.TrimLeft(l, "#"), " "); ok && strings.HasPrefix(l, "#") {
			a := drop.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), "")
			out = append(out, strings.ReplaceAll(a, " ", "-"))
		}
	}
	return out
}
