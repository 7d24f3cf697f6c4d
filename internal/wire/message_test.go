package wire_test

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/internal/wire/wiretest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// topoMessages are the optional topology fields: a REGISTER with its topo
// map, a REQUEST with its source.
func topoMessages() []wire.Message {
	r := wiretest.SampleMessages()[0].(*wire.Register)
	r.Topo = &wire.Topo{PPSize: 2, PPRank: 1, DPSize: 1, Layers: 32, KVHeads: 8, HeadBytes: 256, PageTokens: 16, PageLayout: "HND"}
	q := wiretest.SampleMessages()[2].(*wire.Request)
	q.Source, q.Dummy = 3, true
	return []wire.Message{r, q}
}

// codeMessages carry the optional ABORT code.
func codeMessages() []wire.Message {
	return []wire.Message{&wire.Abort{From: wiretest.SampleFrom(wire.RoleDecode), Room: 42, Code: "refused",
		Reason: "prefill PP 1 → decode PP 2 is not supported"}}
}

// echoMessages carry the offer challenge's echo (a REGISTER_ACK with an
// offer and the nonce its decode rank sent the offer's agent).
func echoMessages() []wire.Message {
	for _, m := range wiretest.PullMessages() {
		if a, ok := m.(*wire.RegisterAck); ok {
			a.Echo = bytes.Repeat([]byte{0xe5}, 16)
			return []wire.Message{a}
		}
	}
	return nil
}

// digestMessages carry the REQUEST's digest ask (docs/PROTOCOL.md
// "Digest").
func digestMessages() []wire.Message {
	q := wiretest.SampleMessages()[2].(*wire.Request)
	q.Digest = true
	var pg *wire.Pages
	for _, m := range wiretest.PullMessages() {
		if p, ok := m.(*wire.Pages); ok {
			pg = p
		}
	}
	pg.Digests, pg.Units = []uint32{0x0badbad0, 0xdeadbeef}, 3
	return []wire.Message{q, pg}
}

// closedMessages carry a REQUEST's number and a closing prefill rank's
// notice of the highest it took (docs/PROTOCOL.md "A rank that closes").
func closedMessages() []wire.Message {
	q := wiretest.SampleMessages()[2].(*wire.Request)
	q.N = 7
	return []wire.Message{q, &wire.Status{From: wiretest.SampleFrom(wire.RolePrefill), Status: wire.StatusFailed,
		Code: "closed", Reason: "prefill rank closed: manager closed", Taken: 6}}
}

func TestGolden(t *testing.T) {
	topo := len(wiretest.SampleMessages()) + len(topoMessages())
	code := topo + len(codeMessages())
	pull := code + len(wiretest.PullMessages())
	echo := pull + len(echoMessages())
	digest := echo + len(digestMessages())
	for i, m := range append(append(append(append(append(append(wiretest.SampleMessages(), topoMessages()...), codeMessages()...), wiretest.PullMessages()...), echoMessages()...), digestMessages()...), closedMessages()...) {
		name := m.Type().String()
		switch {
		case i >= digest:
			name += "_closed"
		case i >= echo:
			name += "_digest"
		case i >= pull:
			name += "_echo"
		case i >= code:
			name += "_pull"
		case i >= topo:
			name += "_code"
		case i >= len(wiretest.SampleMessages()):
			name += "_topo"
		}
		t.Run(name, func(t *testing.T) {
			frames, err := wire.Encode(m)
			require.NoError(t, err)
			require.Equal(t, "KVB1", string(frames[0]), "frame 0")
			require.Equal(t, m.Type().String(), string(frames[1]), "frame 1")
			path := filepath.Join("testdata", "golden", name+".msgpack")
			if *update {
				require.NoError(t, os.WriteFile(path, frames[2], 0o644))
			}
			want, err := os.ReadFile(path)
			require.NoError(t, err, "run go test ./internal/wire -run TestGolden -update once")
			require.Equal(t, want, frames[2], "wire format drifted for %v", m.Type())
			got, err := wire.Decode([][]byte{[]byte(wire.Magic), []byte(m.Type().String()), want})
			require.NoError(t, err)
			require.Equal(t, m, got, "round trip")
			// Any MessagePack implementation reads the golden body as a map
			// with the PROTOCOL.md keys.
			var generic map[string]any
			require.NoError(t, msgpack.Unmarshal(want, &generic))
			require.Contains(t, generic["from"].(map[string]any), "endpoint", "generic decode lacks from.endpoint: %v", generic)
		})
	}
}

