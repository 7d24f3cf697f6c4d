package nixl

/*
#include <stdlib.h>
#include "libnixl_engine.h"

static int nx_get_local_md2(kvb_nixl *l, nx_h a, void **d, size_t *n) { return l->get_local_md(a, d, n); }
static void nx_mem_free2(kvb_nixl *l, void *p) { if (l->mem_free) l->mem_free(p); else free(p); }
*/
import "C"

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"unsafe"
)

// NIXL's own metadata blob (nixlAgentData::getLocalMD, NIXL 0.7 – 1.4) is a
// nixlSerDes string:
//
//	"nixlSerDes|" "Agent" len(u64) name "|" "Conns" len(u64)=8 count(u64) "|"
//	  count × { "t" len(u64) backend "|" "c" len(u64) conninfo "|" }
//	"" len(u64)=10 "MemSection" "|" <memory section>
//
// The UCX backend's conninfo is its worker address, passed as it is to
// ucp_ep_create for every worker of the loading agent (nixlUcxEngine::
// loadRemoteConnInfo). So the libnixl engine parses the whole blob and
// checks that address exactly as the ucx engine checks its peers'
// (addrcheck.go), against what NIXL's UCX writes itself (this agent's own
// blob, the release of the libucp NIXL's plugin mapped). The memory section
// is walked to the blob's end (framing, counts, descriptors of at least
// nixlBasicDesc's 24 bytes: a truncated blob, or one with bytes after its
// end, is refused), but the packed rkeys the descriptors carry for
// ucp_ep_rkey_unpack are not parsed. When this agent's own blob is not
// nixlSerDes, peers' blobs go to NIXL unchecked.
const nixlSerDesMagic = "nixlSerDes|"

// nixlMD is the head of a NIXL metadata blob.
type nixlMD struct {
	agent string
	conns map[string][]byte // backend → connection info
}

func parseNIXLMD(b []byte) (*nixlMD, error) {
	if !bytes.HasPrefix(b, []byte(nixlSerDesMagic)) {
		return nil, fmt.Errorf("not a nixlSerDes blob")
	}
	off := len(nixlSerDesMagic)
	field := func(tag string) ([]byte, error) {
		if len(b)-off < len(tag)+8 || string(b[off:off+len(tag)]) != tag {
			return nil, fmt.Errorf("field %q missing at byte %d", tag, off)
		}
		off += len(tag)
		n := binary.LittleEndian.Uint64(b[off:])
		off += 8
		if n >= uint64(len(b)-off) { // the bytes and the '|'

			return nil, fmt.Errorf("field %q of %d bytes, %d left", tag, n, len(b)-off)
		}
		v := b[off : off+int(n)]
		off += int(n)
		if b[off] != '|' {
			return nil, fmt.Errorf("field %q not terminated", tag)
		}
		off++
		return v, nil
	}
	m := &nixlMD{conns: map[string][]byte{}}
	name, err := field("Agent")
	if err != nil {
		return nil, err
	}
	m.agent = string(name)
	cnt, err := field("Conns")
	if err != nil {
		return nil, err
	}
	if len(cnt) != 8 {
		return nil, fmt.Errorf("connection count of %d bytes", len(cnt))
	}
	count := binary.LittleEndian.Uint64(cnt)
	if count > 64 {
		return nil, fmt.Errorf("%d backends' connection info", count)
	}
	for i := uint64(0); i < count; i++ {
		t, err := field("t")
		if err != nil {
			return nil, err
		}
		c, err := field("c")
		if err != nil {
			return nil, err
		}
		if len(t) == 0 || len(c) == 0 {
			return nil, fmt.Errorf("connection %d: empty backend name or info", i)
		}
		if _, dup := m.conns[string(t)]; dup {
			return nil, fmt.Errorf("backend %q's connection info twice", t)
		}
		m.conns[string(t)] = c
	}
	sec, err := field("")
	if err != nil {
		return nil, err
	}
	if string(sec) != "MemSection" {
		return nil, fmt.Errorf("%q where the memory section starts", sec)
	}
	// The memory section, as NIXL 1.x writes it (nixlLocalSection::
	// serialize, nixlDescList<nixlBlobDesc>::serialize):
	//
	//	"nixlSecElms" 8 count(u64) "|"
	//	count × { "bknd" len backend "|" "nixlDList" 10 "nixlSDList" "|"
	//	          "t" 4 mem(u32) "|" "n" 8 ndesc(u64) "|"
	//	          ndesc × { "" len(>= 24) addr,len,dev(u64 each) rkey… "|" } }
	//
	// and nothing after it. NIXL <= 1.4.0 loads the connection info before
	// it parses the section, and a section it then refuses leaves that
	// connection behind: the agent could never load the peer's genuine
	// blob again. So a blob is walked to its end here and
	// refused before NIXL sees it.
	n8 := func(tag string) (uint64, error) {
		v, err := field(tag)
		if err != nil {
			return 0, err
		}
		if len(v) != 8 {
			return 0, fmt.Errorf("field %q of %d bytes, want 8", tag, len(v))
		}
		return binary.LittleEndian.Uint64(v), nil
	}
	segs, err := n8("nixlSecElms")
	if err != nil {
		return nil, err
	}
	if segs > 64 {
		return nil, fmt.Errorf("%d memory segments", segs)
	}
	for s := uint64(0); s < segs; s++ {
		bk, err := field("bknd")
		if err != nil {
			return nil, err
		}
		if len(bk) == 0 {
			return nil, fmt.Errorf("segment %d: empty backend name", s)
		}
		kind, err := field("nixlDList")
		if err != nil {
			return nil, err
		}
		if string(kind) != "nixlSDList" {
			return nil, fmt.Errorf("segment %d: descriptor list of type %q", s, kind)
		}
		mem, err := field("t")
		if err != nil {
			return nil, err
		}
		if len(mem) != 4 {
			return nil, fmt.Errorf("segment %d: memory type of %d bytes", s, len(mem))
		}
		nd, err := n8("n")
		if err != nil {
			return nil, err
		}
		if nd > uint64(len(b)-off)/(8+24+1) { // each at least a length, a descriptor and its '|'
			return nil, fmt.Errorf("segment %d: %d descriptors in %d bytes", s, nd, len(b)-off)
		}
		for i := uint64(0); i < nd; i++ {
			d, err := field("")
			if err != nil {
				return nil, fmt.Errorf("segment %d descriptor %d: %w", s, i, err)
			}
			if len(d) < 24 {
				return nil, fmt.Errorf("segment %d descriptor %d of %d bytes, want at least 24", s, i, len(d))
			}
		}
	}
	if off != len(b) {
		return nil, fmt.Errorf("%d bytes after the memory section", len(b)-off)
	}
	return m, nil
}

