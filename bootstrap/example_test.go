package bootstrap_test

import (
	"context"
	"fmt"

	"github.com/kvbridge/kvbridge/bootstrap"
)

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
