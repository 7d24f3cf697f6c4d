// Package gpu lists a node's GPUs through NVML
// (github.com/NVIDIA/go-nvml): UUID, name, memory, PCI bus id, NUMA node,
// NVLink peers — what an operator places ranks and NICs by. Without a
// driver it returns ErrNoGPU, and after a failed nvmlInit it makes no
// other NVML call (go-nvml would kill the process).
//
// Nothing else in kvbridge imports it, so only what lists GPUs compiles
// go-nvml (whose cgo prologue prints hundreds of deprecation warnings
// unless CGO_CFLAGS has -Wno-deprecated-declarations, as the Makefile
// sets): the library's packages and the other examples build quietly with
// a plain go build. The CUDA driver calls the engines' VRAM paths make are
// internal/cuda's.
package gpu

import (
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrNoGPU: NVML is absent or has no device (no driver, no GPU).
var ErrNoGPU = errors.New("gpu: no NVIDIA GPU or driver")

// Device is one GPU as NVML reports it.
type Device struct {
	Index       int
	UUID        string
	Name        string
	MemoryTotal uint64
	MemoryFree  uint64
	PCIBusID    string // e.g. 00000000:18:00.0
	NUMANode    int    // −1 when NVML does not know
	// NVLinkPeers are the PCI bus ids at the far end of this GPU's active
	// NVLinks (GPUs or NVSwitches), one entry per active link.
	NVLinkPeers []string
}

// Discover lists the GPUs through NVML.
func Discover() ([]Device, error) { return discoverWith(nvml.New()) }

// discoverWith lists the GPUs through lib (go-nvml's interface, so tests can
// pass its mock machines). After a failed Init it makes no other NVML call:
// with go-nvml that would kill the process.
func discoverWith(lib nvml.Interface) ([]Device, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		// Not ret.Error(): it calls nvmlErrorString, an NVML call.
		return nil, fmt.Errorf("%w: nvmlInit returned %d", ErrNoGPU, int32(ret))
	}
	defer lib.Shutdown()
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, nvmlErr("nvmlDeviceGetCount", -1, ret)
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: NVML reports 0 devices", ErrNoGPU)
	}
	out := make([]Device, 0, n)
	for i := 0; i < n; i++ {
		d, err := describe(lib, i)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// nvmlError is a failed NVML call (on one device, or -1): its text names
// the call, the device and NVML's return code. ErrNoGPU is the one to
// branch on.
type nvmlError struct {
	Call   string
	Device int // −1 for calls not about a device
	Return nvml.Return
}

func (e *nvmlError) Error() string {
	if e.Device < 0 {
		return fmt.Sprintf("gpu: %s: %v", e.Call, e.Return)
	}
	return fmt.Sprintf("gpu: %s (device %d): %v", e.Call, e.Device, e.Return)
}

func nvmlErr(call string, dev int, ret nvml.Return) error {
	return &nvmlError{Call: call, Device: dev, Return: ret}
}

// unsupported says an optional query has no answer on this device or driver.
func unsupported(ret nvml.Return) bool {
	return ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_FUNCTION_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT
}

func describe(lib nvml.Interface, i int) (Device, error) {
	d := Device{Index: i, NUMANode: -1}
	h, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return d, nvmlErr("nvmlDeviceGetHandleByIndex", i, ret)
	}
	if d.UUID, ret = h.GetUUID(); ret != nvml.SUCCESS {
		return d, nvmlErr("nvmlDeviceGetUUID", i, ret)
	}
	if d.Name, ret = h.GetName(); ret != nvml.SUCCESS {
		return d, nvmlErr("nvmlDeviceGetName", i, ret)
	}
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return d, nvmlErr("nvmlDeviceGetMemoryInfo", i, ret)
	}
	d.MemoryTotal, d.MemoryFree = mem.Total, mem.Free
	pci, ret := h.GetPciInfo()
	if ret != nvml.SUCCESS {
		return d, nvmlErr("nvmlDeviceGetPciInfo", i, ret)
	}
	d.PCIBusID = busID(pci.BusId[:])
	switch node, ret := h.GetNumaNodeId(); {
	case ret == nvml.SUCCESS:
		d.NUMANode = node
	case !unsupported(ret):
		return d, nvmlErr("nvmlDeviceGetNumaNodeId", i, ret)
	}
	for link := 0; link < nvml.NVLINK_MAX_LINKS; link++ {
		state, ret := h.GetNvLinkState(link)
		if unsupported(ret) {
			break // no (more) links on this device
		}
		if ret != nvml.SUCCESS {
			return d, nvmlErr(fmt.Sprintf("nvmlDeviceGetNvLinkState(link %d)", link), i, ret)
		}
		if state != nvml.FEATURE_ENABLED {
			continue
		}
		remote, ret := h.GetNvLinkRemotePciInfo(link)
		if ret != nvml.SUCCESS {
			return d, nvmlErr(fmt.Sprintf("nvmlDeviceGetNvLinkRemotePciInfo(link %d)", link), i, ret)
		}
		d.NVLinkPeers = append(d.NVLinkPeers, busID(remote.BusId[:]))
	}
	return d, nil
}

func busID(b []int8) string {
	var s strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		s.WriteByte(byte(c))
	}
	return s.String()
}
