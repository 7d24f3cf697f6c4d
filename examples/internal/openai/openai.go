// Package openai is the OpenAI-compatible HTTP wire of the example ranks and
// router: completions and chat completions requests as the routers people
// run send them (the llm-d routing sidecar and SGLang's router add
// bootstrap_host, bootstrap_port and bootstrap_room; vLLM's serial flow
// adds kv_transfer_params), their answers (one JSON object, or SSE chunks
// ending with "data: [DONE]"), OpenAI error objects, the example's
// byte-level tokenizer and its chat template.
//
// Numbers that identify a room are read exactly: bootstrap_room is a
// 63-bit integer that a float64 would round, so it is parsed from the
// JSON text, and what kvbridge puts in kv_transfer_params carries room ids
// as strings (a router that decodes JSON into float64s and encodes it again
// keeps them intact).
package openai

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// DefaultMaxTokens is what a request without max_tokens generates
// (OpenAI's default for completions; the example uses it for chat too).
const DefaultMaxTokens = 16

// MaxTokensLimit bounds max_tokens.
const MaxTokensLimit = 1 << 16

// Request is a completions or chat completions request as the example
// ranks read it. Fields the example does not use (temperature, top_p, …)
// are accepted and ignored: generation is greedy.
type Request struct {
	Chat  bool
	Model string
	// Prompt is the token ids: a text prompt's bytes, a chat's messages
	// through ChatTemplate, or the ids given.
	Prompt []int
	// Text is true when the prompt came as text (or messages).
	Text         bool
	MaxTokens    int
	Stream       bool
	IncludeUsage bool // stream_options.include_usage
	// SGLang is set when the body carries SGLang's P/D fields.
	SGLang *SGLang
	// KVTransfer is set when the body carries vLLM's kv_transfer_params.
	KVTransfer *KVTransferParams
	// Offload is set when those kv_transfer_params carry remote_decoder
	// (a prefill leg) or remote_prefiller (a decode leg): vLLM's
	// OffloadingConnector wire, the llm-d sidecar's "offloading"
	// connector, prefill leg first.
	Offload *Offload
	// Push is set for vLLM push's concurrent dispatch: a prefill leg with
	// the nixlv2 fields and a transfer_id, or a decode leg with a cached
	// prefill identity (transfer_mode "push") and a transfer_id, no ticket.
	Push *Push
	// Mooncake is set when those kv_transfer_params carry a transfer_id
	// (vLLM's MooncakeConnector wire, the llm-d sidecar's "mooncake"
	// connector): both legs at once, the room named by the transfer id.
	Mooncake *Mooncake
	// AbortAt and Fault are kvbridge's test extensions: "prefill",
	// "decode-before", "decode-mid" aborts the room at that stage on the
	// server it concerns; "swap-heads-prefill" / "swap-heads-decode" plant a
	// wrong head mapping on that side.
	AbortAt, Fault string
}

// SGLang is the disaggregation fields SGLang's router and the llm-d
// sidecar add to both servers' copy of a request.
type SGLang struct {
	Host string
	// Port is 0 when the request named none (the server's default then).
	Port int
	Room uint64
}

