package nixl

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openUCXAgent opens a ucx agent with 64 KiB of UCX memory and 64 KiB of
// its own, and returns it with its metadata decoded.
func openUCXAgent(t *testing.T, name string, tls map[string]string) (*Agent, *MetadataBlob) {
	t.Helper()
	a, err := Open(Config{Name: name, Engine: EngineUCX, UCX: tls, XferTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { a.Close() })
	_, _, err = a.Alloc(1 << 16)
	require.NoError(t, err)
	_, err = a.RegisterBytes(make([]byte, 1<<16))
	require.NoError(t, err)
	md, err := a.Metadata()
	require.NoError(t, err)
	m, err := DecodeMetadata(md, EngineUCX, ucxLibrary(a))
	require.NoError(t, err)
	return a, m
}

// TestUCXAddressParse: this process's own addresses parse exactly (every
// byte accounted for) with every transport named by its checksum, and
// every truncation and every extension of one is refused, never read
// past.
func TestUCXAddressParse(t *testing.T) {
	require.EqualValues(t, 0x7563, ucsCRC16("self"), "crc16(self), want 0x7563 (UCX's checksum, as packed in addresses)")
	for _, c := range []struct {
		name string
		ucx  map[string]string
		tls  []string
	}{{"shm", shmUCX, []string{"self", "posix", "cma"}}, {"tcp", tcpUCX, []string{"tcp"}},
		{"all", allUCX, []string{"self", "tcp", "sysv", "posix", "cma"}}} {
		a, m := openUCXAgent(t, "parse-"+c.name, c.ucx)
		u := ucxLocalOf(t, a)
		addr, err := parseUCXAddress(m.Payload, u.ver)
		require.NoError(t, err, "%s: own address", c.name)
		var tls []string
		for _, d := range addr.devices {
			for _, tl := range d.ifaces {
				tls = append(tls, tlName(tl.csum))
			}
		}
		assert.Equal(t, strings.Join(c.tls, ","), strings.Join(tls, ","), "%s: transports (%s)", c.name, describeUCXAddress(addr))
		for n := 0; n < len(m.Payload); n++ {
			_, err := parseUCXAddress(m.Payload[:n], u.ver)
			assert.Error(t, err, "%s: the address truncated to %d of %d bytes parses", c.name, n, len(m.Payload))
		}
		_, err = parseUCXAddress(append(bytes.Clone(m.Payload), 0), u.ver)
		assert.Error(t, err, "%s: the address with a byte appended parses", c.name)
	}
}

// TestUCXAddressV2AndReleaseVersions: the v2 format (UCX_ADDRESS_VERSION=v2:
// two header bytes, extended lengths, short attributes) and the 1.19
// release-version trailer and legacy md bits.
func TestUCXAddressV2AndReleaseVersions(t *testing.T) {
	v119 := UCXVersion{1, 19, 0}
	b := []byte{0x01 | 3<<4, ucpHdrFlagWorkerUUID}
	b = binary.LittleEndian.AppendUint64(b, 0x1122334455667788)
	// A device whose md index (130) and address length (40) need the
	// extension bytes, one transport with a 70-byte interface address.
	b = append(b, 0x7f, 130, ucpAddrFlagLast|0x1f, 40)
	b = append(b, make([]byte, 40)...)
	b = binary.LittleEndian.AppendUint16(b, 0xabcd)
	b = append(b, 1, 2, 3, 4, 0x10, 0, 0xff, 0xff) // fp8s, prio, seg_size 16, flags
	b = append(b, ucpAddrFlagLast|0x3f, 70)
	b = append(b, make([]byte, 70)...)
	_, err := parseUCXAddress(b, v119)
	require.ErrorContains(t, err, "md index 130", "md index 130 (UCX's md maps are 64 bits)")
	b[11] = 9
	a, err := parseUCXAddress(b, v119)
	require.NoError(t, err)
	require.EqualValues(t, ucpObjV2, a.version, "parsed %+v", a)
	require.EqualValues(t, uint64(0x1122334455667788), a.uuid, "parsed %+v", a)
	require.Len(t, a.devices, 1, "parsed %+v", a)
	require.EqualValues(t, 9, a.devices[0].md, "parsed %+v", a)
	require.Len(t, a.devices[0].addr, 40, "parsed %+v", a)
	require.Len(t, a.devices[0].ifaces[0].addr, 70, "parsed %+v", a)
	for n := 0; n < len(b); n++ {
		_, err := parseUCXAddress(b[:n], v119)
		require.Error(t, err, "truncated to %d of %d bytes: parses", n, len(b))
	}
	// v1: a 1.19 peer packs its minor release (19 → 3) in a trailing
	// empty device, and its md indices have no legacy bits; an older
	// peer's md byte carries the alloc/reg flags in bits 5 and 6.
	v1 := func(last bool) []byte {
		b := []byte{ucpObjV1 | ucpHdrFlagWorkerUUID<<4}
		b = binary.LittleEndian.AppendUint64(b, 7)
		flags := byte(0)
		if last {
			flags = ucpAddrFlagLast
		}
		b = append(b, 0x45, flags) // md byte 0x45: md 69, or md 5 with a legacy flag
		b = binary.LittleEndian.AppendUint16(b, 0x1234)
		attr := make([]byte, 16)
		binary.LittleEndian.PutUint32(attr[4:], math.Float32bits(1e9))
		b = append(b, attr...)
		return append(b, ucpAddrFlagLast) // the last interface, address length 0
	}
	if a, err := parseUCXAddress(append(v1(false), ucpMDEmptyDev|3, ucpAddrFlagLast), v119); err == nil {
		t.Fatalf("md 69 from a 1.19 peer accepted: %s", describeUCXAddress(a))
	}
	old, err := parseUCXAddress(v1(true), v119)
	require.NoError(t, err, "a pre-1.19 peer's md byte 0x45 (legacy bit and md 5): %+v", old)
	require.EqualValues(t, 5, old.devices[0].md, "a pre-1.19 peer's md byte 0x45 (legacy bit and md 5): %+v", old)
	old, err = parseUCXAddress(v1(true), UCXVersion{1, 13, 1})
	require.NoError(t, err, "md byte 0x45 at 1.13 (mask 0x1f): %+v", old)
	require.EqualValues(t, 5, old.devices[0].md, "md byte 0x45 at 1.13 (mask 0x1f): %+v", old)
	require.EqualValues(t, 19, unpackReleaseVersion(v119, 3), "release 3 unpacked at 1.19")
	require.EqualValues(t, 18, unpackReleaseVersion(UCXVersion{1, 21, 0}, 2), "release 2 unpacked at 1.21")
}

// TestMetadataVersions: the blob's version and the engine library are
// checked before anything after them is read.
func TestMetadataVersions(t *testing.T) {
	good := (&MetadataBlob{Engine: EngineUCX, Library: "ucx/1.13.1", Agent: "peer", Payload: []byte{1, 2}}).Encode()
	_, err := DecodeMetadata(good, EngineUCX, "ucx/1.13.0")
	require.NoError(t, err, "a patch release apart")
	old := bytes.Clone(good)
	old[4] = 1
	_, err = DecodeMetadata(old, EngineUCX, "ucx/1.13.1")
	require.ErrorIs(t, err, ErrBadMetadata, "a version 1 blob")
	require.ErrorContains(t, err, "metadata version 1", "a version 1 blob")
	require.True(t, strings.Contains(err.Error(), "older") || strings.Contains(err.Error(), "before"), "a version 1 blob: %v", err)
	// Another minor release, and a payload that is garbage: the library
	// is what is refused, naming both.
	other := (&MetadataBlob{Engine: EngineUCX, Library: "ucx/1.19.1", Agent: "peer", Payload: []byte{1}}).Encode()
	other = append(other[:len(other)-9], 0xff, 0xff, 0xff, 0xff) // region count and payload: garbage
	_, err = DecodeMetadata(other, EngineUCX, "ucx/1.13.1")
	require.ErrorIs(t, err, ErrBadMetadata, "another UCX minor release")
	require.ErrorContains(t, err, `"ucx/1.19.1"`, "another UCX minor release")
	require.ErrorContains(t, err, `"ucx/1.13.1"`, "another UCX minor release")
	require.ErrorContains(t, err, `agent "peer"`, "another UCX minor release")
	for _, c := range []struct {
		have, peer string
		ok         bool
	}{
		{"ucx/1.13.1", "ucx/1.13.1", true}, {"ucx/1.13.1", "ucx/1.13.0", true}, {"ucx/1.13.1", "ucx/1.14.1", false},
		{"ucx/1.13.1", "ucx/2.13.1", false}, {"nixl/ucx-1.19.0", "nixl/ucx-1.19.1", true},
		{"nixl/ucx-1.19.0", "nixl/ucx-unknown", false}, {"nixl/ucx-unknown", "nixl/ucx-unknown", true},
		{"ucx/1.13.1", "nixl/ucx-1.13.1", false}, {"loopback", "loopback", true}, {"ucx/1.13.1", "", false},
	} {
		assert.Equal(t, c.ok, libCompatible(c.have, c.peer), "libCompatible(%q, %q)", c.have, c.peer)
	}
}

// TestUCXRefusesUnifiedMode: UCX's unified mode packs addresses in a format
// the checks do not read.
func TestUCXRefusesUnifiedMode(t *testing.T) {
	_, err := Open(Config{Name: "unified", Engine: EngineUCX, UCX: map[string]string{"TLS": "posix,self", "UNIFIED_MODE": "y"}})
	require.ErrorIs(t, err, ErrUnsupported, "UNIFIED_MODE=y")
	require.ErrorContains(t, err, "unified mode", "UNIFIED_MODE=y")
}

// TestUCXAddressRefusals: mutations of a real address, each refused for
// its own reason before UCX sees it (the first is issue 23's abort: a
// posix FIFO id whose flags say "a file in the directory the address
// names", with no directory in the address).
func TestUCXAddressRefusals(t *testing.T) {
	loader, _ := openUCXAgent(t, "refusals-loader", shmUCX)
	_, m := openUCXAgent(t, "refusals-target", shmUCX)
	_, other := openUCXAgent(t, "refusals-other", shmUCX)
	u := ucxLocalOf(t, loader)
	a, err := parseUCXAddress(m.Payload, u.ver)
	require.NoError(t, err)
	find := func(name string) (dev, iface []byte) {
		for _, d := range a.devices {
			for _, tl := range d.ifaces {
				if tlName(tl.csum) == name {
					return d.addr, tl.addr
				}
			}
		}
		t.Fatalf("no %s in %s", name, describeUCXAddress(a))
		return nil, nil
	}
	at := func(sub []byte) int { return offsetIn(m.Payload, sub) }
	_, posix := find("posix")
	_, cma := find("cma")
	cases := []struct {
		name, want string
		edit       func(b []byte, keys [][]byte)
	}{
		{"posix FIFO in a directory (issue 23)", "file-backed segment", func(b []byte, _ [][]byte) {
			b[at(posix)+7] &^= 0xc0 // clear PROCFS and SHM_OPEN
		}},
		{"posix FIFO of a huge-page segment", "huge-page", func(b []byte, _ [][]byte) { b[at(posix)+7] |= 0x20 }},
		{"posix FIFO is another descriptor", "segment", func(b []byte, _ [][]byte) { b[at(posix)+3] ^= 0x40 }},
		{"posix FIFO pid flipped", "segment", func(b []byte, _ [][]byte) { b[at(posix)] ^= 0x01 }},
		{"cma pid of another process", "process", func(b []byte, _ [][]byte) {
			binary.LittleEndian.PutUint32(b[at(cma):], 1)
		}},
		{"endpoint addresses", "endpoint addresses", func(b []byte, _ [][]byte) { b[at(posix)-1] |= ucpAddrFlagHasEP }},
		{"NaN bandwidth", "bandwidth", func(b []byte, _ [][]byte) {
			binary.LittleEndian.PutUint32(b[at(posix)-1-12:], math.Float32bits(float32(math.NaN())))
		}},
		{"other capabilities", "capabilities", func(b []byte, _ [][]byte) { b[at(posix)-1-3] ^= 0x04 }},
		{"uuid of this worker", "this worker itself", func(b []byte, _ [][]byte) {
			binary.LittleEndian.PutUint64(b[1:], u.uuid)
		}},
		{"uuid of another agent here", "not its own", func(b []byte, _ [][]byte) {
			binary.LittleEndian.PutUint64(b[1:], binary.LittleEndian.Uint64(other.Payload[1:]))
		}},
		{"the UCX memory's key of another agent", "outside the memory its key maps", func(_ []byte, keys [][]byte) {
			copy(keys[allocIdx(m)], other.Regions[allocIdx(other)].Key)
		}},
		{"posix key longer than its segment", "key maps", func(_ []byte, keys [][]byte) {
			k := keys[allocIdx(m)]
			for off, md := 9, 0; md < 64; md++ {
				if binary.LittleEndian.Uint64(k)&(1<<md) != 0 {
					if k[off] == 24 {
						binary.LittleEndian.PutUint64(k[off+1+16:], 1<<30)
					}
					off += 1 + int(k[off])
				}
			}
		}},
		{"memory type", "memory type", func(_ []byte, keys [][]byte) { keys[0][8] = 1 }},
	}
	// A region this agent did not register (memory UCX did not allocate:
	// its key maps nothing here, so only the agent's own registrations
	// can tell).
	cases = append(cases, struct {
		name, want string
		edit       func(b []byte, keys [][]byte)
	}{"a region the agent did not register", "is not memory agent", nil})
	for _, c := range cases {
		mm := *m
		mm.Payload = bytes.Clone(m.Payload)
		mm.Regions = nil
		var keys [][]byte
		for _, r := range m.Regions {
			r.Key = bytes.Clone(r.Key)
			keys = append(keys, r.Key)
			mm.Regions = append(mm.Regions, r)
		}
		if c.edit != nil {
			c.edit(mm.Payload, keys)
		} else {
			j := 1 - allocIdx(m)
			mm.Regions[j].Addr += 4096
			mm.Regions[j].Len -= 4096
		}
		before := loader.MetadataRefused()
		_, err := loader.LoadRemote(mm.Encode())
		if assert.ErrorIs(t, err, ErrBadMetadata, "%s: want ErrBadMetadata saying %q", c.name, c.want) {
			assert.ErrorContains(t, err, c.want, "%s: want ErrBadMetadata saying %q", c.name, c.want)
		}
		assert.Contains(t, fmt.Sprint(err), `agent "refusals-target"`, "%s: the error does not name the peer", c.name)
		assert.Equal(t, before+1, loader.MetadataRefused(), "%s: not counted", c.name)
	}
	_, err = loader.LoadRemote(m.Encode())
	require.NoError(t, err, "the genuine blob")
}

// allocIdx is the index of the region of memory UCX allocated (the one with
// a posix key) in a blob of openUCXAgent's.
func allocIdx(m *MetadataBlob) int {
	if len(m.Regions[0].Key) > len(m.Regions[1].Key) {
		return 0
	}
	return 1
}

// nixlBlob is a NIXL metadata blob (nixlSerDes) around a UCX worker
// address, as nixlAgentData::getLocalMD writes it, with a memory section
// of one segment of two descriptors (an 8-byte rkey each).
func nixlBlob(agent string, conns ...[2][]byte) []byte {
	b := []byte(nixlSerDesMagic)
	add := func(tag string, v []byte) {
		b = append(b, tag...)
		b = binary.LittleEndian.AppendUint64(b, uint64(len(v)))
		b = append(b, v...)
		b = append(b, '|')
	}
	add("Agent", []byte(agent))
	add("Conns", binary.LittleEndian.AppendUint64(nil, uint64(len(conns))))
	for _, c := range conns {
		add("t", c[0])
		add("c", c[1])
	}
	add("", []byte("MemSection"))
	add("nixlSecElms", binary.LittleEndian.AppendUint64(nil, 1))
	add("bknd", []byte("UCX"))
	add("nixlDList", []byte("nixlSDList"))
	add("t", binary.LittleEndian.AppendUint32(nil, 0))
	add("n", binary.LittleEndian.AppendUint64(nil, 2))
	for i := range 2 {
		d := binary.LittleEndian.AppendUint64(nil, uint64(0x10000*(i+1)))
		d = binary.LittleEndian.AppendUint64(d, 4096)
		d = binary.LittleEndian.AppendUint64(d, 0)
		add("", append(d, "rkeyrkey"...))
	}
	return b
}

// TestNIXLBlobAddressCheck (issue 23, libnixl): a NIXL blob's UCX worker
// address is checked as the ucx engine checks its peers'. The local side
// is a NIXL whose own blob carries this process's UCX address; 5,000
// mutations of a peer's NIXL blob go through the libnixl engine's check,
// and every one the check lets through has its UCX address handed to a
// live ucx agent's load (this UCX) and a write: the process survives.
func TestNIXLBlobAddressCheck(t *testing.T) {
	loader, lm := openUCXAgent(t, "nixl-check-loader", shmUCX)
	_, pm := openUCXAgent(t, "nixl-check-peer", shmUCX)
	u := ucxLocalOf(t, loader)
	ver := u.ver
	local, err := nixlLocal(nixlBlob("self", [2][]byte{[]byte("UCX"), lm.Payload}), ver)
	require.NoError(t, err, "own NIXL blob: %v", local)
	require.NotNil(t, local, "own NIXL blob")
	l, err := nixlLocal([]byte("DBL1double"), ver)
	require.NoError(t, err, "a blob that is not NIXL's serialization: %v", l)
	require.Nil(t, l, "a blob that is not NIXL's serialization")
	genuine := nixlBlob(pm.Agent, [2][]byte{[]byte("POSIX"), []byte("x")}, [2][]byte{[]byte("UCX"), pm.Payload})
	envelope := func(b []byte) *MetadataBlob {
		return &MetadataBlob{Engine: EngineLibNIXL, Library: "nixl/ucx-1.13.1", Agent: pm.Agent, Payload: b}
	}
	require.NoError(t, checkNIXLPeer(local, envelope(genuine)), "genuine")
	for name, c := range map[string]struct {
		b    []byte
		want string
	}{
		"not NIXL's":      {[]byte("DBL1x"), "not a nixlSerDes blob"},
		"another agent":   {nixlBlob("other", [2][]byte{[]byte("UCX"), pm.Payload}), `names the agent "other"`},
		"no UCX":          {nixlBlob(pm.Agent, [2][]byte{[]byte("POSIX"), []byte("x")}), "no UCX connection"},
		"truncated":       {genuine[:40], "missing"},
		"length too long": {append(bytes.Clone(genuine[:16]), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f), "bytes"},
	} {
		err := checkNIXLPeer(local, envelope(c.b))
		if assert.ErrorIs(t, err, ErrBadMetadata, "%s: want %q", name, c.want) {
			assert.ErrorContains(t, err, c.want, "%s", name)
		}
	}
	// The peer's own UCX address with the posix FIFO flags cleared (issue
	// 23's abort) inside a NIXL blob.
	bad := bytes.Clone(pm.Payload)
	pa, _ := parseUCXAddress(bad, u.ver)
	for _, d := range pa.devices {
		for _, tl := range d.ifaces {
			if tlName(tl.csum) == "posix" {
				bad[offsetIn(bad, tl.addr)+7] &^= 0xc0
			}
		}
	}
	require.ErrorContains(t, checkNIXLPeer(local, envelope(nixlBlob(pm.Agent, [2][]byte{[]byte("UCX"), bad}))), "file-backed", "issue 23's address in a NIXL blob")

	r := rand.New(rand.NewPCG(23, 5))
	lens, spans := addrFields(pm.Payload)
	passed, written := 0, 0
	_, src, err := loader.Alloc(1 << 16)
	require.NoError(t, err)
	peer := &fuzzPeer{loader: loader, src: src}
	for i := 0; i < 5000; i++ {
		var b []byte
		if r.IntN(4) == 0 {
			b, _ = mutateBytes(r, genuine, len(nixlSerDesMagic), nil, nil, nil)
		} else {
			addr, _ := mutateBytes(r, pm.Payload, 1, lens, spans, lm.Payload)
			b = nixlBlob(pm.Agent, [2][]byte{[]byte("UCX"), addr})
		}
		if err := checkNIXLPeer(local, envelope(b)); err != nil {
			require.ErrorIs(t, err, ErrBadMetadata, "try %d", i)
			continue
		}
		passed++
		nm, err := parseNIXLMD(b)
		require.NoError(t, err, "try %d: passed the check but does not parse", i)
		ub := *pm
		ub.Payload = nm.conns["UCX"]
		name, err := loader.LoadRemote(ub.Encode())
		if err != nil {
			continue
		}
		if fuzzWrite(peer, name, ub.Regions) == nil {
			written++
		}
		require.NoError(t, loader.InvalidateRemote(name))
	}
	t.Logf("5000 mutated NIXL blobs: %d passed the check (their UCX addresses then loaded here, %d written)", passed, written)
	_, err = loader.LoadRemote(pm.Encode())
	require.NoError(t, err, "the genuine peer after the mutations")
}

// TestLibNIXLLibraryVersion: libnixl agents name the UCX NIXL's plugin
// runs (here the double brings none of its own; whatever libucp this
// process has mapped, or unknown), the same for every agent of the
// process, and blobs carry it.
func TestLibNIXLLibraryVersion(t *testing.T) {
	if s := skipDouble(); s != "" {
		t.Skip(s)
	}
	a, err := Open(Config{Name: "nixl-lib-a", Engine: EngineLibNIXL, NIXLLib: doubleLib()})
	require.NoError(t, err)
	defer a.Close()
	lib := a.b.(*libnixl).library
	require.True(t, strings.HasPrefix(lib, "nixl/ucx-"), "library %q", lib)
	md, err := a.Metadata()
	require.NoError(t, err)
	m, err := DecodeMetadata(md, EngineLibNIXL, lib)
	require.NoError(t, err, "own blob")
	require.Equal(t, lib, m.Library, "own blob")
	// A peer on another UCX release is refused before NIXL sees its blob.
	m.Library = "nixl/ucx-9.99.0"
	m.Agent = "nixl-lib-elsewhere"
	_, err = a.LoadRemote(m.Encode())
	require.ErrorIs(t, err, ErrBadMetadata, "a peer on UCX 9.99")
	require.ErrorContains(t, err, "9.99.0", "a peer on UCX 9.99")
	require.EqualValues(t, 1, a.MetadataRefused(), "refused")
}

// TestUCXTCPPriorityPerDevice (issue 22): UCX's tcp packs priority 0 for the
// host's default interface and 1 for every other (uct_tcp_iface_query), so
// a genuine peer on a host with several interfaces (lo and eth0) has tcp
// entries of both priorities. Each is accepted — this process's first tcp
// entry alone refused NIXL's own peers on this machine — and any other
// priority is still refused.
func TestUCXTCPPriorityPerDevice(t *testing.T) {
	loader, _ := openUCXAgent(t, "tcp-prio-loader", tcpUCX)
	_, m := openUCXAgent(t, "tcp-prio-target", tcpUCX)
	u := ucxLocalOf(t, loader)
	a, err := parseUCXAddress(m.Payload, u.ver)
	require.NoError(t, err)
	var attr []byte
	for _, d := range a.devices {
		for _, tl := range d.ifaces {
			if tlName(tl.csum) == "tcp" {
				attr = tl.attr
			}
		}
	}
	require.NotNil(t, attr, "no tcp in %s", describeUCXAddress(a))
	prio := offsetIn(m.Payload, ifaceCaps(ucxIface{attr: attr}, a.version))
	for _, c := range []struct {
		prio byte
		ok   bool
	}{{0, true}, {1, true}, {2, false}, {0x80, false}} {
		b := bytes.Clone(m.Payload)
		b[prio] = c.prio
		_, err := u.CheckAddress(b)
		assert.Equal(t, c.ok, err == nil, "tcp priority %d: %v, want accepted", c.prio, err)
		if err != nil {
			assert.ErrorContains(t, err, "priority and capabilities", "tcp priority %d: want a priority refusal", c.prio)
		}
	}
}

// TestUCXTCPEveryDevice: two ucx agents over tcp on every interface this
// host has (no NET_DEVICES): the peer's address loads and a write lands.
// It refused genuine peers wherever a host had two interfaces of different
// priorities (issue 22: lo and eth0, found through NIXL).
func TestUCXTCPEveryDevice(t *testing.T) {
	every := map[string]string{"TLS": "tcp"}
	ini, _ := openUCXAgent(t, "tcp-every-ini", every)
	tgt, _ := openUCXAgent(t, "tcp-every-tgt", every)
	a, err := parseUCXAddress(func() []byte {
		md, _ := tgt.Metadata()
		m, _ := DecodeMetadata(md, EngineUCX, ucxLibrary(tgt))
		return m.Payload
	}(), ucxVersionOf(t, tgt))
	require.NoError(t, err)
	prios := map[byte]bool{}
	for _, d := range a.devices {
		for _, tl := range d.ifaces {
			prios[ifaceCaps(tl, a.version)[0]] = true
		}
	}
	if len(prios) < 2 {
		t.Logf("this host's tcp devices all have one priority (%v): the check is the unit test's", prios)
	}
	_, src, _ := ini.Alloc(1 << 16)
	_, dst, _ := tgt.Alloc(1 << 16)
	fill(src, 22)
	p := pair{ini: ini, tgt: tgt, remote: exchange(t, ini, tgt)}
	x := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, []byte("every"))
	defer ini.Release(x)
	st, err := wait(t, ini, x, time.Minute)
	require.NoError(t, err, "write over tcp on every device: %v", st)
	require.Equal(t, Done, st, "write over tcp on every device")
	require.True(t, bytes.Equal(src, dst), "not byte-exact")
}

