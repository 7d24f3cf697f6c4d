package control_test

import (
	"fmt"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/control"
	"github.com/kvbridge/kvbridge/internal/wire"
)

// Two ranks on loopback: decode sends an ABORT, prefill's handler gets it.
// Both hold the deployment's shared secret (KVBRIDGE_SECRET in production).
func Example_controlLoop() {
	auth, err := bootstrap.NewAuth([]byte("the deployment's shared secret"))
	if err != nil {
		panic(err)
	}
	got := make(chan wire.Message, 1)
	prefill, err := control.NewLoop(control.LoopConfig{
		Identity: wire.From{Role: wire.RolePrefill, Instance: "prefill-a", Rank: 0},
		Bind:     "tcp://127.0.0.1:*",
		Handler:  func(m wire.Message) { got <- m },
		Auth:     auth,
	})
	if err != nil {
		panic(err)
	}
	defer prefill.Close()
	decode, err := control.NewLoop(control.LoopConfig{
		Identity: wire.From{Role: wire.RoleDecode, Instance: "decode-a", Rank: 0},
		Bind:     "tcp://127.0.0.1:*",
		Handler:  func(wire.Message) {},
		Auth:     auth,
	})
	if err != nil {
		panic(err)
	}
	defer decode.Close()

	// A message names the process it is for: its epoch comes with the
	// prefill rank's bootstrap record (or any message it sent).
	decode.Send(wire.Peer{Endpoint: prefill.Endpoint(), Epoch: prefill.Identity().Epoch}, &wire.Abort{Room: 7, Reason: "client left"})
	m := (<-got).(*wire.Abort)
	fmt.Println(m.Type(), m.Room, m.Reason, m.From.Instance)
	// Output: ABORT 7 client left decode-a
}
