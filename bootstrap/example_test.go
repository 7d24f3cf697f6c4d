package bootstrap_test

import (
	"context"
	"fmt"

	"github.com/kvbridge/kvbridge/bootstrap"
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
	prefill, err := bootstrap.NewLoop(bootstrap.LoopConfig{
		Identity: wire.From{Role: wire.RolePrefill, Instance: "prefill-a", Rank: 0},
		Bind:     "tcp://127.0.0.1:*",
		Handler:  func(m wire.Message) { got <- m },
		Auth:     auth,
	})
	if err != nil {
		panic(err)
	}
	defer prefill.Close()
	decode, err := bootstrap.NewLoop(bootstrap.LoopConfig{
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

// A prefill rank registers; a decode rank discovers it.
func ExampleClient() {
	auth, err := bootstrap.NewAuth([]byte("the deployment's shared secret"))
	if err != nil {
		panic(err)
	}
	srv, err := bootstrap.NewServer(bootstrap.ServerConfig{Token: auth.BootstrapToken()})
	if err != nil {
		panic(err)
	}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		panic(err)
	}
	defer srv.Close(context.Background())
	c := bootstrap.NewClient(srv.URL())
	c.Token = auth.BootstrapToken() // writes need it; reads do not
	ctx := context.Background()
	_, err = c.RegisterRank(ctx, bootstrap.RankRecord{Instance: "prefill-a", DPSize: 1, TPSize: 1, PPSize: 1,
		Endpoint: "tcp://127.0.0.1:17000", PageSize: 16, DType: "bf16", Compat: "v1:llama3-8b"})
	if err != nil {
		panic(err)
	}
	topo, _ := c.Topology(ctx)
	rank, _ := c.Rank(ctx, 0, 0, 0)
	fmt.Println(topo.Instance, topo.PageSize, topo.DType, rank.Endpoint)
	// Output: prefill-a 16 bf16 tcp://127.0.0.1:17000
}