// learnLocal parses this agent's own NIXL blob: when it is NIXL's
// serialization with a UCX connection, peers' UCX worker addresses are
// checked against it from now on.
func (n *libnixl) learnLocal(ver UCXVersion) error {
	var data unsafe.Pointer
	var ln C.size_t
	if err := nxErr("nixl_capi_get_local_md", C.nx_get_local_md2(n.l, n.agent, &data, &ln)); err != nil {
		return err
	}
	own := C.GoBytes(data, C.int(ln))
	C.nx_mem_free2(n.l, data)
	l, err := nixlLocal(own, ver)
	if err != nil {
		return err
	}
	n.local = l
	_, err = parseNIXLMD(own)
	n.serdes = err == nil
	return nil
}

// nixlLocal is the address check for a NIXL whose own blob is own (nil:
// not NIXL's serialization, or no UCX connection in it: nothing to check).
func nixlLocal(own []byte, ver UCXVersion) (*UCXLocal, error) {
	md, err := parseNIXLMD(own)
	if err != nil {
		return nil, nil
	}
	addr, ok := md.conns["UCX"]
	if !ok {
		return nil, nil
	}
	if ver == (UCXVersion{}) {
		return nil, fmt.Errorf("NIXL's UCX backend is loaded but no libucp is mapped in this process: "+
			"peers' UCX worker addresses could not be validated: %w", ErrEngineUnavailable)
	}
	l, err := NewUCXLocal(addr, ver)
	if err != nil {
		return nil, fmt.Errorf("NIXL's UCX: %v: %w", err, ErrEngineUnavailable)
	}
	return l, nil
}

// checkPeer validates the part of a peer's NIXL blob kvbridge can parse.
func (n *libnixl) checkPeer(m *MetadataBlob) error {
	if n.local == nil && n.serdes {
		// No UCX address to check (a NIXL without UCX connection info),
		// but the blob is still walked to its end.
		md, err := parseNIXLMD(m.Payload)
		if err != nil {
			return fmt.Errorf("NIXL metadata: %v: %w", err, ErrBadMetadata)
		}
		if md.agent != m.Agent {
			return fmt.Errorf("NIXL metadata names the agent %q: %w", md.agent, ErrBadMetadata)
		}
		return nil
	}
	return checkNIXLPeer(n.local, m)
}

func checkNIXLPeer(l *UCXLocal, m *MetadataBlob) error {
	if l == nil {
		return nil
	}
	md, err := parseNIXLMD(m.Payload)
	if err != nil {
		return fmt.Errorf("NIXL metadata: %v: %w", err, ErrBadMetadata)
	}
	if md.agent != m.Agent {
		return fmt.Errorf("NIXL metadata names the agent %q: %w", md.agent, ErrBadMetadata)
	}
	addr, ok := md.conns["UCX"]
	if !ok {
		return fmt.Errorf("NIXL metadata has no UCX connection info: %w", ErrBadMetadata)
	}
	if len(addr) > MaxWorkerAddress {
		return fmt.Errorf("NIXL's UCX worker address of %d bytes exceeds %d: %w", len(addr), MaxWorkerAddress, ErrBadMetadata)
	}
	if _, err := l.CheckAddress(addr); err != nil {
		return fmt.Errorf("NIXL's UCX worker address (%d bytes): %v: %w", len(addr), err, ErrBadMetadata)
	}
	return nil
}
