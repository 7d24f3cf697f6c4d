package gpu

import (
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/stretchr/testify/require"
)

// machine is a go-nvml mock DGX with NUMA and NVLink answers added (the
// mock leaves them unimplemented): GPUs 0–3 on NUMA 0, 4–7 on NUMA 1, each
// with 18 active NVLinks to four NVSwitches.
func machine(t *testing.T, s *server.Server) *server.Server {
	t.Helper()
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		node := i / 4
		// The mock's PciInfo has no bus id; give each GPU its own.
		bus := fmt.Sprintf("00000000:%02x:00.0", 0x18+0x10*i)
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pciInfo(bus), nvml.SUCCESS }
		dev.GetNumaNodeIdFunc = func() (int, nvml.Return) { return node, nvml.SUCCESS }
		dev.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			if link >= 18 {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		dev.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
			return pciInfo(fmt.Sprintf("00000000:0%c:00.0", 'a'+link%4)), nvml.SUCCESS
		}
	}
	return s
}

func pciInfo(bus string) nvml.PciInfo {
	var p nvml.PciInfo
	for k, c := range []byte(bus) {
		p.BusId[k] = int8(c)
	}
	return p
}

func TestDiscoverDGX(t *testing.T) {
	for name, s := range map[string]*server.Server{"H100": dgxh100.New(), "H200": dgxh200.New()} {
		t.Run(name, func(t *testing.T) {
			devs, err := discoverWith(machine(t, s))
			require.NoError(t, err)
			require.Len(t, devs, 8, "devices")
			for i, d := range devs {
				require.Equal(t, i, d.Index, "device %d: %+v", i, d)
				require.NotEmpty(t, d.UUID, "device %d: %+v", i, d)
				require.Contains(t, d.Name, name, "device %d: %+v", i, d)
				require.NotZero(t, d.MemoryTotal, "device %d: %+v", i, d)
				require.NotEmpty(t, d.PCIBusID, "device %d: %+v", i, d)
				require.Equal(t, i/4, d.NUMANode, "device %d: %+v", i, d)
				require.Len(t, d.NVLinkPeers, 18, "device %d: %+v", i, d)
			}
			require.NotEqual(t, devs[0].UUID, devs[1].UUID, "devices not distinct")
			require.NotEqual(t, devs[0].PCIBusID, devs[1].PCIBusID, "devices not distinct")
			require.Equal(t, "00000000:38:00.0", devs[2].PCIBusID, "devices not distinct")
			if name == "H200" {
				require.GreaterOrEqual(t, devs[0].MemoryTotal, uint64(140<<30), "H200 memory")
			}
		})
	}
}

// After a failed Init no other NVML call may happen: every other function
// of this mock is nil, so any call would panic.
func TestDiscoverInitFailureMakesNoOtherCall(t *testing.T) {
	for _, ret := range []nvml.Return{nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED, nvml.ERROR_NO_PERMISSION} {
		lib := &mock.Interface{InitFunc: func() nvml.Return { return ret }}
		_, err := discoverWith(lib)
		require.ErrorIs(t, err, ErrNoGPU, "Init %d", ret)
		require.Len(t, lib.InitCalls(), 1, "calls after a failed Init")
		require.Empty(t, lib.ShutdownCalls(), "calls after a failed Init")
	}
}

func TestDiscoverNoDevices(t *testing.T) {
	lib := &mock.Interface{
		InitFunc:           func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return 0, nvml.SUCCESS },
	}
	_, err := discoverWith(lib)
	require.ErrorIs(t, err, ErrNoGPU, "zero devices")
	require.Len(t, lib.ShutdownCalls(), 1, "Shutdown not called after a successful Init")
}

