package openai

import (
	"encoding/json"
	"fmt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name  string
		chat  bool
		body  string
		code  string // "" when accepted
		check func(t *testing.T, r *Request)
	}{
		{name: "text prompt", body: `{"prompt": "hi", "max_tokens": 3}`, check: func(t *testing.T, r *Request) {
			if !slices.Equal(r.Prompt, []int{'h', 'i'}) || r.MaxTokens != 3 || !r.Text || r.Stream {
				t.Errorf("%+v", r)
			}
		}},
		{name: "token ids, default max_tokens", body: `{"prompt": [5, 6, 7]}`, check: func(t *testing.T, r *Request) {
			if !slices.Equal(r.Prompt, []int{5, 6, 7}) || r.MaxTokens != DefaultMaxTokens {
				t.Errorf("%+v", r)
			}
		}},
		{name: "a batch of one", body: `{"prompt": [[5, 6]]}`, check: func(t *testing.T, r *Request) {
			if !slices.Equal(r.Prompt, []int{5, 6}) {
				t.Errorf("%+v", r)
			}
		}},
		{name: "stream with usage", body: `{"prompt": "x", "stream": true, "stream_options": {"include_usage": true}}`, check: func(t *testing.T, r *Request) {
			if !r.Stream || !r.IncludeUsage {
				t.Errorf("%+v", r)
			}
		}},
		{name: "chat", chat: true, body: `{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4}`, check: func(t *testing.T, r *Request) {
			if string(runes(r.Prompt)) != "<|user|>\nhi\n<|assistant|>\n" || r.MaxTokens != 4 {
				t.Errorf("%q %d", runes(r.Prompt), r.MaxTokens)
			}
		}},
		{name: "SGLang's fields, a room past 2^53 exact", body: `{"prompt": "x", "bootstrap_host": "10.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 9007199254740993}`, check: func(t *testing.T, r *Request) {
			if r.SGLang == nil || r.SGLang.Room != 9007199254740993 || r.SGLang.Host != "10.0.0.1" || r.SGLang.Port != 8998 {
				t.Errorf("%+v", r.SGLang)
			}
		}},
		{name: "SGLang's fields without a port", body: `{"prompt": "x", "bootstrap_host": "h", "bootstrap_room": 7}`, check: func(t *testing.T, r *Request) {
			if r.SGLang == nil || r.SGLang.Port != 0 {
				t.Errorf("%+v", r.SGLang)
			}
		}},
		{name: "vLLM's prefill params", body: `{"prompt": "x", "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null}, "max_tokens": 1, "max_completion_tokens": 1, "min_tokens": 1}`, check: func(t *testing.T, r *Request) {
			if r.KVTransfer == nil || !r.KVTransfer.DoRemoteDecode {
				t.Errorf("%+v", r.KVTransfer)
			}
		}},
		{name: "bad JSON", body: `{"prompt": `, code: "invalid_json"},
		{name: "trailing data", body: `{"prompt": "x"} {}`, code: "invalid_json"},
		{name: "negative max_tokens", body: `{"prompt": "x", "max_tokens": -1}`, code: "invalid_max_tokens"},
		{name: "fractional max_tokens", body: `{"prompt": "x", "max_tokens": 1.5}`, code: "invalid_max_tokens"},
		{name: "huge max_tokens", body: `{"prompt": "x", "max_tokens": 99999999999999999999}`, code: "invalid_max_tokens"},
		{name: "min_tokens over max_tokens", body: `{"prompt": "x", "max_tokens": 2, "min_tokens": 3}`, code: "invalid_min_tokens"},
		{name: "n of 2", body: `{"prompt": "x", "n": 2}`, code: "invalid_n"},
		{name: "no prompt", body: `{"max_tokens": 2}`, code: "missing_prompt"},
		{name: "empty prompt", body: `{"prompt": ""}`, code: "invalid_prompt"},
		{name: "a token outside the vocabulary", body: `{"prompt": [300]}`, code: "invalid_prompt"},
		{name: "a batch of two", body: `{"prompt": ["a", "b"]}`, code: "invalid_prompt"},
		{name: "a chat without messages", chat: true, body: `{"prompt": "x"}`, code: "invalid_prompt"},
		{name: "a chat role", chat: true, body: `{"messages": [{"role": "robot", "content": "x"}]}`, code: "invalid_messages"},
		{name: "an image part", chat: true, body: `{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}`, code: "invalid_messages"},
		{name: "a room that is negative", body: `{"prompt": "x", "bootstrap_host": "h", "bootstrap_room": -1}`, code: "invalid_bootstrap_room"},
		{name: "a room of 2^63", body: `{"prompt": "x", "bootstrap_host": "h", "bootstrap_room": 9223372036854775808}`, code: "invalid_bootstrap_room"},
		{name: "a room as a string", body: `{"prompt": "x", "bootstrap_host": "h", "bootstrap_room": "7"}`, code: "invalid_bootstrap_room"},
		{name: "a room without a host", body: `{"prompt": "x", "bootstrap_room": 7}`, code: "invalid_bootstrap"},
		{name: "a host that is a URL", body: `{"prompt": "x", "bootstrap_host": "http://h/x", "bootstrap_room": 7}`, code: "invalid_bootstrap_host"},
		{name: "a port out of range", body: `{"prompt": "x", "bootstrap_host": "h", "bootstrap_room": 7, "bootstrap_port": 70000}`, code: "invalid_bootstrap_port"},
		{name: "both directions", body: `{"prompt": "x", "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": true}}`, code: "invalid_kv_transfer_params"},
		{name: "both wires", body: `{"prompt": "x", "bootstrap_host": "h", "bootstrap_room": 7, "kv_transfer_params": {"do_remote_prefill": true}}`, code: "invalid_request"},
		{name: "an unknown abort stage", body: `{"prompt": "x", "abort_at": "later"}`, code: "invalid_abort_at"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, e := Parse([]byte(tc.body), tc.chat, 256)
			switch {
			case tc.code == "" && e != nil:
				t.Fatalf("refused: %v", e)
			case tc.code != "" && (e == nil || e.Body.Code != tc.code || e.Status != 400):
				t.Fatalf("got %v (%+v), want 400 %s", e, e, tc.code)
			case tc.check != nil:
				tc.check(t, r)
			}
		})
	}
}

