package core_test

import (
	"fmt"
	"time"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/wire"
)

// The Python connectors' worst race: decode's ABORT is processed before the
// prefill scheduler has created the sender. The core remembers the abort
// (and answers it at once: nothing can be in flight), so the sender starts
// Failed with its reason instead of waiting for a timeout.
func Example_abortBeforeSender() {
	cfg := core.CoreConfig{Role: core.RolePrefill, Compat: "v1:example",
		Registry: core.DefaultRegistryConfig(), QuarantineTimeout: 2 * time.Minute, RegisterRetry: time.Second}
	c, err := core.NewCore(cfg)
	if err != nil {
		panic(err)
	}
	const room = 1001
	now := time.Unix(1_000_000, 0)
	decode := wire.From{Role: "decode", Instance: "d", Endpoint: "tcp://10.0.0.2:5000", Epoch: 7}

	c.Step(now, core.Received{Msg: &wire.Abort{From: decode, Room: room, Reason: "client disconnected"}})
	for _, e := range c.Effects() {
		fmt.Printf("effect: %v %T to %s\n", e.Kind, e.Msg, e.To.Endpoint)
	}

	out := c.Step(now, core.CreateSender{Room: room})
	fmt.Println("sender starts:", out.Result.Status)
	reason, _ := c.Failure(room)
	fmt.Println("reason:", reason)
	// Output:
	// effect: EffectSend *wire.AbortAck to tcp://10.0.0.2:5000
	// sender starts: Failed
	// reason: aborted: client disconnected by decode/d/0
}

func ExampleMinPoll() {
	fmt.Println(core.MinPoll(core.Success, core.Transferring, core.Success))
	fmt.Println(core.MinPoll(core.Success, core.Failed))
	// Output:
	// Transferring
	// Failed
}