// KVTransferParams is vLLM's kv_transfer_params: what a router sends a
// prefill server (DoRemoteDecode) and copies from its answer to the decode
// server (DoRemotePrefill). kvbridge's prefill fills the vLLM fields for
// the router's logs and puts what the decode server needs in KVBridge.
type KVTransferParams struct {
	DoRemoteDecode         bool    `json:"do_remote_decode"`
	DoRemotePrefill        bool    `json:"do_remote_prefill"`
	RemoteEngineID         *string `json:"remote_engine_id"`
	RemoteRequestID        string  `json:"remote_request_id,omitempty"`
	RemoteHost             *string `json:"remote_host"`
	RemotePort             *int    `json:"remote_port"`
	RemoteBlockIDs         []int   `json:"remote_block_ids"`
	RemoteNumTokens        int     `json:"remote_num_tokens,omitempty"`
	TPSize                 int     `json:"tp_size,omitempty"`
	PPSize                 int     `json:"pp_size,omitempty"`
	RemoteBlocksExpiryTime float64 `json:"remote_blocks_expiry_time,omitempty"`
	TransferMode           string  `json:"transfer_mode,omitempty"`
	KVBridge               *Ticket `json:"kvbridge,omitempty"`
	// TransferID and RemoteBootstrapAddr: vLLM's MooncakeConnector wire
	// (both legs carry transfer_id; the decode leg also the prefill
	// instance's bootstrap address and engine id).
	TransferID          string `json:"transfer_id,omitempty"`
	RemoteBootstrapAddr string `json:"remote_bootstrap_addr,omitempty"`
	// RemoteDecoder and RemotePrefiller: vLLM's OffloadingConnector P2P
	// wire (the llm-d sidecar's "offloading" connector): the prefill leg
	// names the decoder's kv_request_id, the decode leg the prefiller's
	// kv_request_id and its P2P tier's host and port.
	RemoteDecoder   *P2PParams `json:"remote_decoder,omitempty"`
	RemotePrefiller *P2PParams `json:"remote_prefiller,omitempty"`
}

// P2PParams is one role key of the OffloadingConnector wire.
type P2PParams struct {
	KVRequestID string `json:"kv_request_id"`
	RemoteHost  string `json:"remote_host,omitempty"`
	RemotePort  int    `json:"remote_port,omitempty"`
}

// Push is a request of vLLM push's concurrent dispatch: the room its
// transfer id names (as for the MooncakeConnector wire) and, on the
// decode leg, the prefill instance's bootstrap server its cached identity
// names.
type Push struct {
	TransferID string
	Room       uint64
	Bootstrap  string
}

// Offload is a request of the OffloadingConnector wire: the room its
// kv_request_id names (as a transfer id names one, MooncakeRoom) and, on
// the decode leg, the prefill instance's bootstrap server at the
// prefiller's P2P host and port.
type Offload struct {
	KVRequestID string
	Room        uint64
	Bootstrap   string
}

// Mooncake is a request of the MooncakeConnector wire: the room its
// transfer id names and, on the decode leg, where the prefill instance's
// bootstrap server is and which of its DP groups holds the KV (the engine
// id its GET /query gave). DP is -1 until known (the prefill leg's comes
// in the X-data-parallel-rank header).
type Mooncake struct {
	TransferID string
	Room       uint64
	Bootstrap  string
	EngineID   string
	DP         int
}

// MooncakeRoom is the room a transfer id names: the first 63 bits of its
// SHA-256, the same on both legs.
func MooncakeRoom(transferID string) uint64 {
	h := sha256.Sum256([]byte(transferID))
	return binary.BigEndian.Uint64(h[:8]) >> 1
}

// MooncakeEngineID is the engine id kvbridge's prefill instance gives DP
// group dp in its GET /query answer; ParseMooncakeEngineID reads the
// group back (false: not one of kvbridge's).
func MooncakeEngineID(instance string, dp int) string {
	return fmt.Sprintf("kvbridge:%s:dp%d", instance, dp)
}

func ParseMooncakeEngineID(id string) (instance string, dp int, ok bool) {
	rest, found := strings.CutPrefix(id, "kvbridge:")
	i := strings.LastIndex(rest, ":dp")
	if !found || i <= 0 {
		return "", 0, false
	}
	v, err := strconv.Atoi(rest[i+3:])
	if err != nil || v < 0 || v > 1<<16 || strconv.Itoa(v) != rest[i+3:] {
		return "", 0, false
	}
	return rest[:i], v, true
}