// A request refused for another field still says which room it named, so
// the server can tell the room's other side.
func TestParseKeepsTheRoomOfARefusal(t *testing.T) {
	r, e := Parse([]byte(`{"prompt": "x", "max_tokens": -4, "bootstrap_host": "h", "bootstrap_room": 12}`), false, 256)
	if e == nil || r == nil || r.SGLang == nil || r.SGLang.Room != 12 {
		t.Fatalf("%+v %v", r, e)
	}
}

// TestParseReadsThePromptOfARefusal (issue 51): a request refused for a
// field of its own still carries its prompt — a vLLM decode leg's ticket
// is bound to it, and the server releases the held KV only for a ticket
// that matches — and the refusal names the field, not the prompt.
func TestParseReadsThePromptOfARefusal(t *testing.T) {
	for _, field := range []string{`"max_tokens": -1`, `"max_tokens": 0`, `"max_tokens": 1e9`, `"max_tokens": 1.5`, `"max_tokens": "8"`,
		`"stream": "yes"`, `"max_tokens": 2, "min_tokens": 3`} {
		r, e := Parse([]byte(`{"prompt": [5, 6, 7], `+field+`, "kv_transfer_params": {"do_remote_prefill": true}}`), false, 256)
		require.NotNil(t, e, field)
		require.NotNil(t, r, field)
		assert.NotContains(t, e.Body.Code, "prompt", field)
		assert.Equal(t, []int{5, 6, 7}, r.Prompt, field)
		assert.NotNil(t, r.KVTransfer, field)
	}
	// A bad prompt is named when nothing before it is wrong.
	_, e := Parse([]byte(`{"prompt": [], "max_tokens": 2}`), false, 256)
	require.NotNil(t, e)
	assert.Equal(t, "invalid_prompt", e.Body.Code)
}

func runes(ids []int) []rune {
	out := make([]rune, len(ids))
	for i, id := range ids {
		out[i] = rune(id)
	}
	return out
}

// TestTicketRoomSurvivesFloats: a router that decodes kv_transfer_params
// into float64s and encodes them again (the llm-d sidecar) keeps the room.
func TestTicketRoomSurvivesFloats(t *testing.T) {
	kv := KVTransferParams{DoRemotePrefill: true, KVBridge: &Ticket{Version: 1, Room: "9007199254740993", ExpiresMS: 1796300000123}}
	b, _ := json.Marshal(kv)
	var m map[string]any
	json.Unmarshal(b, &m)
	b, _ = json.Marshal(m)
	var back KVTransferParams
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if r, err := back.KVBridge.RoomID(); err != nil || r != 9007199254740993 || back.KVBridge.ExpiresMS != 1796300000123 {
		t.Fatalf("%d %v %+v", r, err, back.KVBridge)
	}
	if string(back.KVBridge.Signed()) != string(kv.KVBridge.Signed()) {
		t.Fatal("the signed text changed on the way")
	}
}

