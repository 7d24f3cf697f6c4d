// Package wiretest holds control messages for tests: one of each type
// (the golden files' values) and a body encoded by a foreign msgpack
// implementation.
package wiretest

import (
	"bytes"
	"testing"

	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// SampleFrom is the sender of the sample messages, in role.
func SampleFrom(role string) wire.From {
	return wire.From{Role: role, Instance: "llama-prefill-a", Rank: 3, Endpoint: "tcp://10.1.2.3:17000", Epoch: 0x1122334455667788}
}

// SampleMessages holds one message of each type; the golden files are their
// exact encodings.
func SampleMessages() []wire.Message {
	regions := []wire.Region{
		{Addr: 0x7f0000000000, Len: 1 << 30, ItemLen: 32768, Dev: 0, Mem: wire.MemVRAM},
		{Addr: 0x7f0040000000, Len: 1 << 30, ItemLen: 32768, Dev: 0, Mem: wire.MemVRAM},
	}
	return []wire.Message{
		&wire.Register{From: SampleFrom(wire.RoleDecode), Compat: "v1:llama3-8b:bf16:16", Agent: "decode-0",
			AgentMD: []byte{0xde, 0xad, 0xbe, 0xef}, TPSize: 2, TPRank: 1, KV: regions,
			Aux: []wire.Region{{Addr: 0x1000, Len: 4096, ItemLen: 64, Dev: 0, Mem: wire.MemDRAM}}, State: []wire.Region{}},
		&wire.RegisterAck{From: SampleFrom(wire.RolePrefill), OK: false, Reason: "compat mismatch"},
		&wire.Request{From: SampleFrom(wire.RoleDecode), Room: 0xfedcba9876543210, DstPages: []uint32{7, 8, 9, 4000000000},
			AuxIndex: -1, StateIndices: [][]uint32{{1, 2}, {}}, Required: 2, Prefix: 1, Dummy: false, Source: -1},
		&wire.Abort{From: SampleFrom(wire.RoleDecode), Room: 42, Reason: "client disconnected"},
		&wire.AbortAck{From: SampleFrom(wire.RolePrefill), Room: 42, Drained: true},
		&wire.Status{From: SampleFrom(wire.RolePrefill), Room: 42, Status: wire.StatusFailed, Reason: "transfer stall"},
		&wire.Ping{From: SampleFrom(wire.RolePrefill), Seq: 1},
		&wire.Pong{From: SampleFrom(wire.RoleDecode), Seq: 1},
	}
}

// PullMessages holds a pull REQUEST and one message of each pull type
// (PROTOCOL.md "Pull"); the golden files are their exact encodings.
func PullMessages() []wire.Message {
	return []wire.Message{
		&wire.Request{From: SampleFrom(wire.RoleDecode), Room: 42, DstPages: []uint32{7, 8}, AuxIndex: 3,
			StateIndices: [][]uint32{}, Required: 1, Source: 0, Pull: true, At: 1_780_000_000_123_456_789},
		&wire.Pages{From: SampleFrom(wire.RolePrefill), Room: 42, Chunk: 1, Total: 2, First: 4, Pages: []uint32{11, 12},
			Lo: 0, Hi: 32, SpanLo: 0, SpanHi: 32, Final: true, Aux: 5, State: [][]uint32{{9}}, At: 1_780_000_000_123_456_789, LeaseMillis: 30000},
		&wire.Renew{From: SampleFrom(wire.RoleDecode), Room: 42, At: 1_780_000_010_000_000_000},
		&wire.ReadDone{From: SampleFrom(wire.RoleDecode), Room: 42, OK: true, Drained: true},
		&wire.Register{From: SampleFrom(wire.RoleDecode), Compat: "v1:llama3-8b:bf16:16", Agent: "decode-0", AgentMD: []byte{0xde, 0xad},
			TPSize: 1, KV: []wire.Region{}, Aux: []wire.Region{}, State: []wire.Region{}, Proof: []byte{9, 9}, Pull: true},
		&wire.RegisterAck{From: SampleFrom(wire.RolePrefill), OK: true, Reason: "", Pull: &wire.PullOffer{Agent: "llama-prefill-a-prefill-3",
			AgentMD: []byte{0xca, 0xfe}, KV: []wire.Region{{Addr: 0x7f0000000000, Len: 1 << 20, ItemLen: 4096, Mem: wire.MemDRAM}},
			Aux: []wire.Region{{Addr: 0x1000, Len: 4096, ItemLen: 64, Mem: wire.MemDRAM}}, State: []wire.Region{}, Proof: []byte{1, 2, 3}, LeaseMillis: 30000}},
	}
}

// EncodeMap builds a body from a generic map, as a foreign implementation
// (or an attacker) would.
func EncodeMap(t testing.TB, m map[string]any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	if err := enc.Encode(m); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
