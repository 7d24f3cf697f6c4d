package cli

import (
	"bytes"
	"flag"
	"os"
	"testing"

	"github.com/kvbridge/kvbridge/internal/leakcheck"
	"github.com/stretchr/testify/assert"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }

// TestParse: -h prints the usage and exits 0; a bad flag is one line with
// a pointer to -h, exit 2; good flags go on.
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		code       int
		ok         bool
		want, nope string
	}{
		{[]string{"-n", "3"}, 0, true, "", "usage"},
		{[]string{"-h"}, 0, false, "usage: tool", ""},
		{[]string{"-x"}, 2, false, "tool: flag provided but not defined: -x (tool -h lists the flags)\n", "usage"},
		{[]string{"-n", "three"}, 2, false, `tool: invalid value "three" for flag -n`, "usage"},
	} {
		fs := flag.NewFlagSet("tool", flag.ContinueOnError)
		fs.Int("n", 1, "a number")
		fs.Usage = func() { fs.Output().Write([]byte("usage: tool [flags]\n")) }
		var out bytes.Buffer
		code, ok := parse(fs, tc.args, &out)
		assert.Equal(t, tc.code, code, tc.args)
		assert.Equal(t, tc.ok, ok, tc.args)
		assert.Contains(t, out.String(), tc.want, tc.args)
		if tc.nope != "" {
			assert.NotContains(t, out.String(), tc.nope, tc.args)
		}
		if !tc.ok && tc.code == 2 {
			assert.Equal(t, 1, bytes.Count(out.Bytes(), []byte("\n")), "%v: more than one line: %q", tc.args, out.String())
		}
	}
}

// TestOneOf names the flag and every valid value.
func TestOneOf(t *testing.T) {
	assert.NoError(t, OneOf("engine", "ucx", "ucx", "libnixl"))
	err := OneOf("engine", "foo", "ucx", "libnixl")
	if assert.Error(t, err) {
		assert.Equal(t, `-engine "foo": want one of [ucx libnixl]`, err.Error())
	}
}
