package nixl

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// The metadata blob of the loopback and ucx engines (libnixl wraps NIXL's
// own blob the same way):
//
//	"KVBN" version(2) engine(str) agent(str) library(str) nregions(u32)
//	  nregions × { kind(u8) addr(u64) len(u64) dev(u64) key(bytes) }
//	engine payload(bytes)
//
// str and bytes are a u32 length then the bytes; integers little-endian.
// Each region's key is engine data (a packed UCX rkey); the payload is
// engine data for the whole agent (a UCX worker address). library names the
// engine library and its release, "ucx/1.13.1" (the ucx engine: libucp's
// ucp_get_version), "nixl/ucx-1.19.0" (libnixl: NIXL's C API has no version
// call; the UCX NIXL's plugin runs, or "nixl/ucx-unknown"), "loopback".
// DecodeMetadata compares it with this agent's before it reads any further:
// the release may differ only in its patch number. Version 1 blobs (no
// library field) are refused with a reason saying so.
const (
	mdMagic   = "KVBN"
	mdVersion = 2
)

// libCompatible says whether a peer's engine library can be parsed by this
// agent's: the same library, and the same major and minor release (UCX
// changes transport address formats between minor releases; a patch
// release does not). "nixl/ucx-unknown" on either side is compared as a
// string: a NIXL whose UCX this process could not see is only compatible
// with another such.
func libCompatible(have, peer string) bool {
	if have == peer {
		return true
	}
	hn, hv, ok1 := splitLib(have)
	pn, pv, ok2 := splitLib(peer)
	return ok1 && ok2 && hn == pn && hv.Major == pv.Major && hv.Minor == pv.Minor
}

// splitLib splits "ucx/1.13.1" and "nixl/ucx-1.19.0" into a name and a release.
func splitLib(s string) (string, UCXVersion, bool) {
	i := strings.LastIndexAny(s, "/-")
	if i < 0 {
		return "", UCXVersion{}, false
	}
	v, ok := parseUCXVersion(s[i+1:])
	return s[:i], v, ok
}

// MDRegion is a region a blob names, with its engine's key (the ucx
// engine's packed rkey or VRAM key; none for the others).
type MDRegion struct {
	RemoteRegion
	Key []byte
}

// MetadataBlob is an agent's metadata: its engine, the engine library's
// release, its name, its regions and the engine's payload (the ucx
// engine's worker address, NIXL's own blob).
type MetadataBlob struct {
	Engine, Library, Agent string
	Regions                []MDRegion
	Payload                []byte
}

// Encode is the blob as peers receive it (DecodeMetadata reads it).
func (m *MetadataBlob) Encode() []byte {
	b := append([]byte(mdMagic), mdVersion)
	putBytes := func(v []byte) {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	putBytes([]byte(m.Engine))
	putBytes([]byte(m.Agent))
	putBytes([]byte(m.Library))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Regions)))
	for _, r := range m.Regions {
		b = append(b, byte(r.Kind))
		b = binary.LittleEndian.AppendUint64(b, uint64(r.Addr))
		b = binary.LittleEndian.AppendUint64(b, r.Len)
		b = binary.LittleEndian.AppendUint64(b, r.Dev)
		putBytes(r.Key)
	}
	putBytes(m.Payload)
	return b
}