// Ticket is the part of kv_transfer_params a kvbridge decode server
// starts the room from: the room, where its prefill instance is found,
// which prompt it holds and until when, signed by the prefill server with
// a key derived from the deployment's secret.
type Ticket struct {
	Version   int    `json:"v"`
	Room      string `json:"room"` // decimal, exact
	Bootstrap string `json:"bootstrap"`
	DP        int    `json:"dp"`
	Instance  string `json:"instance"`
	Tokens    int    `json:"tokens"`
	Prompt    string `json:"prompt_hash"` // hex
	ExpiresMS int64  `json:"expires_ms"`  // Unix milliseconds
	// Ranks (v2) are the prefill processes holding the room's KV: each
	// "tp.pp@epoch", in rank order. A decode server compares them with the
	// bootstrap server's records: a rank whose process restarted since (or
	// is gone) no longer holds the KV.
	Ranks string `json:"ranks"`
	Sig   string `json:"sig,omitempty"`
}

// RoomID parses the ticket's room.
func (t *Ticket) RoomID() (uint64, error) {
	r, err := strconv.ParseUint(t.Room, 10, 63)
	if err != nil {
		return 0, fmt.Errorf("kv_transfer_params.kvbridge.room %.32q is not a room id in [0, 2^63)", t.Room)
	}
	return r, nil
}

// Signed is the ticket's text under its signature (every field but Sig,
// in a fixed order).
func (t *Ticket) Signed() []byte {
	return fmt.Appendf(nil, "kvbridge kv_transfer_params v%d\x00%s\x00%s\x00%d\x00%s\x00%d\x00%s\x00%d\x00%s",
		t.Version, t.Room, t.Bootstrap, t.DP, t.Instance, t.Tokens, t.Prompt, t.ExpiresMS, t.Ranks)
}

