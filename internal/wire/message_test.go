package wire_test

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/internal/wire/wiretest"
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

func TestGolden(t *testing.T) {
	topo := len(wiretest.SampleMessages()) + len(topoMessages())
	code := topo + len(codeMessages())
	pull := code + len(wiretest.PullMessages())
	for i, m := range append(append(append(append(wiretest.SampleMessages(), topoMessages()...), codeMessages()...), wiretest.PullMessages()...), echoMessages()...) {
		name := m.Type().String()
		switch {
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
			if err != nil {
				t.Fatal(err)
			}
			if string(frames[0]) != "KVB1" || string(frames[1]) != m.Type().String() {
				t.Fatalf("frames 0/1 = %q %q", frames[0], frames[1])
			}
			path := filepath.Join("testdata", "golden", name+".msgpack")
			if *update {
				if err := os.WriteFile(path, frames[2], 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./bootstrap -run TestGolden -update once)", err)
			}
			if !bytes.Equal(frames[2], want) {
				t.Fatalf("wire format drifted for %v:\n got %x\nwant %x", m.Type(), frames[2], want)
			}
			got, err := wire.Decode([][]byte{[]byte(wire.Magic), []byte(m.Type().String()), want})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", got, m)
			}
			// Any MessagePack implementation reads the golden body as a map
			// with the PROTOCOL.md keys.
			var generic map[string]any
			if err := msgpack.Unmarshal(want, &generic); err != nil {
				t.Fatal(err)
			}
			if _, ok := generic["from"].(map[string]any)["endpoint"]; !ok {
				t.Fatalf("generic decode lacks from.endpoint: %v", generic)
			}
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
	if err != nil {
		t.Fatal(err)
	}
	r := msg.(*wire.Request)
	if r.Room != 5 || r.AuxIndex != -1 || len(r.DstPages) != 1 || r.DstPages[0] != 1 || r.From.Epoch != 9 {
		t.Fatalf("decoded %+v", r)
	}
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
			if !errors.As(err, &me) {
				t.Fatalf("want MalformedError, got %v", err)
			}
			if me.Reason != tc.reason || (tc.field != "" && me.Field != tc.field) {
				t.Fatalf("got reason %s field %q (%v), want %s %q", me.Reason, me.Field, me, tc.reason, tc.field)
			}
			if me.HasRoom != tc.hasRoom {
				t.Fatalf("HasRoom = %v, want %v (%v)", me.HasRoom, tc.hasRoom, me)
			}
		})
	}
	// A malformed REQUEST that still names its room and sender can be answered.
	_, err := wire.Decode(req(with("required", 0)))
	var me *wire.MalformedError
	errors.As(err, &me)
	if me.Room != 5 || me.Endpoint != "tcp://127.0.0.1:1" {
		t.Fatalf("salvage: %+v", me)
	}
}

func TestDecodeRegionChecks(t *testing.T) {
	reg := func(r map[string]any) [][]byte {
		m := map[string]any{"from": goodFrom(), "compat": "c", "agent": "a", "agent_md": []byte{}, "tp_size": 1,
			"tp_rank": 0, "kv": []any{r}, "aux": []any{}, "state": []any{}}
		return [][]byte{[]byte(wire.Magic), []byte("REGISTER"), wiretest.EncodeMap(t, m)}
	}
	good := map[string]any{"addr": 4096, "len": 4096, "item_len": 64, "dev": 0, "mem": "DRAM"}
	if _, err := wire.Decode(reg(good)); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]any{"mem": "HBM", "item_len": 0, "dev": -1} {
		r := map[string]any{}
		for kk, vv := range good {
			r[kk] = vv
		}
		r[k] = v
		_, err := wire.Decode(reg(r))
		var me *wire.MalformedError
		if !errors.As(err, &me) || me.Reason != wire.ReasonOutOfRange || me.Field != "kv[0]."+k {
			t.Errorf("%s=%v: %v", k, v, err)
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
			if !errors.As(err, &me) {
				t.Fatalf("non-Malformed error %T", err)
			}
			return
		}
		frames, err := wire.Encode(m)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, err := wire.Decode(frames)
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if !reflect.DeepEqual(m, again) {
			t.Fatalf("not stable:\n%+v\n%+v", m, again)
		}
	})
}

func TestDecodeDeepNesting(t *testing.T) {
	// 8 MiB of nested single-element arrays: a recursive decoder would
	// exhaust the stack; this one walks them iteratively.
	body := append([]byte{0x81, 0xa1, 'x'}, bytes.Repeat([]byte{0x91}, 8<<20)...)
	body = append(body, 0x00)
	if _, err := wire.Decode([][]byte{[]byte(wire.Magic), []byte("PING"), body}); err == nil {
		t.Fatal("want an error for a PING without its fields")
	}
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := wire.Decode(tc.frames)
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var me *wire.MalformedError
			if !errors.As(err, &me) || me.Reason != wire.ReasonOutOfRange || me.Field != tc.field {
				t.Fatalf("want out_of_range on %s, got %v", tc.field, err)
			}
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
		if !errors.As(err, &me) || me.Reason != wire.ReasonOutOfRange {
			t.Fatalf("%s: want out_of_range, got %v", field, err)
		}
		if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
			t.Fatalf("%s: decoding a %d-element header allocated %d bytes", field, n, got)
		}
	}
}

func TestEncodeCutsReasonsAndRefusesLongNames(t *testing.T) {
	frames, err := wire.Encode(&wire.Abort{From: wiretest.SampleFrom(wire.RoleDecode), Room: 1, Reason: string(bytes.Repeat([]byte("é"), wire.MaxReasonBytes))})
	if err != nil {
		t.Fatal(err)
	}
	m, err := wire.Decode(frames)
	if err != nil {
		t.Fatal(err)
	}
	if r := m.(*wire.Abort).Reason; len(r) > wire.MaxReasonBytes || !utf8.ValidString(r) {
		t.Fatalf("reason of %d bytes, valid UTF-8 %v", len(r), utf8.ValidString(r))
	}
	f := wiretest.SampleFrom(wire.RoleDecode)
	f.Instance = string(bytes.Repeat([]byte{'i'}, wire.MaxNameBytes+1))
	if _, err := wire.Encode(&wire.Ping{From: f}); err == nil {
		t.Fatal("an instance name past MaxNameBytes was encoded")
	}
}

// TestDecodeConcurrent: Decode recycles its parsed maps; messages decoded
// at once on many goroutines, valid and malformed interleaved, come out
// whole and independent of each other (run with -race).
func TestDecodeConcurrent(t *testing.T) {
	msgs := wiretest.SampleMessages()
	var frames [][][]byte
	for _, m := range msgs {
		f, err := wire.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
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
				if err != nil {
					t.Error(err)
					return
				}
				kept = append(kept, m)
				if _, err := wire.Decode(bad); err == nil {
					t.Error("a malformed body decoded")
					return
				}
			}
			for i, m := range kept {
				if !reflect.DeepEqual(m, msgs[(g+i)%len(frames)]) {
					t.Errorf("decoded %+v, want %+v", m, msgs[(g+i)%len(frames)])
					return
				}
			}
		}()
	}
	wg.Wait()
	if got, _ := wire.Decode(frames[0]); !reflect.DeepEqual(got, want) {
		t.Fatalf("%+v after, %+v before", got, want)
	}
}
