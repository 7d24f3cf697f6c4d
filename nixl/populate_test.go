package nixl

import (
	"syscall"
	"testing"
	"unsafe"
)

// resident counts the pages of b the kernel has in memory (mincore).
func resident(t *testing.T, b []byte) int {
	t.Helper()
	ps := syscall.Getpagesize()
	vec := make([]byte, (len(b)+ps-1)/ps)
	if _, _, e := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// Populate makes fresh memory resident without changing it.
func TestPopulate(t *testing.T) {
	const size = 16 << 20
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(b)
	b[12345] = 0x5a
	pages := size / syscall.Getpagesize()
	if n := resident(t, b); n > pages/2 {
		t.Fatalf("%d of %d pages resident before Populate: the test cannot tell", n, pages)
	}
	if err := Populate(Desc{Addr: uintptr(unsafe.Pointer(&b[1])), Len: size - 1}); err != nil {
		t.Fatal(err)
	}
	if n := resident(t, b); n != pages {
		t.Fatalf("%d of %d pages resident after Populate", n, pages)
	}
	if b[12345] != 0x5a || b[0] != 0 || b[size-1] != 0 {
		t.Fatal("Populate changed the memory")
	}
}
