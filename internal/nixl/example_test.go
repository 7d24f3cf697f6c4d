package nixl_test

import (
	"context"
	"fmt"

	"github.com/kvbridge/kvbridge/internal/nixl"
)

// Two agents in one process: write a buffer with a notification.
func Example() {
	src, _ := nixl.Open(nixl.Config{Name: "example-prefill", Engine: nixl.EngineLoopback})
	defer src.Close()
	dst, _ := nixl.Open(nixl.Config{Name: "example-decode", Engine: nixl.EngineLoopback})
	defer dst.Close()

	_, from, _ := src.Alloc(16)
	_, to, _ := dst.Alloc(16)
	copy(from, "hello, KV cache!")

	md, _ := dst.Metadata()
	peer, _ := src.LoadRemote(md)
	local, _ := src.PrepLocal(nixl.DRAM, []nixl.Desc{nixl.BytesDesc(from)})
	remote, _ := src.PrepRemote(peer, nixl.DRAM, []nixl.Desc{nixl.BytesDesc(to)})
	x, _ := src.NewXfer(nixl.Write, local, []int{0}, remote, []int{0}, []byte("kvb1:7:0:0:1"))
	if err := src.Post(x); err != nil {
		panic(err)
	}
	if st, err := src.Wait(context.Background(), x); st != nixl.Done {
		panic(err)
	}
	notifs, _ := dst.Notifs()
	fmt.Println(string(to), notifs[0].Remote, string(notifs[0].Msg))
	// Output: hello, KV cache! example-prefill kvb1:7:0:0:1
}