// TestUCXNamespaceSizes (issue 22): UCX 1.22 made ucs_sys_ns_t 4 bytes
// (ino_t before), so the tcp loopback device address, a shared-memory
// device address with its namespace and cma's and posix's pid-namespace
// addresses are 4 bytes shorter there; each release's size is accepted and
// the other's refused.
func TestUCXNamespaceSizes(t *testing.T) {
	for _, c := range []struct {
		ver UCXVersion
		ns  int
	}{{UCXVersion{1, 13, 1}, 8}, {UCXVersion{1, 21, 0}, 8}, {UCXVersion{1, 22, 0}, 4}, {UCXVersion{2, 0, 0}, 4}} {
		l := &UCXLocal{ver: c.ver, own: map[uint16]ucxIface{ucsCRC16("cma"): {addr: make([]byte, 4+c.ns)}}}
		require.Equal(t, c.ns, c.ver.nsLen(), "%v: namespace bytes", c.ver)
		for _, ns := range []int{4, 8} {
			want := ns == c.ns
			lo := append([]byte{1, afINET}, make([]byte, 8+ns)...)
			_, err := l.checkTransport("tcp", lo, []byte{0x12, 0x34})
			assert.Equal(t, want, err == nil, "%v: tcp loopback device with a %d-byte namespace: %v, want accepted", c.ver, ns, err)
			sm := make([]byte, 8+ns)
			binary.LittleEndian.PutUint64(sm, uctLocalAddrFlagNS|7)
			err = checkSMDevice(sm, c.ver)
			assert.Equal(t, want, err == nil, "%v: shared-memory device with a %d-byte namespace: %v, want accepted", c.ver, ns, err)
			// cma: this process's pid, flagged as carrying its PID namespace.
			cma := binary.LittleEndian.AppendUint32(nil, uint32(os.Getpid())|uctCMAAddrFlagPIDNS)
			cma = append(cma, make([]byte, ns)...)
			dev := binary.LittleEndian.AppendUint64(nil, 7)
			_, err = l.checkTransport("cma", dev, cma)
			assert.Equal(t, want, err == nil, "%v: cma address with a %d-byte PID namespace: %v, want accepted", c.ver, ns, err)
			// posix: a procfs FIFO id flagged as carrying its PID namespace;
			// the size is checked before the segment (which does not exist).
			posix := binary.LittleEndian.AppendUint64(nil, posixSegProcfs|posixSegPIDNS)
			posix = append(posix, make([]byte, ns)...)
			l.own[ucsCRC16("posix")] = ucxIface{addr: posix}
			_, err = l.checkTransport("posix", dev, posix)
			sizeRefused := err != nil && strings.Contains(err.Error(), "PID-namespace flag")
			assert.NotEqual(t, want, sizeRefused, "%v: posix address with a %d-byte PID namespace: %v, want its size accepted %v", c.ver, ns, err, want)
		}
	}
}

// TestMetadataAgent: every engine's blob names its agent, read without
// loading it; a truncated, empty-named or foreign blob is refused as bad
// metadata.
func TestMetadataAgent(t *testing.T) {
	for _, ec := range engines() {
		if ec.skip != "" {
			continue
		}
		a := open(t, ec, "md-agent")
		md, err := a.Metadata()
		require.NoError(t, err)
		name, err := MetadataAgent(md)
		require.NoError(t, err, "%s: MetadataAgent = %q", ec.name, name)
		require.Equal(t, a.Name(), name, "%s: MetadataAgent", ec.name)
		for _, bad := range [][]byte{nil, md[:5], md[:12], []byte("NIXL not kvbridge's"), append([]byte(md[:9:9]), 0, 0, 0, 0)} {
			name, err := MetadataAgent(bad)
			require.ErrorIs(t, err, ErrBadMetadata, "%s: MetadataAgent(%x) = %q", ec.name, bad, name)
		}
	}
}
