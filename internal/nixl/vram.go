package nixl

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/kvbridge/kvbridge/internal/cuda"
)

// VRAM support shared by the loopback and ucx engines: the CUDA driver
// (loaded at run time, see internal/cuda), one primary context per device,
// and the IPC key a VRAM region carries in metadata.

var devs struct {
	sync.Mutex
	drv     *cuda.Driver
	ctxs    map[int]*cuda.Context
	streams map[int]*cuda.Stream
}

// cudaContext returns device dev's primary context, loading the driver
// (lib: the agent's Config.CUDALib) on first use. The driver is the
// process's: an agent naming another path than the one loaded is refused.
func cudaContext(lib string, dev int) (*cuda.Context, error) {
	devs.Lock()
	defer devs.Unlock()
	d, err := cuda.OpenDriver(lib)
	switch {
	case err != nil && errors.Is(err, cuda.ErrNoDriver) && lib == "":
		return nil, fmt.Errorf("VRAM needs the CUDA driver (libcuda.so.1; Config.CUDALib names another): %v: %w", err, ErrUnsupported)
	case err != nil && errors.Is(err, cuda.ErrNoDriver):
		return nil, fmt.Errorf("VRAM needs the CUDA driver: Config.CUDALib %s: %v: %w", lib, err, ErrUnsupported)
	case err != nil:
		return nil, fmt.Errorf("Config.CUDALib %s: %v: %w", lib, err, ErrInvalidRequest)
	}
	if devs.drv == nil {
		devs.drv, devs.ctxs, devs.streams = d, map[int]*cuda.Context{}, map[int]*cuda.Stream{}
	}
	if c, ok := devs.ctxs[dev]; ok {
		return c, nil
	}
	c, err := devs.drv.Primary(dev)
	if err != nil {
		return nil, err
	}
	devs.ctxs[dev] = c
	return c, nil
}

// deviceCopy copies n bytes between two addresses, either of which may be
// device memory (CUDA unified addressing), and returns once the bytes are
// in place.
func deviceCopy(lib string, dev int, dst, src uintptr, n uint64) error {
	return DeviceCopies(lib, dev, []uintptr{dst}, []uintptr{src}, []uint64{n})
}

// DeviceCopies queues every copy on the device's stream in one call and
// waits once: a request of 4,096 pages costs one synchronisation, not 4,096.
func DeviceCopies(lib string, dev int, dst, src []uintptr, n []uint64) error {
	if _, err := cudaContext(lib, dev); err != nil {
		return err
	}
	devs.Lock()
	defer devs.Unlock() // one stream per device, used by one copy batch at a time
	s, ok := devs.streams[dev]
	if !ok {
		var err error
		if s, err = devs.ctxs[dev].NewStream(); err != nil {
			return err
		}
		devs.streams[dev] = s
	}
	if err := s.CopyBatchAsync(dst, src, n); err != nil {
		_ = s.Sync()
		return err
	}
	return s.Sync()
}

// VRAMKey is what metadata carries for a VRAM region: the CUDA IPC handle
// of its allocation, the allocation's base, and the exporting process's
// random id (not its PID: processes in different containers on one node
// can share a PID).
type VRAMKey struct {
	handle cuda.IPCHandle
	base   uint64
	proc   uint64
}

const vramKeyLen = 64 + 8 + 8

// processID is this process's random id, drawn once.
var processID = func() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return binary.LittleEndian.Uint64(b[:]) | 1
}()

// Encode is the key as a blob carries it (DecodeVRAMKey reads it).
func (k VRAMKey) Encode() []byte {
	b := append([]byte{}, k.handle[:]...)
	b = binary.LittleEndian.AppendUint64(b, k.base)
	return binary.LittleEndian.AppendUint64(b, k.proc)
}

// DecodeVRAMKey reads a key Encode wrote, refusing any other length.
func DecodeVRAMKey(b []byte) (VRAMKey, error) {
	var k VRAMKey
	if len(b) != vramKeyLen {
		return k, fmt.Errorf("VRAM region key of %d bytes, want %d: %w", len(b), vramKeyLen, ErrBadMetadata)
	}
	copy(k.handle[:], b)
	k.base = binary.LittleEndian.Uint64(b[64:])
	k.proc = binary.LittleEndian.Uint64(b[72:])
	return k, nil
}

// ExportVRAM builds the key of a VRAM region (lib: Config.CUDALib).
func ExportVRAM(lib string, d Desc) (VRAMKey, error) {
	c, err := cudaContext(lib, int(d.Dev))
	if err != nil {
		return VRAMKey{}, err
	}
	base, _, err := c.AddressRange(cuda.DevicePtr(d.Addr))
	if err != nil {
		return VRAMKey{}, err
	}
	h, err := c.IPCHandle(base)
	if err != nil {
		return VRAMKey{}, err
	}
	return VRAMKey{handle: h, base: uint64(base), proc: processID}, nil
}

// ImportVRAM maps a peer's VRAM region into this process and returns where
// its first byte is; close releases the mapping. A region of this very
// process is used as is (CUDA refuses to open its own handles).
func ImportVRAM(lib string, k VRAMKey, region Desc, dev int) (addr uintptr, close func() error, err error) {
	if k.proc == processID {
		return region.Addr, func() error { return nil }, nil
	}
	c, err := cudaContext(lib, dev)
	if err != nil {
		return 0, nil, err
	}
	base, err := c.IPCOpen(k.handle)
	if err != nil {
		return 0, nil, err
	}
	// The region must lie inside the allocation the handle opened: the
	// key's base is the peer's to state, and a region named outside it
	// would map onto whatever this process has there (another peer's
	// mapping, its own memory).
	_, size, err := c.AddressRange(base)
	if err != nil {
		c.IPCClose(base)
		return 0, nil, err
	}
	if uint64(region.Addr) < k.base || uint64(region.Addr)-k.base > size || region.Len > size-(uint64(region.Addr)-k.base) {
		c.IPCClose(base)
		return 0, nil, fmt.Errorf("VRAM region [%#x, +%d) is not inside the %d-byte allocation its key opens (base %#x): %w",
			region.Addr, region.Len, size, k.base, ErrBadMetadata)
	}
	return uintptr(base) + (region.Addr - uintptr(k.base)), func() error { return c.IPCClose(base) }, nil
}

// DeviceSums is the end-to-end digest (docs/PROTOCOL.md "Digest") of
// groups of pieces of device dev's memory: the digest kernel's CRC-32C of
// each group (cuda.Context.CRC32CGroups, on the device's primary context,
// through the agent's CUDA driver: Config.CUDALib), appended to out.
func (a *Agent) DeviceSums(dev int, pieces []uint64, ends []int, out []uint32) ([]uint32, error) {
	c, err := cudaContext(a.cudaLib, dev)
	if err != nil {
		return out, fmt.Errorf("agent %s: digest on device %d: %w", a.name, dev, err)
	}
	if out, err = c.CRC32CGroups(pieces, ends, out); err != nil {
		return out, fmt.Errorf("agent %s: digest on device %d: %w", a.name, dev, err)
	}
	return out, nil
}
