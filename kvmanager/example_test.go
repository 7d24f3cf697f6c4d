package kvmanager_test

import (
	"fmt"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/kvmanager"
)

// The Python connectors' worst race: decode's ABORT is processed before the
// prefill scheduler has created the sender. The core remembers the abort
// (and answers it at once: nothing can be in flight), so the sender starts
// Failed with its reason instead of waiting for a timeout.
func Example_abortBeforeSender() {
	cfg := kvmanager.CoreConfig{Role: kvmanager.RolePrefill, Compat: "v1:example",
		Registry: kvmanager.DefaultRegistryConfig(), QuarantineTimeout: 2 * time.Minute, RegisterRetry: time.Second}
	core, err := kvmanager.NewCore(cfg)
	if err != nil {
		panic(err)
	}
	const room = 1001
	now := time.Unix(1_000_000, 0)
	decode := bootstrap.From{Role: "decode", Instance: "d", Endpoint: "tcp://10.0.0.2:5000", Epoch: 7}

	core.Step(now, kvmanager.Received{Msg: &bootstrap.Abort{From: decode, Room: room, Reason: "client disconnected"}})
	for _, e := range core.Effects() {
		fmt.Printf("effect: %v %T to %s\n", e.Kind, e.Msg, e.To.Endpoint)
	}

	out := core.Step(now, kvmanager.CreateSender{Room: room})
	fmt.Println("sender starts:", out.Result.Status)
	reason, _ := core.Failure(room)
	fmt.Println("reason:", reason)
	// Output:
	// effect: EffectSend *bootstrap.AbortAck to tcp://10.0.0.2:5000
	// sender starts: Failed
	// reason: aborted: client disconnected by decode/d/0
}

func ExampleMinPoll() {
	fmt.Println(kvmanager.MinPoll(kvmanager.Success, kvmanager.Transferring, kvmanager.Success))
	fmt.Println(kvmanager.MinPoll(kvmanager.Success, kvmanager.Failed))
	// Output:
	// Transferring
	// Failed
}