// DecodeMetadata decodes a peer's blob for an agent of engine running
// library; nothing after the library field is read unless both match.
func DecodeMetadata(b []byte, engine, library string) (*MetadataBlob, error) {
	bad := func(what string) (*MetadataBlob, error) {
		return nil, fmt.Errorf("%s: %w", what, ErrBadMetadata)
	}
	if len(b) < 5 || string(b[:4]) != mdMagic {
		return bad("not a kvbridge metadata blob")
	}
	if b[4] == 1 {
		return bad(fmt.Sprintf("metadata version 1, want %d: the peer runs a kvbridge from before "+
			"engine library versions joined the blob; upgrade it", mdVersion))
	}
	if b[4] != mdVersion {
		return bad(fmt.Sprintf("metadata version %d, want %d", b[4], mdVersion))
	}
	off := 5
	u32 := func() (uint32, bool) {
		if len(b)-off < 4 {
			return 0, false
		}
		v := binary.LittleEndian.Uint32(b[off:])
		off += 4
		return v, true
	}
	u64 := func() (uint64, bool) {
		if len(b)-off < 8 {
			return 0, false
		}
		v := binary.LittleEndian.Uint64(b[off:])
		off += 8
		return v, true
	}
	bytesField := func() ([]byte, bool) {
		n, ok := u32()
		if !ok || uint64(n) > uint64(len(b)-off) {
			return nil, false
		}
		v := b[off : off+int(n)]
		off += int(n)
		return v, true
	}
	m := &MetadataBlob{}
	eng, ok1 := bytesField()
	agent, ok2 := bytesField()
	lib, ok3 := bytesField()
	if !ok1 || !ok2 || !ok3 {
		return bad("truncated header")
	}
	m.Engine, m.Agent, m.Library = string(eng), string(agent), string(lib)
	if m.Engine != engine {
		return bad(fmt.Sprintf("blob from the %q engine, this agent runs %s", m.Engine, engine))
	}
	if m.Agent == "" {
		return bad("empty agent name")
	}
	if !libCompatible(library, m.Library) {
		return bad(fmt.Sprintf("agent %q runs %q, this agent %q: the releases differ beyond their patch number",
			m.Agent, m.Library, library))
	}
	n, ok := u32()
	if !ok {
		return bad("truncated header")
	}
	if uint64(n)*29 > uint64(len(b)-off) {
		return bad(fmt.Sprintf("agent %q: region count %d exceeds the blob", m.Agent, n))
	}
	for i := uint32(0); i < n; i++ {
		if off >= len(b) {
			return bad(fmt.Sprintf("agent %q: truncated region %d", m.Agent, i))
		}
		kind := MemKind(b[off])
		off++
		addr, ok1 := u64()
		ln, ok2 := u64()
		dev, ok3 := u64()
		key, ok4 := bytesField()
		if !ok1 || !ok2 || !ok3 || !ok4 || !validKind(kind) || ln == 0 || addr+ln < addr {
			return bad(fmt.Sprintf("agent %q: region %d malformed", m.Agent, i))
		}
		m.Regions = append(m.Regions, MDRegion{RemoteRegion{kind, Desc{Addr: uintptr(addr), Len: ln, Dev: dev}}, key})
	}
	p, ok := bytesField()
	if !ok || off != len(b) {
		return bad(fmt.Sprintf("agent %q: truncated or trailing payload", m.Agent))
	}
	m.Payload = p
	return m, nil
}

// RemoteRegions are the blob's regions without their keys.
func (m *MetadataBlob) RemoteRegions() []RemoteRegion {
	out := make([]RemoteRegion, len(m.Regions))
	for i, r := range m.Regions {
		out[i] = r.RemoteRegion
	}
	return out
}

// MetadataAgent returns the agent name a peer's metadata blob (of any
// engine) names, without loading it: a rank can check a registration's
// agent is the one the peer claims before the blob replaces a loaded
// remote of that name.
func MetadataAgent(md []byte) (string, error) {
	if len(md) < 5 || string(md[:4]) != mdMagic || md[4] != mdVersion {
		return "", fmt.Errorf("not a kvbridge metadata blob of version %d: %w", mdVersion, ErrBadMetadata)
	}
	off := 5
	var agent string
	for i := 0; i < 2; i++ {
		if len(md)-off < 4 {
			return "", fmt.Errorf("truncated header: %w", ErrBadMetadata)
		}
		n := int(binary.LittleEndian.Uint32(md[off:]))
		off += 4
		if n < 0 || n > len(md)-off {
			return "", fmt.Errorf("truncated header: %w", ErrBadMetadata)
		}
		agent = string(md[off : off+n])
		off += n
	}
	if agent == "" {
		return "", fmt.Errorf("empty agent name: %w", ErrBadMetadata)
	}
	return agent, nil
}