// Error is an OpenAI error answer's body.
type Error struct {
	Status int `json:"-"`
	Body   struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

func (e *Error) Error() string { return e.Body.Message }

// Errorf makes an Error with a status, an OpenAI type for it and a code.
func Errorf(status int, code, format string, args ...any) *Error {
	e := &Error{Status: status}
	e.Body.Message = fmt.Sprintf(format, args...)
	e.Body.Code = code
	switch {
	case status == 401:
		e.Body.Type = "authentication_error"
	case status == 404:
		e.Body.Type = "not_found_error"
	case status < 500:
		e.Body.Type = "invalid_request_error"
	default:
		e.Body.Type = "server_error"
	}
	return e
}

// BadRequest is a 400.
func BadRequest(code, format string, args ...any) *Error {
	return Errorf(400, code, format, args...)
}

// body is the request as JSON, each field raw so its type is checked here.
type body struct {
	Model               json.RawMessage `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	MinTokens           json.RawMessage `json:"min_tokens"`
	N                   json.RawMessage `json:"n"`
	Stream              json.RawMessage `json:"stream"`
	StreamOptions       json.RawMessage `json:"stream_options"`
	BootstrapHost       json.RawMessage `json:"bootstrap_host"`
	BootstrapPort       json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom       json.RawMessage `json:"bootstrap_room"`
	KVTransferParams    json.RawMessage `json:"kv_transfer_params"`
	AbortAt             json.RawMessage `json:"abort_at"`
	Fault               json.RawMessage `json:"fault"`
}

func null(r json.RawMessage) bool { return len(r) == 0 || string(r) == "null" }

// intField reads an optional integer field exactly (no float rounding).
func intField(name string, r json.RawMessage, lo, hi int64) (int64, bool, *Error) {
	if null(r) {
		return 0, false, nil
	}
	v, err := strconv.ParseInt(string(r), 10, 64)
	if err != nil || v < lo || v > hi {
		return 0, false, BadRequest("invalid_"+name, "%s %.40s is not an integer in [%d, %d]", name, r, lo, hi)
	}
	return v, true, nil
}

func stringField(name string, r json.RawMessage) (string, *Error) {
	if null(r) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(r, &s); err != nil {
		return "", BadRequest("invalid_"+name, "%s must be a string", name)
	}
	return s, nil
}

// Parse reads a request body (one JSON object). chat selects
// /v1/chat/completions' fields (messages) over /v1/completions' (prompt);
// vocab is the model's vocabulary (a text prompt needs ≥ 256: its bytes
// are the token ids). A body refused for another field still returns
// the Request with its SGLang or KVTransfer fields when those were valid,
// and its prompt when that was, so the server can tell the room's other
// side.
func Parse(data []byte, chat bool, vocab int) (*Request, *Error) {
	var b body
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&b); err != nil {
		return nil, BadRequest("invalid_json", "the body must be one JSON object: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, BadRequest("invalid_json", "trailing data after the JSON object")
	}
	r := &Request{Chat: chat}
	if e := r.parseDisagg(b); e != nil {
		if r.Mooncake != nil || r.Offload != nil || r.Push != nil {
			// Its room is known (the transfer id): returned, so the
			// server can release the room's other side.
			return r, e
		}
		return nil, e
	}
	// The whole request is read before it is refused: the prompt too, so a
	// refused request's room (its ticket is bound to its prompt) can still
	// be released on the other side.
	e := r.parseRest(b)
	if pe := r.parsePrompt(b, vocab); e == nil {
		e = pe
	}
	return r, e
}

func (r *Request) parseRest(b body) *Error {
	var e *Error
	if r.Model, e = stringField("model", b.Model); e != nil {
		return e
	}
	if r.AbortAt, e = stringField("abort_at", b.AbortAt); e != nil {
		return e
	}
	if r.Fault, e = stringField("fault", b.Fault); e != nil {
		return e
	}
	switch r.AbortAt {
	case "", "prefill", "decode-before", "decode-mid":
	default:
		return BadRequest("invalid_abort_at", "abort_at %.32q: want prefill, decode-before or decode-mid", r.AbortAt)
	}
	switch r.Fault {
	case "", "swap-heads-prefill", "swap-heads-decode":
	default:
		return BadRequest("invalid_fault", "fault %.32q: want swap-heads-prefill or swap-heads-decode", r.Fault)
	}
	if !null(b.Stream) {
		if err := json.Unmarshal(b.Stream, &r.Stream); err != nil {
			return BadRequest("invalid_stream", "stream must be true or false")
		}
	}
	if !null(b.StreamOptions) {
		var so struct {
			IncludeUsage bool `json:"include_usage"`
		}
		if err := json.Unmarshal(b.StreamOptions, &so); err != nil {
			return BadRequest("invalid_stream_options", "stream_options must be an object {include_usage: bool}")
		}
		r.IncludeUsage = so.IncludeUsage
	}
	if n, ok, e := intField("n", b.N, math.MinInt64, math.MaxInt64); e != nil {
		return e
	} else if ok && n != 1 {
		return BadRequest("invalid_n", "n %d: the example serves one choice per request", n)
	}
	mt, ok, e := intField("max_tokens", b.MaxTokens, math.MinInt64, math.MaxInt64)
	if e != nil {
		return e
	}
	if !ok && r.Chat {
		if mt, ok, e = intField("max_completion_tokens", b.MaxCompletionTokens, math.MinInt64, math.MaxInt64); e != nil {
			return e
		}
	}
	switch {
	case !ok:
		r.MaxTokens = DefaultMaxTokens
	case mt < 1 || mt > MaxTokensLimit:
		return BadRequest("invalid_max_tokens", "max_tokens %d not in [1, %d]", mt, MaxTokensLimit)
	default:
		r.MaxTokens = int(mt)
	}
	if minT, ok, e := intField("min_tokens", b.MinTokens, 0, MaxTokensLimit); e != nil {
		return e
	} else if ok && int(minT) > r.MaxTokens {
		return BadRequest("invalid_min_tokens", "min_tokens %d exceeds max_tokens %d", minT, r.MaxTokens)
	}
	return nil
}

func (r *Request) parsePrompt(b body, vocab int) *Error {
	var text string
	switch {
	case r.Chat:
		if !null(b.Prompt) {
			return BadRequest("invalid_prompt", "a chat completion takes messages, not prompt")
		}
		if null(b.Messages) {
			return BadRequest("missing_messages", "messages is required")
		}
		var msgs []Message
		if err := json.Unmarshal(b.Messages, &msgs); err != nil {
			return BadRequest("invalid_messages", "messages must be an array of {role, content}: %v", err)
		}
		t, err := ChatTemplate(msgs)
		if err != nil {
			return BadRequest("invalid_messages", "%v", err)
		}
		text, r.Text = t, true
	case null(b.Prompt):
		return BadRequest("missing_prompt", "prompt is required")
	default:
		// A string, an array of ids, or a batch of one of either.
		var batch []json.RawMessage
		p := b.Prompt
		if err := json.Unmarshal(p, &batch); err == nil && len(batch) > 0 && (batch[0][0] == '"' || batch[0][0] == '[') {
			if len(batch) != 1 {
				return BadRequest("invalid_prompt", "a batch of %d prompts: the example serves one prompt per request", len(batch))
			}
			p = batch[0]
		}
		if err := json.Unmarshal(p, &text); err == nil {
			r.Text = true
		} else if err := json.Unmarshal(p, &r.Prompt); err != nil {
			return BadRequest("invalid_prompt", "prompt must be a string or an array of token ids")
		}
	}
	if r.Text {
		if vocab < 256 {
			return BadRequest("invalid_prompt", "a text prompt needs a vocabulary of ≥ 256 (its bytes are the token ids); the model's is %d: send token ids", vocab)
		}
		r.Prompt = Tokenize(text)
	}
	if len(r.Prompt) == 0 {
		return BadRequest("invalid_prompt", "empty prompt")
	}
	for _, t := range r.Prompt {
		if t < 0 || t >= vocab {
			return BadRequest("invalid_prompt", "token %d outside the vocabulary [0, %d)", t, vocab)
		}
	}
	return nil
}

// parseDisagg reads SGLang's bootstrap fields and vLLM's kv_transfer_params.
func (r *Request) parseDisagg(b body) *Error {
	if !null(b.BootstrapRoom) || !null(b.BootstrapHost) || !null(b.BootstrapPort) {
		if null(b.BootstrapRoom) || null(b.BootstrapHost) {
			return BadRequest("invalid_bootstrap", "bootstrap_host and bootstrap_room go together (bootstrap_port is optional)")
		}
		room, err := strconv.ParseUint(string(b.BootstrapRoom), 10, 63)
		if err != nil {
			return BadRequest("invalid_bootstrap_room", "bootstrap_room %.40s is not an integer in [0, 2^63)", b.BootstrapRoom)
		}
		sg := &SGLang{Room: room}
		var e *Error
		if sg.Host, e = stringField("bootstrap_host", b.BootstrapHost); e != nil {
			return e
		}
		if sg.Host == "" || len(sg.Host) > 253 || strings.ContainsAny(sg.Host, "/?#@ ") {
			return BadRequest("invalid_bootstrap_host", "bootstrap_host %.64q is not a host name or address", sg.Host)
		}
		port, _, e := intField("bootstrap_port", b.BootstrapPort, 1, 65535)
		if e != nil {
			return e
		}
		sg.Port = int(port)
		r.SGLang = sg
	}
	if !null(b.KVTransferParams) {
		var kv KVTransferParams
		if err := json.Unmarshal(b.KVTransferParams, &kv); err != nil {
			return BadRequest("invalid_kv_transfer_params", "kv_transfer_params: %v", err)
		}
		if kv.RemoteDecoder != nil || kv.RemotePrefiller != nil {
			r.KVTransfer = &kv
			return r.parseOffload(&kv)
		}
		if kv.DoRemoteDecode == kv.DoRemotePrefill {
			return BadRequest("invalid_kv_transfer_params", "kv_transfer_params must set exactly one of do_remote_decode (to a prefill server) and do_remote_prefill (to a decode server)")
		}
		r.KVTransfer = &kv
		if kv.TransferID != "" {
			// vLLM push with a cached identity (the sidecar's nixlv2
			// connector dispatching both legs at once) or the
			// MooncakeConnector wire: the push prefill leg names the
			// nixlv2 fields (null), the push decode leg the identity
			// (remote_host, remote_port, transfer_mode "push") and no
			// bootstrap address.
			var keys map[string]json.RawMessage
			_ = json.Unmarshal(b.KVTransferParams, &keys)
			_, nixlFields := keys["remote_engine_id"]
			switch {
			case kv.DoRemoteDecode && nixlFields, kv.DoRemotePrefill && kv.KVBridge == nil && kv.RemoteBootstrapAddr == "" && kv.TransferMode == "push":
				if e := r.parsePush(&kv); e != nil {
					return e
				}
			case kv.DoRemotePrefill && kv.KVBridge != nil:
				// (a decode leg sent again with the prefill's answer: its
				// ticket names the room)
			default:
				if e := r.parseMooncake(&kv); e != nil {
					return e
				}
			}
		}
	}
	if r.SGLang != nil && r.KVTransfer != nil {
		return BadRequest("invalid_request", "a request carries SGLang's bootstrap fields or vLLM's kv_transfer_params, not both")
	}
	return nil
}

// parseOffload reads the OffloadingConnector wire's kv_transfer_params:
// remote_decoder {kv_request_id} on the prefill leg, remote_prefiller
// {kv_request_id, remote_host, remote_port} on the decode leg (one of
// them).
func (r *Request) parseOffload(kv *KVTransferParams) *Error {
	if kv.RemoteDecoder != nil && kv.RemotePrefiller != nil {
		return BadRequest("invalid_kv_transfer_params", "kv_transfer_params carry remote_decoder (to a prefill server) or remote_prefiller (to a decode server), not both")
	}
	if r.SGLang != nil || kv.TransferID != "" {
		return BadRequest("invalid_request", "a request carries one wire's fields, not several")
	}
	p := kv.RemoteDecoder
	if p == nil {
		p = kv.RemotePrefiller
	}
	id := p.KVRequestID
	if id == "" || len(id) > 256 || strings.ContainsAny(id, "\"\\\r\n") {
		return BadRequest("invalid_kv_request_id", "kv_request_id %.64q: 1 to 256 bytes, no quotes, backslashes or line breaks", id)
	}
	o := &Offload{KVRequestID: id, Room: MooncakeRoom(id)}
	r.Offload = o // (set from here on: a refusal below still names the room)
	if q := kv.RemotePrefiller; q != nil {
		if q.RemoteHost == "" || len(q.RemoteHost) > 253 || strings.ContainsAny(q.RemoteHost, "/?#@ ") {
			return BadRequest("invalid_remote_host", "remote_host %.64q is not a host name or address", q.RemoteHost)
		}
		if q.RemotePort < 1 || q.RemotePort > 65535 {
			return BadRequest("invalid_remote_port", "remote_port %d not in [1, 65535]", q.RemotePort)
		}
		o.Bootstrap = "http://" + net.JoinHostPort(q.RemoteHost, strconv.Itoa(q.RemotePort))
	}
	return nil
}

// parsePush reads vLLM push's concurrent dispatch (the llm-d sidecar's
// nixlv2 connector with a cached prefill identity): transfer_id on both
// legs, which names the room; on the decode leg the identity's
// remote_host and remote_port, the prefill instance's bootstrap server.
func (r *Request) parsePush(kv *KVTransferParams) *Error {
	id := kv.TransferID
	if len(id) > 256 || strings.ContainsAny(id, "\"\\\r\n") {
		return BadRequest("invalid_transfer_id", "transfer_id %.64q: at most 256 bytes, no quotes, backslashes or line breaks", id)
	}
	p := &Push{TransferID: id, Room: MooncakeRoom(id)}
	r.Push = p // (set from here on: a refusal below still names the room)
	if kv.DoRemotePrefill {
		if kv.RemoteHost == nil || *kv.RemoteHost == "" || len(*kv.RemoteHost) > 253 || strings.ContainsAny(*kv.RemoteHost, "/?#@ ") {
			return BadRequest("invalid_remote_host", "remote_host is not a host name or address: the decode leg names the prefill instance's bootstrap server (its cached identity)")
		}
		if kv.RemotePort == nil || *kv.RemotePort < 1 || *kv.RemotePort > 65535 {
			return BadRequest("invalid_remote_port", "remote_port not in [1, 65535]: the decode leg names the prefill instance's bootstrap server (its cached identity)")
		}
		p.Bootstrap = "http://" + net.JoinHostPort(*kv.RemoteHost, strconv.Itoa(*kv.RemotePort))
	}
	return nil
}

// parseMooncake reads the MooncakeConnector wire's kv_transfer_params:
// transfer_id on both legs; on the decode leg remote_bootstrap_addr (an
// http URL) and remote_engine_id (one of kvbridge's: the DP group).
func (r *Request) parseMooncake(kv *KVTransferParams) *Error {
	id := kv.TransferID
	if len(id) > 256 || strings.ContainsAny(id, "\"\\\r\n") {
		return BadRequest("invalid_transfer_id", "transfer_id %.64q: at most 256 bytes, no quotes, backslashes or line breaks", id)
	}
	m := &Mooncake{TransferID: id, Room: MooncakeRoom(id), DP: -1}
	r.Mooncake = m // (set from here on: a refusal below still names the room)
	if kv.DoRemotePrefill {
		u, err := url.Parse(kv.RemoteBootstrapAddr)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || len(kv.RemoteBootstrapAddr) > 512 {
			return BadRequest("invalid_remote_bootstrap_addr", "remote_bootstrap_addr %.64q is not the prefill instance's http bootstrap address", kv.RemoteBootstrapAddr)
		}
		m.Bootstrap = strings.TrimRight(kv.RemoteBootstrapAddr, "/")
		if kv.RemoteEngineID == nil {
			return BadRequest("invalid_remote_engine_id", "remote_engine_id is missing: the decode leg names the prefill engine (GET /query on its bootstrap address)")
		}
		_, dp, ok := ParseMooncakeEngineID(*kv.RemoteEngineID)
		if !ok {
			return BadRequest("invalid_remote_engine_id", "remote_engine_id %.64q is not one a kvbridge prefill instance gives (GET /query on its bootstrap address)", *kv.RemoteEngineID)
		}
		m.EngineID, m.DP = *kv.RemoteEngineID, dp
	}
	return nil
}

// Message is one chat message.
type Message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// ChatTemplate renders messages as the example's prompt text: each message
// as "<|role|>\n" + its text + "\n", then "<|assistant|>\n" (the text's
// bytes are the token ids). Content is a string or an array of
// {"type": "text", "text": …} parts; roles are system, developer, user,
// assistant and tool.
func ChatTemplate(msgs []Message) (string, error) {
	if len(msgs) == 0 {
		return "", errors.New("messages is empty")
	}
	var b strings.Builder
	for i, m := range msgs {
		switch m.Role {
		case "system", "developer", "user", "assistant", "tool":
		default:
			return "", fmt.Errorf("messages[%d]: role %.32q: want system, developer, user, assistant or tool", i, m.Role)
		}
		var text string
		if err := json.Unmarshal(m.Content, &text); err != nil {
			var parts []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}
			if err := json.Unmarshal(m.Content, &parts); err != nil {
				return "", fmt.Errorf("messages[%d]: content must be a string or an array of text parts", i)
			}
			for j, p := range parts {
				if p.Type != "text" {
					return "", fmt.Errorf("messages[%d].content[%d]: part type %.32q: the example reads text parts only", i, j, p.Type)
				}
				text += p.Text
			}
		}
		b.WriteString("<|" + m.Role + "|>\n" + text + "\n")
	}
	b.WriteString("<|assistant|>\n")
	return b.String(), nil
}

// Tokenize is the example's byte-level tokenizer: a text's UTF-8 bytes are
// its token ids (0–255).
func Tokenize(s string) []int {
	ids := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		ids[i] = int(s[i])
	}
	return ids
}

// Detok renders a token: printable ASCII as itself, others as <|id|>.
func Detok(id int) string {
	if id >= 0x20 && id < 0x7f {
		return string(rune(id))
	}
	return fmt.Sprintf("<|%d|>", id)
}

// DetokAll renders tokens.
func DetokAll(ids []int) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(Detok(id))
	}
	return b.String()
}
