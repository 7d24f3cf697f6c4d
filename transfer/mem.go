package transfer

import "fmt"

// MemKind is the kind of memory a descriptor points at.
type MemKind uint8

const (
	// DRAM is host memory.
	DRAM MemKind = 1 + iota
	// VRAM is GPU memory (Dev is the GPU index).
	VRAM
)

func (k MemKind) String() string {
	switch k {
	case DRAM:
		return "DRAM"
	case VRAM:
		return "VRAM"
	}
	return fmt.Sprintf("MemKind(%d)", uint8(k))
}

// Desc is one contiguous piece of memory: host memory, or device Dev's
// memory (VRAM).
type Desc struct {
	Addr uintptr
	Len  uint64
	Dev  uint64
}