func goodFrom() map[string]any {
	return map[string]any{"role": "decode", "instance": "d", "rank": 0, "endpoint": "tcp://127.0.0.1:1", "epoch": uint64(9)}
}

func goodRequest() map[string]any {
	return map[string]any{"from": goodFrom(), "room": 5, "dst_pages": []byte{1, 0, 0, 0}, "aux_index": -1,
		"state_indices": []any{}, "required": 1, "prefix": 0, "dummy": false, "future_key": "ignored"}
}

func TestDecodeAcceptsForeignEncodings(t *testing.T) {
	// Other implementations may pick other integer widths and add keys.
	m := goodRequest()
	m["room"] = int64(5)
	m["required"] = uint8(1)
	msg, err := wire.Decode([][]byte{[]byte(wire.Magic), []byte("REQUEST"), wiretest.EncodeMap(t, m)})
	require.NoError(t, err)
	r := msg.(*wire.Request)
	assert.EqualValues(t, 5, r.Room, "decoded %+v", r)
	assert.EqualValues(t, -1, r.AuxIndex, "decoded %+v", r)
	assert.Equal(t, []uint32{1}, r.DstPages, "decoded %+v", r)
	assert.EqualValues(t, 9, r.From.Epoch, "decoded %+v", r)
}

func TestDecodeMalformed(t *testing.T) {
	with := func(k string, v any) []byte {
		m := goodRequest()
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return wiretest.EncodeMap(t, m)
	}
	fromWith := func(k string, v any) []byte {
		f := goodFrom()
		f[k] = v
		m := goodRequest()
		m["from"] = f
		return wiretest.EncodeMap(t, m)
	}
	req := func(body []byte) [][]byte { return [][]byte{[]byte(wire.Magic), []byte("REQUEST"), body} }
	good := with("room", 5)
	for _, tc := range []struct {
		name    string
		frames  [][]byte
		reason  string
		field   string
		hasRoom bool
	}{
		{"two frames", [][]byte{[]byte(wire.Magic), []byte("PING")}, wire.ReasonFrames, "", false},
		{"four frames", append(req(good), []byte("x")), wire.ReasonFrames, "", false},
		{"magic", [][]byte{[]byte("KVB2"), []byte("REQUEST"), good}, wire.ReasonMagic, "", false},
		{"type", [][]byte{[]byte(wire.Magic), []byte("request"), good}, wire.ReasonType, "", false},
		{"random body", req([]byte{0xc1, 0x00, 0x13}), wire.ReasonBody, "", false},
		{"truncated", req(good[:len(good)-3]), wire.ReasonBody, "", false},
		{"trailing", req(append(append([]byte{}, good...), 0x01)), wire.ReasonBody, "", false},
		{"not a map", req([]byte{0x93, 1, 2, 3}), wire.ReasonBody, "", false},
		{"huge array header", req([]byte{0x81, 0xa1, 'x', 0xdd, 0xff, 0xff, 0xff, 0xff}), wire.ReasonBody, "", false},
		{"missing room", req(with("room", nil)), wire.ReasonMissingField, "room", false},
		{"missing from", req(with("from", nil)), wire.ReasonMissingField, "from", true},
		{"room as string", req(with("room", "5")), wire.ReasonWrongType, "room", false},
		{"negative room", req(with("room", -5)), wire.ReasonOutOfRange, "room", false},
		{"required 0", req(with("required", 0)), wire.ReasonOutOfRange, "required", true},
		{"aux_index -2", req(with("aux_index", -2)), wire.ReasonOutOfRange, "aux_index", true},
		{"pages not uint32", req(with("dst_pages", []byte{1, 2, 3})), wire.ReasonOutOfRange, "dst_pages", true},
		{"pages as array", req(with("dst_pages", []any{1, 2})), wire.ReasonWrongType, "dst_pages", true},
		{"state index bad", req(with("state_indices", []any{[]byte{1}})), wire.ReasonOutOfRange, "state_indices[0]", true},
		{"from not map", req(with("from", "me")), wire.ReasonWrongType, "from", true},
		{"bad role", req(fromWith("role", "router")), wire.ReasonOutOfRange, "from.role", true},
		{"rank as bool", req(fromWith("rank", true)), wire.ReasonWrongType, "from.rank", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := wire.Decode(tc.frames)
			var me *wire.MalformedError
			require.ErrorAs(t, err, &me, "want MalformedError")
			require.Equal(t, tc.reason, me.Reason, "reason (%v)", me)
			if tc.field != "" {
				require.Equal(t, tc.field, me.Field, "field (%v)", me)
			}
			require.Equal(t, tc.hasRoom, me.HasRoom, "HasRoom (%v)", me)
		})
	}
	// A malformed REQUEST that still names its room and sender can be answered.
	_, err := wire.Decode(req(with("required", 0)))
	var me *wire.MalformedError
	errors.As(err, &me)
	require.EqualValues(t, 5, me.Room, "salvage: %+v", me)
	require.Equal(t, "tcp://127.0.0.1:1", me.Endpoint, "salvage: %+v", me)
}

