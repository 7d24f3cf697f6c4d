package gpu

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Discovery on go-nvml's mock DGX H200, as Discover does on a real node
// (without a GPU it returns ErrNoGPU).
func ExampleDiscover() {
	machine := dgxh200.New()
	for i, d := range machine.Devices {
		dev := d.(*server.Device)
		node := i / 4
		dev.GetNumaNodeIdFunc = func() (int, nvml.Return) { return node, nvml.SUCCESS }
		dev.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	}
	devs, err := discoverWith(machine)
	if err != nil {
		panic(err)
	}
	fmt.Println(len(devs), devs[0].Name, devs[0].MemoryTotal>>30, "GiB, NUMA", devs[7].NUMANode)
	// Output: 8 NVIDIA H200 141GB HBM3e 141 GiB, NUMA 1
}
