package nixl

import (
	"encoding/binary"
	"fmt"
)

// The metadata blob of the loopback and ucx engines (libnixl wraps NIXL's
// own blob the same way):
//
//	"KVBN" version(1) engine(str) agent(str) nregions(u32)
//	  nregions × { kind(u8) addr(u64) len(u64) dev(u64) key(bytes) }
//	engine payload(bytes)
//
// str and bytes are a u32 length then the bytes; integers little-endian.
// Each region's key is engine data (a packed UCX rkey); the payload is
// engine data for the whole agent (a UCX worker address).
const (
	mdMagic   = "KVBN"
	mdVersion = 1
)

type mdRegion struct {
	remoteRegion
	key []byte
}

type metadataBlob struct {
	engine, agent string
	regions       []mdRegion
	payload       []byte
}

func (m *metadataBlob) encode() []byte {
	b := append([]byte(mdMagic), mdVersion)
	putBytes := func(v []byte) {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	putBytes([]byte(m.engine))
	putBytes([]byte(m.agent))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.regions)))
	for _, r := range m.regions {
		b = append(b, byte(r.Kind))
		b = binary.LittleEndian.AppendUint64(b, uint64(r.Addr))
		b = binary.LittleEndian.AppendUint64(b, r.Len)
		b = binary.LittleEndian.AppendUint64(b, r.Dev)
		putBytes(r.key)
	}
	putBytes(m.payload)
	return b
}

func decodeMetadata(b []byte, engine string) (*metadataBlob, error) {
	bad := func(what string) (*metadataBlob, error) {
		return nil, fmt.Errorf("%s: %w", what, ErrBadMetadata)
	}
	if len(b) < 5 || string(b[:4]) != mdMagic {
		return bad("not a kvbridge metadata blob")
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
	m := &metadataBlob{}
	eng, ok1 := bytesField()
	agent, ok2 := bytesField()
	n, ok3 := u32()
	if !ok1 || !ok2 || !ok3 {
		return bad("truncated header")
	}
	m.engine, m.agent = string(eng), string(agent)
	if m.engine != engine {
		return bad(fmt.Sprintf("blob from the %s engine, this agent runs %s", m.engine, engine))
	}
	if m.agent == "" {
		return bad("empty agent name")
	}
	if uint64(n)*29 > uint64(len(b)-off) {
		return bad("region count exceeds the blob")
	}
	for i := uint32(0); i < n; i++ {
		if off >= len(b) {
			return bad("truncated region")
		}
		kind := MemKind(b[off])
		off++
		addr, ok1 := u64()
		ln, ok2 := u64()
		dev, ok3 := u64()
		key, ok4 := bytesField()
		if !ok1 || !ok2 || !ok3 || !ok4 || !validKind(kind) || ln == 0 || addr+ln < addr {
			return bad(fmt.Sprintf("region %d malformed", i))
		}
		m.regions = append(m.regions, mdRegion{remoteRegion{kind, Desc{Addr: uintptr(addr), Len: ln, Dev: dev}}, key})
	}
	p, ok := bytesField()
	if !ok || off != len(b) {
		return bad("truncated or trailing payload")
	}
	m.payload = p
	return m, nil
}

func (m *metadataBlob) remoteRegions() []remoteRegion {
	out := make([]remoteRegion, len(m.regions))
	for i, r := range m.regions {
		out[i] = r.remoteRegion
	}
	return out
}
