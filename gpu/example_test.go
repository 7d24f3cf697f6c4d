package gpu_test

import (
	"errors"
	"fmt"

	"github.com/kvbridge/kvbridge/gpu"
)

// Listing a node's GPUs, as an operator places ranks and NICs by them (on
// a node without a GPU or driver: ErrNoGPU). TestDiscoverOnAMockDGXH200
// runs the same listing on go-nvml's mock machine.
func ExampleDiscover() {
	devs, err := gpu.Discover()
	if errors.Is(err, gpu.ErrNoGPU) {
		fmt.Println("no GPU here")
		return
	} else if err != nil {
		panic(err)
	}
	for _, d := range devs {
		fmt.Println(d.Index, d.Name, d.MemoryTotal>>30, "GiB, PCI", d.PCIBusID, "NUMA", d.NUMANode, "NVLink peers", d.NVLinkPeers)
	}
}
