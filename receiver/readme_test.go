package receiver_test

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEExample: README's embedding example is this package's
// Example, character for character, so the code a reader copies compiles
// and runs (go test runs the Example and checks its output).
func TestREADMEExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, example, ok := strings.Cut(string(src), "\nfunc Example() {\n")
	example, _, ok2 := strings.Cut(example, "\n}\n")
	_, block, ok3 := strings.Cut(string(readme), "\n## A prefill and a decode rank in one program\n")
	_, block, ok4 := strings.Cut(block, "\n```go\nfunc Example() {\n")
	block, _, ok5 := strings.Cut(block, "\n}\n```\n")
	if !ok || !ok2 || !ok3 || !ok4 || !ok5 {
		t.Fatalf("example found %v %v, README's section and code block found %v %v %v", ok, ok2, ok3, ok4, ok5)
	}
	if block != example {
		t.Errorf("README's example differs from receiver.Example: paste example_test.go's Example into README.\nREADME:\n%s\nExample:\n%s", block, example)
	}
}
