// Package cli is what the example binaries share on their command line:
// flags parsed with one-line errors, and start-up failures as one line.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// Parse parses args into fs. With -h it prints fs's usage to stderr and
// returns (0, false); on a bad flag it prints one line naming it and a
// pointer to -h (not the whole usage) and returns (2, false); otherwise
// (0, true): go on.
func Parse(fs *flag.FlagSet, args []string) (code int, ok bool) {
	return parse(fs, args, os.Stderr)
}

func parse(fs *flag.FlagSet, args []string, stderr io.Writer) (int, bool) {
	fs.SetOutput(io.Discard) // the flag package prints the error and the whole usage: say it once, below
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return 0, false
	default:
		fmt.Fprintf(stderr, "%s: %v (%s -h lists the flags)\n", fs.Name(), err, fs.Name())
		return 2, false
	}
}

// Fail prints a start-up failure as one line, "name: what: err", and
// returns the exit code 1.
func Fail(name, what string, err error) int {
	fmt.Fprintf(os.Stderr, "%s: %s: %v\n", name, what, err)
	return 1
}

// OneOf checks an enumerated flag's value: an error naming the flag and
// every valid value when v is not one of them.
func OneOf(flagName, v string, valid ...string) error {
	for _, w := range valid {
		if v == w {
			return nil
		}
	}
	return fmt.Errorf("-%s %q: want one of %v", flagName, v, valid)
}
