package ident

import (
	"flag"
	"testing"

	"go.uber.org/goleak"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
