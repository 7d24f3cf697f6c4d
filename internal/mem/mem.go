// Package mem holds the memory descriptors kvbridge passes between the
// protocol core, the transfer layer and the NIXL engines: plain values,
// no cgo, so the core can use them without linking an engine. They are
// package transfer's (public: go doc shows their fields); nixl exports
// them too (nixl.Desc, nixl.MemKind, nixl.DRAM, nixl.VRAM).
package mem

import (
	"unsafe"

	"github.com/kvbridge/kvbridge/transfer"
)

type (
	// MemKind: transfer.MemKind.
	MemKind = transfer.MemKind
	// Desc: transfer.Desc.
	Desc = transfer.Desc
)

const (
	DRAM = transfer.DRAM
	VRAM = transfer.VRAM
)

// BytesDesc describes a Go byte slice (which must stay pinned while
// registered).
func BytesDesc(b []byte) Desc {
	if len(b) == 0 {
		return Desc{}
	}
	return Desc{Addr: uintptr(unsafe.Pointer(&b[0])), Len: uint64(len(b))}
}

// End is the address one past d's last byte (it wraps for a length that
// overflows the address space: callers check End(d) >= Addr).
func End(d Desc) uint64 { return uint64(d.Addr) + d.Len }

// Contains reports whether d lies wholly inside r (same device).
func Contains(r, d Desc) bool {
	return d.Dev == r.Dev && uint64(d.Addr) >= uint64(r.Addr) && End(d) <= End(r) && End(d) >= uint64(d.Addr)
}
