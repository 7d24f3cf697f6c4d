package nixl

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

// ucxSeeds are this process's own worker addresses (shared memory, tcp,
// every transport) and the metadata blobs around them.
func ucxSeeds(f *testing.F) (addrs, blobs [][]byte, ver UCXVersion, library string) {
	f.Helper()
	for _, tls := range []map[string]string{shmUCX, tcpUCX, allUCX} {
		a, err := Open(Config{Name: "fuzz", Engine: EngineUCX, UCX: tls})
		require.NoError(f, err)
		_, _, err = a.Alloc(1 << 16)
		require.NoError(f, err)
		md, err := a.Metadata()
		require.NoError(f, err)
		library = ucxLibrary(a)
		m, err := DecodeMetadata(md, EngineUCX, library)
		require.NoError(f, err)
		addrs, blobs, ver = append(addrs, m.Payload), append(blobs, md), ucxVersionOf(f, a)
		a.Close()
	}
	return addrs, blobs, ver, library
}

// FuzzParseUCXAddress: the worker address walk (what stands between a
// peer's bytes and ucp_ep_create) never panics or reads past its input,
// for the v1 and v2 formats and both release layouts, and an address it
// accepts is accounted for to its last byte (one byte more is refused).
func FuzzParseUCXAddress(f *testing.F) {
	addrs, _, own, _ := ucxSeeds(f)
	for _, b := range addrs {
		f.Add(b, false)
	}
	v2 := []byte{0x01 | 3<<4, ucpHdrFlagWorkerUUID}
	v2 = binary.LittleEndian.AppendUint64(v2, 0x1122334455667788)
	v2 = append(v2, 0x7f, 9, ucpAddrFlagLast|0x1f, 40)
	v2 = append(v2, make([]byte, 40)...)
	v2 = binary.LittleEndian.AppendUint16(v2, 0xabcd)
	v2 = append(v2, 1, 2, 3, 4, 0x10, 0, 0xff, 0xff)
	v2 = append(v2, ucpAddrFlagLast|0x3f, 70)
	v2 = append(v2, make([]byte, 70)...)
	f.Add(v2, true)
	f.Fuzz(func(t *testing.T, b []byte, v119 bool) {
		v := own
		if v119 {
			v = UCXVersion{1, 19, 0}
		}
		a, err := parseUCXAddress(b, v)
		if err != nil {
			return
		}
		_ = describeUCXAddress(a)
		_, err = parseUCXAddress(append(bytes.Clone(b), 0), v)
		require.Error(t, err, "accepted %x and also with a byte appended", b)
	})
}

// FuzzParseNIXLMD: the walk of NIXL's metadata blob (connections, then
// the memory section to the blob's end) never panics, and a blob it
// accepts has nothing after its end.
func FuzzParseNIXLMD(f *testing.F) {
	addrs, _, _, _ := ucxSeeds(f)
	for _, a := range addrs {
		f.Add(nixlBlob("peer", [2][]byte{[]byte("UCX"), a}))
	}
	f.Add(nixlBlob("peer"))
	f.Add([]byte(nixlSerDesMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		md, err := parseNIXLMD(b)
		if err != nil {
			return
		}
		require.NotNil(t, md, "nil metadata without an error")
		_, err = parseNIXLMD(append(bytes.Clone(b), '|'))
		require.Error(t, err, "accepted %x and also with a byte appended", b)
	})
}

// FuzzDecodeMetadata: kvbridge's own metadata envelope never panics, and
// what it accepts encodes back to the same bytes (no field read twice or
// skipped).
func FuzzDecodeMetadata(f *testing.F) {
	_, blobs, _, library := ucxSeeds(f)
	for _, b := range blobs {
		f.Add(b)
	}
	f.Add([]byte(mdMagic + "\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMetadata(b, EngineUCX, library)
		if err != nil {
			return
		}
		require.Equal(t, b, m.Encode(), "decoded %x, encodes to", b)
		_ = m.RemoteRegions()
	})
}