func TestDecodeRegionChecks(t *testing.T) {
	reg := func(r map[string]any) [][]byte {
		m := map[string]any{"from": goodFrom(), "compat": "c", "agent": "a", "agent_md": []byte{}, "tp_size": 1,
			"tp_rank": 0, "kv": []any{r}, "aux": []any{}, "state": []any{}}
		return [][]byte{[]byte(wire.Magic), []byte("REGISTER"), wiretest.EncodeMap(t, m)}
	}
	good := map[string]any{"addr": 4096, "len": 4096, "item_len": 64, "dev": 0, "mem": "DRAM"}
	_, err := wire.Decode(reg(good))
	require.NoError(t, err)
	for k, v := range map[string]any{"mem": "HBM", "item_len": 0, "dev": -1} {
		r := map[string]any{}
		for kk, vv := range good {
			r[kk] = vv
		}
		r[k] = v
		_, err := wire.Decode(reg(r))
		var me *wire.MalformedError
		if assert.ErrorAs(t, err, &me, "%s=%v", k, v) {
			assert.Equal(t, wire.ReasonOutOfRange, me.Reason, "%s=%v: %v", k, v, err)
			assert.Equal(t, "kv[0]."+k, me.Field, "%s=%v: %v", k, v, err)
		}
	}
}