// TestWriter: each answer shape as a client reads it back (ReadAnswer),
// and a failure before the first token keeps its status.
func TestWriter(t *testing.T) {
	for _, tc := range []struct {
		chat, stream, usage bool
		object              string
	}{
		{false, false, false, "text_completion"},
		{false, true, true, "text_completion"},
		{true, false, false, "chat.completion"},
		{true, true, false, "chat.completion.chunk"},
	} {
		t.Run(fmt.Sprintf("chat=%t/stream=%t", tc.chat, tc.stream), func(t *testing.T) {
			req := &Request{Chat: tc.chat, Stream: tc.stream, IncludeUsage: tc.usage, Prompt: []int{1, 2, 3}}
			rec := httptest.NewRecorder()
			w := NewWriter(rec, req, "id-1", "m")
			for _, tok := range []int{'o', 'k', 7} {
				if err := w.Token(tok); err != nil {
					t.Fatal(err)
				}
			}
			w.Finish(nil, map[string]int{"room": 4})
			resp := rec.Result()
			var got []int
			a, err := ReadAnswer(resp, func(tok int) error { got = append(got, tok); return nil })
			if err != nil {
				t.Fatalf("%v\n%s", err, rec.Body.String())
			}
			if !slices.Equal(a.Tokens, []int{'o', 'k', 7}) || !slices.Equal(got, a.Tokens) || a.Final.Object != tc.object {
				t.Fatalf("%+v %v", a, got)
			}
			if (a.Usage == nil) == (!tc.stream || tc.usage) || (a.Usage != nil && *a.Usage != Usage{3, 3, 6}) {
				t.Errorf("usage %+v", a.Usage)
			}
			if !strings.Contains(string(a.Raw), `"kvbridge":{"room":4}`) {
				t.Errorf("final object %s", a.Raw)
			}
			if tc.stream && !strings.HasSuffix(rec.Body.String(), "data: [DONE]\n\n") {
				t.Errorf("stream does not end with [DONE]: %q", rec.Body.String())
			}
			if !tc.stream && tc.chat && !strings.Contains(rec.Body.String(), `"message":{"role":"assistant","content":"ok<|7|>"}`) {
				t.Errorf("chat answer %s", rec.Body.String())
			}
		})
	}
	// Failing before any token: the status and an OpenAI error object.
	rec := httptest.NewRecorder()
	w := NewWriter(rec, &Request{Stream: true}, "id", "m")
	w.Fail(Errorf(503, "room_failed", "room %d failed", 9))
	_, err := ReadAnswer(rec.Result(), nil)
	if e, ok := err.(*Error); !ok || e.Status != 503 || e.Body.Code != "room_failed" || e.Body.Type != "server_error" {
		t.Fatalf("%v", err)
	}
	// Failing mid-stream: an error event, then [DONE].
	rec = httptest.NewRecorder()
	w = NewWriter(rec, &Request{Stream: true}, "id", "m")
	w.Token(5)
	w.Fail(Errorf(504, "deadline", "late"))
	a, err := ReadAnswer(rec.Result(), nil)
	if e, ok := err.(*Error); !ok || e.Body.Code != "deadline" || !slices.Equal(a.Tokens, []int{5}) {
		t.Fatalf("%+v %v", a, err)
	}
}

// A stream cut before its final chunk is an error, not a short answer.
func TestReadAnswerCutStream(t *testing.T) {
	body := "data: {\"choices\":[{\"index\":0,\"text\":\"a\",\"token_ids\":[97],\"finish_reason\":null}]}\n\n"
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: io.NopCloser(strings.NewReader(body))}
	if _, err := ReadAnswer(resp, nil); err != ErrStreamEnded {
		t.Fatalf("%v", err)
	}
}