// Every failure return names the call and the device, and Shutdown still runs.
func TestDiscoverFailureReturns(t *testing.T) {
	boom := nvml.ERROR_GPU_IS_LOST
	for _, tc := range []struct {
		call string
		set  func(s *server.Server, d *server.Device)
	}{
		{"nvmlDeviceGetCount", func(s *server.Server, d *server.Device) {
			s.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, boom }
		}},
		{"nvmlDeviceGetHandleByIndex", func(s *server.Server, d *server.Device) {
			s.DeviceGetHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, boom }
		}},
		{"nvmlDeviceGetUUID", func(s *server.Server, d *server.Device) {
			d.GetUUIDFunc = func() (string, nvml.Return) { return "", boom }
		}},
		{"nvmlDeviceGetName", func(s *server.Server, d *server.Device) {
			d.GetNameFunc = func() (string, nvml.Return) { return "", boom }
		}},
		{"nvmlDeviceGetMemoryInfo", func(s *server.Server, d *server.Device) {
			d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, boom }
		}},
		{"nvmlDeviceGetPciInfo", func(s *server.Server, d *server.Device) {
			d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, boom }
		}},
		{"nvmlDeviceGetNumaNodeId", func(s *server.Server, d *server.Device) {
			d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return 0, boom }
		}},
		{"nvmlDeviceGetNvLinkState", func(s *server.Server, d *server.Device) {
			d.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, boom }
		}},
		{"nvmlDeviceGetNvLinkRemotePciInfo", func(s *server.Server, d *server.Device) {
			d.GetNvLinkRemotePciInfoFunc = func(int) (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, boom }
		}},
	} {
		t.Run(tc.call, func(t *testing.T) {
			s := machine(t, dgxh100.New())
			shutdowns := 0
			s.ShutdownFunc = func() nvml.Return { shutdowns++; return nvml.SUCCESS }
			tc.set(s, s.Devices[3].(*server.Device))
			_, err := discoverWith(s)
			var ne *nvmlError
			require.ErrorAs(t, err, &ne)
			require.True(t, strings.HasPrefix(ne.Call, tc.call), "got %v", err)
			require.Equal(t, boom, ne.Return, "got %v", err)
			require.Equal(t, 1, shutdowns, "Shutdown calls")
		})
	}
}

func TestDiscoverOptionalQueries(t *testing.T) {
	// NUMA and NVLink unsupported (PCIe GPUs, old drivers): not errors.
	s := dgxh100.New()
	for _, d := range s.Devices {
		dev := d.(*server.Device)
		dev.GetNumaNodeIdFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		dev.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	}
	devs, err := discoverWith(s)
	require.NoError(t, err)
	require.Equal(t, -1, devs[0].NUMANode, "%+v", devs[0])
	require.Empty(t, devs[0].NVLinkPeers, "%+v", devs[0])
}

// On this machine (no driver) the real library reports ErrNoGPU and the
// process survives.
func TestDiscoverRealLibrary(t *testing.T) {
	devs, err := Discover()
	if err != nil {
		require.ErrorIs(t, err, ErrNoGPU, "want ErrNoGPU without a driver")
		t.Logf("no GPU here: %v", err)
		return
	}
	t.Logf("found %d GPUs: %+v", len(devs), devs)
}

// TestDiscoverOnAMockDGXH200: the listing ExampleDiscover prints, on
// go-nvml's mock DGX H200 (eight GPUs, two NUMA nodes here).
func TestDiscoverOnAMockDGXH200(t *testing.T) {
	machine := dgxh200.New()
	for i, d := range machine.Devices {
		dev := d.(*server.Device)
		node := i / 4
		dev.GetNumaNodeIdFunc = func() (int, nvml.Return) { return node, nvml.SUCCESS }
		dev.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	}
	devs, err := discoverWith(machine)
	require.NoError(t, err)
	require.Len(t, devs, 8)
	require.Equal(t, "NVIDIA H200 141GB HBM3e", devs[0].Name)
	require.EqualValues(t, 141, devs[0].MemoryTotal>>30)
	require.Equal(t, 0, devs[0].NUMANode)
	require.Equal(t, 1, devs[7].NUMANode)
}