// FuzzDecode: Decode never panics, and whatever it accepts re-encodes to a
// body that decodes to the same message.
func FuzzDecode(f *testing.F) {
	for _, m := range append(wiretest.SampleMessages(), topoMessages()...) {
		frames, _ := wire.Encode(m)
		f.Add(frames[1], frames[2])
	}
	f.Add([]byte("REQUEST"), []byte{0x81, 0xa1, 'x', 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte("PING"), bytes.Repeat([]byte{0x91}, 4096))
	f.Fuzz(func(t *testing.T, typ, body []byte) {
		m, err := wire.Decode([][]byte{[]byte(wire.Magic), typ, body})
		if err != nil {
			var me *wire.MalformedError
			require.ErrorAs(t, err, &me, "non-Malformed error %T", err)
			return
		}
		frames, err := wire.Encode(m)
		require.NoError(t, err, "re-encode")
		again, err := wire.Decode(frames)
		require.NoError(t, err, "re-decode")
		require.Equal(t, m, again, "not stable")
	})
}

func TestDecodeDeepNesting(t *testing.T) {
	// 8 MiB of nested single-element arrays: a recursive decoder would
	// exhaust the stack; this one walks them iteratively.
	body := append([]byte{0x81, 0xa1, 'x'}, bytes.Repeat([]byte{0x91}, 8<<20)...)
	body = append(body, 0x00)
	_, err := wire.Decode([][]byte{[]byte(wire.Magic), []byte("PING"), body})
	require.Error(t, err, "want an error for a PING without its fields")
}

// TestDecodeBounds: every variable-length field has a bound, checked before
// anything is allocated for it (issue 14: 60 MB bodies declaring 60M-element
// arrays took the process to 6 GB).
func TestDecodeBounds(t *testing.T) {
	big := func(n int) string { return string(bytes.Repeat([]byte{'x'}, n)) }
	regionsOf := func(n int) []any {
		r := make([]any, n)
		for i := range r {
			r[i] = map[string]any{"addr": 4096, "len": 4096, "item_len": 64, "dev": 0, "mem": "DRAM"}
		}
		return r
	}
	register := func(k string, v any) [][]byte {
		m := map[string]any{"from": goodFrom(), "compat": "c", "agent": "a", "agent_md": []byte{}, "tp_size": 1,
			"tp_rank": 0, "kv": []any{}, "aux": []any{}, "state": []any{}}
		m[k] = v
		return [][]byte{[]byte(wire.Magic), []byte("REGISTER"), wiretest.EncodeMap(t, m)}
	}
	request := func(k string, v any) [][]byte {
		m := goodRequest()
		m[k] = v
		return [][]byte{[]byte(wire.Magic), []byte("REQUEST"), wiretest.EncodeMap(t, m)}
	}
	withFrom := func(k string, v any) [][]byte {
		f := goodFrom()
		f[k] = v
		return request("from", f)
	}
	pages := func(k string, v any) [][]byte {
		frames, err := wire.Encode(digestMessages()[1])
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, msgpack.Unmarshal(frames[2], &m))
		m[k] = v
		return [][]byte{[]byte(wire.Magic), []byte("PAGES"), wiretest.EncodeMap(t, m)}
	}
	abort := func(reason string) [][]byte {
		m := map[string]any{"from": goodFrom(), "room": 1, "reason": reason}
		return [][]byte{[]byte(wire.Magic), []byte("ABORT"), wiretest.EncodeMap(t, m)}
	}
	for _, tc := range []struct {
		name   string
		frames [][]byte
		field  string
		ok     bool
	}{
		{"instance at bound", withFrom("instance", big(wire.MaxNameBytes)), "", true},
		{"instance 1 MiB", withFrom("instance", big(1<<20)), "from.instance", false},
		{"endpoint past bound", withFrom("endpoint", big(wire.MaxNameBytes+1)), "from.endpoint", false},
		{"compat past bound", register("compat", big(wire.MaxNameBytes+1)), "compat", false},
		{"reason at bound", abort(big(wire.MaxReasonBytes)), "", true},
		{"reason 1 MiB", abort(big(1 << 20)), "reason", false},
		{"agent_md past bound", register("agent_md", make([]byte, wire.MaxAgentMDBytes+1)), "agent_md", false},
		{"proof at bound", register("proof", make([]byte, wire.MaxProofBytes)), "", true},
		{"proof past bound", register("proof", make([]byte, wire.MaxProofBytes+1)), "proof", false},
		{"regions at bound", register("kv", regionsOf(wire.MaxRegions)), "", true},
		{"regions past bound", register("kv", regionsOf(wire.MaxRegions+1)), "kv", false},
		{"pages past bound", request("dst_pages", make([]byte, 4*wire.MaxPages+4)), "dst_pages", false},
		{"state lists past bound", request("state_indices", make([]any, wire.MaxStateLists+1)), "state_indices", false},
		{"digest units at bound", pages("units", wire.MaxDigestUnits), "", true},
		{"digest units past bound", pages("units", wire.MaxDigestUnits+1), "units", false},
		{"digest units 0", pages("units", 0), "units", false},
		{"digests past bound", pages("digests", make([]byte, 4*wire.MaxPages+4)), "digests", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := wire.Decode(tc.frames)
			if tc.ok {
				require.NoError(t, err)
				return
			}
			var me *wire.MalformedError
			require.ErrorAs(t, err, &me, "want out_of_range on %s", tc.field)
			require.Equal(t, wire.ReasonOutOfRange, me.Reason, "want out_of_range on %s, got %v", tc.field, err)
			require.Equal(t, tc.field, me.Field, "want out_of_range on %s, got %v", tc.field, err)
		})
	}

	// Arrays whose header declares millions of elements (each a one-byte
	// empty map, so the count fits the bytes): refused before allocating.
	for _, field := range []string{"kv", "state_indices"} {
		n := 2 << 20
		typ, fields := "REGISTER", map[string]any{"from": goodFrom(), "compat": "c", "agent": "a", "agent_md": []byte{},
			"tp_size": 1, "tp_rank": 0, "aux": []any{}, "state": []any{}}
		if field == "state_indices" {
			typ, fields = "REQUEST", goodRequest()
			delete(fields, field)
		}
		body := []byte{0xde, 0, byte(len(fields) + 1)}
		for k, v := range fields {
			kb, _ := msgpack.Marshal(k)
			vb, _ := msgpack.Marshal(v)
			body = append(append(body, kb...), vb...)
		}
		kb, _ := msgpack.Marshal(field)
		body = append(body, kb...)
		body = append(body, 0xdd, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
		body = append(body, bytes.Repeat([]byte{0x80}, n)...)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := wire.Decode([][]byte{[]byte(wire.Magic), []byte(typ), body})
		runtime.ReadMemStats(&after)
		var me *wire.MalformedError
		require.ErrorAs(t, err, &me, "%s: want out_of_range", field)
		require.Equal(t, wire.ReasonOutOfRange, me.Reason, "%s: want out_of_range, got %v", field, err)
		require.LessOrEqual(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "%s: decoding a %d-element header allocated too much", field, n)
	}
}

