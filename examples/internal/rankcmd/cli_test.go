package rankcmd

import (
	"net"
	"strings"
	"testing"

	"github.com/kvbridge/kvbridge/internal/capture"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStartupErrorsAreOneLine: a bad flag, a bad enumerated value and a
// rank that cannot start each print one line naming the flag and the
// cause — not the whole usage, not a zap JSON record with a stack trace —
// and exit 2 (a bad flag) or 1 (issue 50: an unknown flag printed 95 lines
// of usage, -engine foo said "engine unavailable", a start-up error was
// zap JSON with a stack).
func TestStartupErrorsAreOneLine(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"an unknown flag", []string{"-no-such-flag"}, 2, []string{"prefill: flag provided but not defined: -no-such-flag", "prefill -h"}},
		{"a flag without its value", []string{"-pages"}, 2, []string{"-pages", "prefill -h"}},
		{"an engine that does not exist", []string{"-insecure", "-engine", "foo"}, 2, []string{`-engine "foo"`, "ucx", "libnixl", "loopback", "auto"}},
		{"a model that does not exist", []string{"-insecure", "-model", "gpt-9"}, 2, []string{`-model "gpt-9"`, "llama3-8b"}},
		{"a page layout that does not exist", []string{"-insecure", "-page-layout", "XYZ"}, 2, []string{"-page-layout"}},
		{"an HTTP address in use", []string{"-insecure", "-engine", "loopback", "-pages", "8", "-warm=false", "-model", "tiny", "-http", busy.Addr().String()}, 1,
			[]string{"-http " + busy.Addr().String(), "address already in use"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var code int
			out := capture.Stderr(t, func() { code = Main(kvmanager.RolePrefill, tc.args) })
			assert.Equal(t, tc.code, code, out)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			last := lines[len(lines)-1]
			for _, l := range lines[:len(lines)-1] {
				// Only zap's warnings (-insecure) may come before it.
				assert.Contains(t, l, `"level":"warn"`, "a line before the error:\n%s", out)
			}
			assert.NotContains(t, out, "usage:", "the whole usage printed")
			assert.NotContains(t, last, "stacktrace")
			assert.True(t, strings.HasPrefix(last, "prefill: "), "the error line does not start with the binary's name: %q", last)
			for _, w := range tc.want {
				assert.Contains(t, last, w)
			}
		})
	}
}