func ExampleParse() {
	r, e := Parse([]byte(`{"prompt": "hi", "max_tokens": 2, "bootstrap_host": "10.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 1796301053562099184}`), false, 2048)
	fmt.Println(e == nil, r.Prompt, r.MaxTokens, r.SGLang.Host, r.SGLang.Port, r.SGLang.Room)
	_, e = Parse([]byte(`{"prompt": "hi", "max_tokens": -1}`), false, 2048)
	fmt.Println(e.Status, e.Body.Code)
	// Output:
	// true [104 105] 2 10.0.0.1 8998 1796301053562099184
	// 400 invalid_max_tokens
}

// TestParseMooncake: the MooncakeConnector wire's kv_transfer_params, as
// the llm-d sidecar's "mooncake" connector sends them: the room is the
// transfer id's on both legs; the decode leg's engine id names the DP
// group; a malformed decode leg is refused naming the field, its room
// still returned (so the prefill leg can be told).
func TestParseMooncake(t *testing.T) {
	pre := `{"prompt": "x", "kv_transfer_params": {"do_remote_prefill": false, "do_remote_decode": true, "transfer_id": "xfer-1"}}`
	r, e := Parse([]byte(pre), false, 256)
	require.Nil(t, e)
	require.NotNil(t, r.Mooncake)
	assert.Equal(t, MooncakeRoom("xfer-1"), r.Mooncake.Room)
	assert.Equal(t, -1, r.Mooncake.DP, "the prefill leg's group comes in its header")
	assert.NotEqual(t, MooncakeRoom("xfer-1"), MooncakeRoom("xfer-2"))
	assert.Less(t, MooncakeRoom("xfer-1"), uint64(1)<<63)

	dec := func(boot, engine string) string {
		return fmt.Sprintf(`{"prompt": "x", "kv_transfer_params": {"do_remote_prefill": true, "do_remote_decode": false, "transfer_id": "xfer-1", "remote_bootstrap_addr": %q, "remote_engine_id": %q}}`, boot, engine)
	}
	r, e = Parse([]byte(dec("http://10.0.0.1:8998/", MooncakeEngineID("p-0", 3))), false, 256)
	require.Nil(t, e)
	assert.Equal(t, Mooncake{TransferID: "xfer-1", Room: MooncakeRoom("xfer-1"), Bootstrap: "http://10.0.0.1:8998", EngineID: "kvbridge:p-0:dp3", DP: 3}, *r.Mooncake)

	for _, tc := range []struct{ body, code string }{
		{dec("http://10.0.0.1:8998", "vllm-engine-0"), "invalid_remote_engine_id"},
		{dec("http://10.0.0.1:8998", "kvbridge:p-0:dp-1"), "invalid_remote_engine_id"},
		{dec("http://10.0.0.1:8998", "kvbridge:p-0:dp03"), "invalid_remote_engine_id"},
		{dec("ftp://10.0.0.1", MooncakeEngineID("p", 0)), "invalid_remote_bootstrap_addr"},
		{dec("http://u:p@10.0.0.1", MooncakeEngineID("p", 0)), "invalid_remote_bootstrap_addr"},
	} {
		r, e := Parse([]byte(tc.body), false, 256)
		require.NotNil(t, e, tc.body)
		assert.Equal(t, tc.code, e.Body.Code, tc.body)
		require.NotNil(t, r, "%s: the room of a refused leg is returned", tc.body)
		assert.Equal(t, MooncakeRoom("xfer-1"), r.Mooncake.Room)
	}
	_, e = Parse([]byte(`{"prompt": "x", "kv_transfer_params": {"do_remote_decode": true, "transfer_id": "a\nb"}}`), false, 256)
	require.NotNil(t, e)
	assert.Equal(t, "invalid_transfer_id", e.Body.Code)

	inst, dp, ok := ParseMooncakeEngineID(MooncakeEngineID("a:b", 12))
	assert.True(t, ok)
	assert.Equal(t, "a:b", inst)
	assert.Equal(t, 12, dp)
}

