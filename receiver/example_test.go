package receiver_test

import (
	"context"
	"fmt"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/nixl"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/kvbridge/kvbridge/transfer"
)

// A prefill and a decode rank in one process (loopback engine): the decode
// side asks for a room, the prefill side sends its pages. Every rank and the
// bootstrap server share one secret (KVBRIDGE_SECRET in production).
func Example() {
	auth, err := bootstrap.NewAuth([]byte("the deployment's shared secret"))
	if err != nil {
		panic(err)
	}
	srv, err := bootstrap.NewServer(bootstrap.ServerConfig{Token: auth.BootstrapToken()})
	if err != nil {
		panic(err)
	}
	srv.Start("127.0.0.1:0")
	defer srv.Close(context.Background())
	config := func(role kvmanager.Role, name string) kvmanager.Config {
		cfg := kvmanager.DefaultConfig(role)
		cfg.Auth = auth
		cfg.Instance, cfg.Compat, cfg.BootstrapURL = name, "v1:example", srv.URL()
		cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
		cfg.Layout = transfer.Layout{Kind: transfer.DRAM, PageBytes: 4096, AuxItemBytes: 64, Aux: transfer.Desc{Len: 64 * 8},
			Regions: []transfer.Desc{{Len: 64 * 4096}, {Len: 64 * 4096}}} // one layer: K and V, 64 pages
		return cfg
	}
	prefill, err := kvmanager.NewPrefill(config(kvmanager.RolePrefill, "example-prefill"))
	if err != nil {
		panic(err)
	}
	decode, err := kvmanager.NewDecode(config(kvmanager.RoleDecode, "example-decode"))
	if err != nil {
		panic(err)
	}
	defer prefill.Close()
	defer decode.Close()
	ctx := context.Background()

	// Decode: ask for room 7 into pages 10..13 and aux slot 2.
	r, _ := receiver.New(decode, 7)
	r.Init(ctx, kvmanager.RequestSpec{DstPages: []uint32{10, 11, 12, 13}, AuxIndex: 2})

	// Prefill: send pages 0..3 and aux slot 5 once the request is in.
	s, _ := sender.New(prefill, 7)
	s.Init()
	s.WaitReady(ctx)
	s.Send([]uint32{0, 1, 2, 3}, true, 5)

	st, _ := r.Wait(ctx)
	fmt.Println("decode:", st)
	st, _ = s.Wait(ctx)
	fmt.Println("prefill:", st)
	r.Clear()
	s.Clear()
	// Output:
	// decode: Success
	// prefill: Success
}