func TestEncodeCutsReasonsAndRefusesLongNames(t *testing.T) {
	frames, err := wire.Encode(&wire.Abort{From: wiretest.SampleFrom(wire.RoleDecode), Room: 1, Reason: string(bytes.Repeat([]byte("é"), wire.MaxReasonBytes))})
	require.NoError(t, err)
	m, err := wire.Decode(frames)
	require.NoError(t, err)
	r := m.(*wire.Abort).Reason
	require.LessOrEqual(t, len(r), wire.MaxReasonBytes, "reason of %d bytes", len(r))
	require.True(t, utf8.ValidString(r), "reason not valid UTF-8")
	f := wiretest.SampleFrom(wire.RoleDecode)
	f.Instance = string(bytes.Repeat([]byte{'i'}, wire.MaxNameBytes+1))
	_, err = wire.Encode(&wire.Ping{From: f})
	require.Error(t, err, "an instance name past MaxNameBytes was encoded")
}

// TestDecodeConcurrent: Decode recycles its parsed maps; messages decoded
// at once on many goroutines, valid and malformed interleaved, come out
// whole and independent of each other (run with -race).
func TestDecodeConcurrent(t *testing.T) {
	msgs := wiretest.SampleMessages()
	var frames [][][]byte
	for _, m := range msgs {
		f, err := wire.Encode(m)
		require.NoError(t, err)
		frames = append(frames, f)
	}
	bad := [][]byte{[]byte(wire.Magic), []byte("ABORT"), wiretest.EncodeMap(t, map[string]any{"room": 1, "from": map[string]any{"role": "x"}})}
	want, _ := wire.Decode(frames[0])
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var kept []wire.Message
			for i := 0; i < 200; i++ {
				j := (g + i) % len(frames)
				m, err := wire.Decode(frames[j])
				if !assert.NoError(t, err) {
					return
				}
				kept = append(kept, m)
				if _, err := wire.Decode(bad); !assert.Error(t, err, "a malformed body decoded") {
					return
				}
			}
			for i, m := range kept {
				if !assert.Equal(t, msgs[(g+i)%len(frames)], m, "decoded") {
					return
				}
			}
		}()
	}
	wg.Wait()
	got, _ := wire.Decode(frames[0])
	require.Equal(t, want, got, "decoded after vs before")
}

// TestOwnFromSameBytes: a body encoded with the sender's own from encoded
// once (AppendBodyAs) is the body AppendBody encodes, for every message
// type; and a message whose from is another rank's gets its own from, not
// the cached one.
func TestOwnFromSameBytes(t *testing.T) {
	msgs := append(wiretest.SampleMessages(), wiretest.PullMessages()...)
	own := wire.NewOwnFrom(wiretest.SampleFrom(wire.RoleDecode))
	require.NotNil(t, own)
	other := wiretest.SampleFrom(wire.RoleDecode)
	other.Epoch++
	for _, m := range msgs {
		for _, f := range []wire.From{wiretest.SampleFrom(wire.RoleDecode), other, wiretest.SampleFrom(wire.RolePrefill)} {
			wire.SetFrom(m, f)
			want, err := wire.AppendBody(nil, m)
			require.NoError(t, err)
			got, err := wire.AppendBodyAs(nil, m, own)
			require.NoError(t, err)
			require.Equal(t, want, got, "%s from %s epoch %d", m.Type(), f.Peer(), f.Epoch)
		}
	}
	bad := wiretest.SampleFrom(wire.RoleDecode)
	bad.Instance = strings.Repeat("x", wire.MaxNameBytes+1)
	assert.Nil(t, wire.NewOwnFrom(bad), "a from that does not encode")
}