// TestParseOffload: the OffloadingConnector wire's role keys: the room is
// the kv_request_id's on both legs; the decode leg's bootstrap server is
// the prefiller's P2P host and port; malformed keys are refused naming
// the field, the room still returned where the id was read.
func TestParseOffload(t *testing.T) {
	r, e := Parse([]byte(`{"prompt": "x", "kv_transfer_params": {"remote_decoder": {"kv_request_id": "kq-1"}}}`), false, 256)
	require.Nil(t, e)
	assert.Equal(t, Offload{KVRequestID: "kq-1", Room: MooncakeRoom("kq-1")}, *r.Offload)
	r, e = Parse([]byte(`{"prompt": "x", "kv_transfer_params": {"remote_prefiller": {"kv_request_id": "kq-1", "remote_host": "10.0.0.3", "remote_port": 8998}}}`), false, 256)
	require.Nil(t, e)
	assert.Equal(t, Offload{KVRequestID: "kq-1", Room: MooncakeRoom("kq-1"), Bootstrap: "http://10.0.0.3:8998"}, *r.Offload)
	for _, tc := range []struct{ body, code string }{
		{`{"prompt": "x", "kv_transfer_params": {"remote_decoder": {"kv_request_id": ""}}}`, "invalid_kv_request_id"},
		{`{"prompt": "x", "kv_transfer_params": {"remote_prefiller": {"kv_request_id": "kq", "remote_host": "a/b", "remote_port": 1}}}`, "invalid_remote_host"},
		{`{"prompt": "x", "kv_transfer_params": {"remote_prefiller": {"kv_request_id": "kq", "remote_host": "h", "remote_port": 0}}}`, "invalid_remote_port"},
		{`{"prompt": "x", "kv_transfer_params": {"remote_decoder": {"kv_request_id": "kq"}, "remote_prefiller": {"kv_request_id": "kq", "remote_host": "h", "remote_port": 1}}}`, "invalid_kv_transfer_params"},
		{`{"prompt": "x", "kv_transfer_params": {"remote_decoder": {"kv_request_id": "kq"}, "transfer_id": "x"}}`, "invalid_request"},
	} {
		_, e := Parse([]byte(tc.body), false, 256)
		if assert.NotNil(t, e, tc.body) {
			assert.Equal(t, tc.code, e.Body.Code, tc.body)
		}
	}
}

// TestParsePush: vLLM push dispatched at once (the sidecar's nixlv2
// connector with a cached identity): a prefill leg with the nixlv2 fields
// and a transfer_id, a decode leg with the identity and no ticket, each
// naming the transfer id's room (a MooncakeConnector prefill leg, without
// the nixlv2 fields, is not push); a decode leg without a usable host or
// port is refused naming it; one carrying a ticket is the serial flow's.
func TestParsePush(t *testing.T) {
	r, e := Parse([]byte(`{"prompt": "x", "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null, "transfer_id": "tx1"}}`), false, 256)
	require.Nil(t, e)
	require.NotNil(t, r.Push)
	assert.Nil(t, r.Mooncake)
	assert.Equal(t, Push{TransferID: "tx1", Room: MooncakeRoom("tx1")}, *r.Push)

	r, e = Parse([]byte(`{"prompt": "x", "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false, "transfer_id": "tx1"}}`), false, 256)
	require.Nil(t, e)
	assert.Nil(t, r.Push, "a MooncakeConnector prefill leg taken for push")
	assert.NotNil(t, r.Mooncake)

	dec := func(host, port string) string {
		return `{"prompt": "x", "kv_transfer_params": {"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": "p0", "remote_host": ` + host + `, "remote_port": ` + port + `, "tp_size": 1, "transfer_mode": "push", "remote_request_id": "r", "transfer_id": "tx1"}}`
	}
	r, e = Parse([]byte(dec(`"10.0.0.2"`, "8998")), false, 256)
	require.Nil(t, e)
	assert.Equal(t, Push{TransferID: "tx1", Room: MooncakeRoom("tx1"), Bootstrap: "http://10.0.0.2:8998"}, *r.Push)
	for _, tc := range []struct{ host, port, code string }{
		{`null`, "8998", "invalid_remote_host"},
		{`"a/b"`, "8998", "invalid_remote_host"},
		{`"10.0.0.2"`, "null", "invalid_remote_port"},
		{`"10.0.0.2"`, "70000", "invalid_remote_port"},
	} {
		r, e := Parse([]byte(dec(tc.host, tc.port)), false, 256)
		if assert.NotNil(t, e, tc) {
			assert.Equal(t, tc.code, e.Body.Code, tc)
			assert.Equal(t, MooncakeRoom("tx1"), r.Push.Room, "the room of a refused leg")
		}
	}
	r, e = Parse([]byte(`{"prompt": "x", "kv_transfer_params": {"do_remote_prefill": true, "transfer_mode": "push", "transfer_id": "tx1", "kvbridge": {"v": 2, "room": "5"}}}`), false, 256)
	require.Nil(t, e)
	assert.Nil(t, r.Push, "a decode leg with a ticket taken for push")
	assert.Nil(t, r.Mooncake)
}
