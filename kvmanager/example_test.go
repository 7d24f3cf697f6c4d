package kvmanager_test

import (
	"context"
	"fmt"

	"github.com/kvbridge/kvbridge/kvmanager"
)

// The Python connectors' worst race: decode's ABORT is processed before the
// prefill scheduler has created the sender. kvbridge remembers the abort, so
// the sender starts Failed with its reason instead of waiting for a timeout.
func Example_abortBeforeSender() {
	reg, err := kvmanager.NewRegistry(kvmanager.DefaultRegistryConfig())
	if err != nil {
		panic(err)
	}
	const room = 1001

	res := reg.Abort(room, "client disconnected")
	fmt.Println("abort:", res.Outcome)

	res = reg.Create(room, kvmanager.RolePrefill)
	fmt.Println("sender starts:", res.Status)

	reason, _ := reg.Failure(room)
	fmt.Println("reason:", reason)

	st, err := reg.Wait(context.Background(), room) // returns at once
	fmt.Println("wait:", st, err)

	fmt.Println("post a chunk:", reg.Posted(room).Outcome)
	// Output:
	// abort: Tombstoned
	// sender starts: Failed
	// reason: aborted: client disconnected
	// wait: Failed <nil>
	// post a chunk: IgnoredTerminal
}

func ExampleMinPoll() {
	fmt.Println(kvmanager.MinPoll(kvmanager.Success, kvmanager.Transferring, kvmanager.Success))
	fmt.Println(kvmanager.MinPoll(kvmanager.Success, kvmanager.Failed))
	// Output:
	// Transferring
	// Failed
}
