package control

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/kvbridge/kvbridge/internal/wire"
	"go.uber.org/goleak"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// The test binary doubles as a peer process: with KVBRIDGE_TEST_CHILD=peer
// it runs a control loop that answers PINGs, tells the parent its endpoint
// by sending it an ABORT, and waits to be killed.
func TestMain(m *testing.M) {
	if os.Getenv("KVBRIDGE_TEST_CHILD") == "peer" {
		epoch, _ := strconv.ParseUint(os.Getenv("KVBRIDGE_TEST_PARENT_EPOCH"), 10, 64)
		os.Exit(runChildPeer(os.Getenv("KVBRIDGE_TEST_PARENT"), epoch))
	}
	goleak.VerifyTestMain(m)
}

func runChildPeer(parent string, epoch uint64) int {
	l, err := NewLoop(LoopConfig{Identity: wire.From{Role: wire.RolePrefill, Instance: "child", Rank: 0},
		Bind: "tcp://127.0.0.1:*", Handler: func(wire.Message) {}, Auth: testAuth()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := l.Send(wire.Peer{Endpoint: parent, Epoch: epoch}, &wire.Abort{Room: 1, Reason: "child up"}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	select {} // until killed
}
