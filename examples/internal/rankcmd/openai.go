package rankcmd

// OpenAI routes of the example ranks (-compute tinyllm), served by each
// instance's front (front.go) for the whole instance, in the three ways a
// router drives a disaggregated pair:
//
//   - SGLang's wire (SGLang's router, the llm-d sidecar's "sglang"
//     connector): the same body to both servers at once, with
//     bootstrap_host, bootstrap_port and bootstrap_room. The prefill server
//     creates the room bootstrap_room on its ranks (DP group room % dp),
//     computes and sends when the decode ranks ask; the decode server
//     pulls it from the bootstrap server at http://bootstrap_host:bootstrap_port
//     and generates. Either may come first.
//   - vLLM's serial wire (the sidecar's "nixlv2" connector): the prefill
//     server gets kv_transfer_params.do_remote_decode, computes, holds the
//     KV under a lease and answers kv_transfer_params naming the room (lease.go);
//     the decode server gets them back and starts the room from them alone.
//   - Neither: the front serves the request alone (the whole model runs on
//     its rank), as a model server does when a router sends no P/D fields.
//
// Errors are OpenAI error objects: 400 bad input, 401 no token, 404 another
// model, 409 a room id already in use (or kv_transfer_params already
// served), 503 when the room's other side failed, is unreachable or its
// lease ended, 504 when -request-timeout passed. A request refused after
// its room id was read tells the other side (the room is created and
// aborted at once), so neither server waits for it.

import (
	"context"
	crand "crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/kvbridge/kvbridge/examples/internal/openai"
	"github.com/kvbridge/kvbridge/examples/internal/tinyllm"
	"github.com/kvbridge/kvbridge/internal/records"
	"github.com/kvbridge/kvbridge/kvmanager"
	"go.uber.org/zap"
)

func (t *tinyRank) openaiRoutes(mux *http.ServeMux) {
	mux.HandleFunc("/v1/completions", t.serveOpenAI(false))
	mux.HandleFunc("/v1/chat/completions", t.serveOpenAI(true))
	mux.HandleFunc("/v1/models", t.serveModels)
	mux.HandleFunc("/health", t.serveHealth)
}

// authorizedJSON is authorized with an OpenAI error object.
func (r *Rank) authorizedJSON(w http.ResponseWriter, req *http.Request) bool {
	if r.token == "" {
		return true
	}
	got, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	if ok && subtle.ConstantTimeCompare([]byte(got), []byte(r.token)) == 1 {
		return true
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="kvbridge"`)
	openai.WriteError(w, openai.Errorf(401, "invalid_api_key", "%s needs the deployment's bearer token (Authorization: Bearer …; %s -print-token prints it)", req.URL.Path, roleName(r.Role)))
	return false
}

func (t *tinyRank) serveModels(w http.ResponseWriter, req *http.Request) {
	if !t.r.authorizedJSON(w, req) {
		return
	}
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
		Root    string `json:"root"`
		MaxLen  int    `json:"max_model_len"`
	}
	writeJSON(w, map[string]any{"object": "list", "data": []model{{ID: t.r.served, Object: "model", Created: t.r.started.Unix(),
		OwnedBy: "kvbridge", Root: t.m.Fingerprint(), MaxLen: t.r.npage * t.r.Model.PageTokens}}})
}

// serveHealth answers 200 once the rank serves; a front only once every
// rank of its instance has joined.
func (t *tinyRank) serveHealth(w http.ResponseWriter, req *http.Request) {
	if t.r.isFront() {
		ms, err := t.members(-1)
		if err == nil && t.r.Role == kvmanager.RolePrefill {
			err = t.registered(req.Context(), ms)
		}
		if err != nil {
			openai.WriteError(w, openai.Errorf(503, "instance_incomplete", "%v", err))
			return
		}
	}
	fmt.Fprintln(w, "ok")
}

// registered checks that every rank of a prefill instance is the process
// its bootstrap server's record names (GET /v1/ranks, bounded by 2 s):
// until then a decode rank cannot reach the instance whole (issue 51:
// /health said ok while the bootstrap server had 1 of 2 ranks).
func (t *tinyRank) registered(ctx context.Context, ms []member) error {
	boot := t.r.bootURL
	if !strings.HasPrefix(boot, "http://") && !strings.HasPrefix(boot, "https://") {
		return nil // etcd: the records are the ranks' own leases
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	for _, m := range ms {
		in := m.info
		if m.url == "" {
			in = Info{Parallel: t.r.Par, Epoch: t.r.epoch()}
		}
		p := in.Parallel
		var ri records.RankInfo
		err := getJSON(ctx, t.r.httpClient, fmt.Sprintf("%s/v1/ranks?dp=%d&tp=%d&pp=%d", boot, p.DPRank, p.TPRank, p.PPRank), &ri)
		switch {
		case err != nil:
			return fmt.Errorf("rank dp %d tp %d pp %d is not registered at the bootstrap server %s: %v", p.DPRank, p.TPRank, p.PPRank, boot, err)
		case ri.Epoch != in.Epoch:
			return fmt.Errorf("rank dp %d tp %d pp %d: the bootstrap server %s names another process (epoch %d, the rank's %d)", p.DPRank, p.TPRank, p.PPRank, boot, ri.Epoch, in.Epoch)
		}
	}
	return nil
}

func (t *tinyRank) serveOpenAI(chat bool) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			openai.WriteError(w, openai.Errorf(405, "method_not_allowed", "POST a request to %s", req.URL.Path))
			return
		}
		if !t.r.authorizedJSON(w, req) {
			return
		}
		if !t.r.isFront() {
			openai.WriteError(w, openai.Errorf(421, "not_front", "this rank (%v) is not its instance's front: send OpenAI requests to the rank at TP 0, PP 0, DP 0", t.r.Par))
			return
		}
		data, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxModelBody))
		if err != nil {
			openai.WriteError(w, openai.Errorf(413, "body_too_large", "the body exceeds %d bytes", maxModelBody))
			return
		}
		oreq, oe := openai.Parse(data, chat, t.m.Vocab)
		if oreq != nil && oreq.Mooncake != nil && t.r.Role == kvmanager.RolePrefill {
			// The prefill leg's DP group comes in a header: the one whose
			// engine id the decode leg was given.
			if dp, he := t.r.mooncakeDP(req.Header.Get(mooncakeDPHeader), oreq.Mooncake.Room); he != nil && oe == nil {
				oe = he
			} else if he == nil {
				oreq.Mooncake.DP = dp
			}
		}
		if oe == nil && oreq.Model != "" && oreq.Model != t.r.served {
			oe = openai.Errorf(404, "model_not_found", "the model %.64q does not exist here: this server serves %q", oreq.Model, t.r.served)
		}
		if oe == nil {
			extra := 0
			if t.r.Role == kvmanager.RoleDecode || (oreq.SGLang == nil && oreq.KVTransfer == nil) {
				extra = oreq.MaxTokens - 1
			}
			if err := t.checkPrompt(oreq.Prompt, extra); err != nil {
				oe = openai.BadRequest("context_length_exceeded", "%v", err)
			}
		}
		if oe != nil {
			t.refuseDisagg(oreq, oe.Body.Code, fmt.Sprintf("%s refused the request: %s", roleName(t.r.Role), oe.Body.Message))
			openai.WriteError(w, oe)
			return
		}
		id := requestID(req)
		prefix := "cmpl-"
		if chat {
			prefix = "chatcmpl-"
		}
		wr := openai.NewWriter(w, oreq, prefix+id, t.r.served)
		ctx, cancel := context.WithTimeout(req.Context(), t.r.reqTimeout)
		defer cancel()
		switch {
		case t.r.Role == kvmanager.RolePrefill && oreq.Offload != nil && oreq.KVTransfer.RemoteDecoder != nil:
			t.prefillOffload(ctx, wr, oreq)
		case t.r.Role == kvmanager.RoleDecode && oreq.Offload != nil && oreq.KVTransfer.RemotePrefiller != nil:
			t.decode(ctx, wr, oreq, oreq.Offload.Room, oreq.Offload.Bootstrap, nil, "offloading")
		case oreq.Offload != nil:
			wr.Fail(openai.BadRequest("wrong_server", "kv_transfer_params with %s go to a %s server, this is a %s server",
				map[bool]string{true: "remote_decoder", false: "remote_prefiller"}[oreq.KVTransfer.RemoteDecoder != nil],
				map[bool]string{true: "prefill", false: "decode"}[oreq.KVTransfer.RemoteDecoder != nil], roleName(t.r.Role)))
		case t.r.Role == kvmanager.RoleDecode && oreq.Push != nil && oreq.KVTransfer.DoRemotePrefill:
			// vLLM push, dispatched at once with the prefill leg from a
			// cached identity: the room the transfer id names, started at
			// the identity's bootstrap server (a prefill process restarted
			// since serves it too: the room meets it there).
			t.decode(ctx, wr, oreq, oreq.Push.Room, oreq.Push.Bootstrap, nil, "push")
		case t.r.Role == kvmanager.RolePrefill && oreq.Mooncake != nil:
			t.prefillMooncake(ctx, wr, oreq)
		case t.r.Role == kvmanager.RoleDecode && oreq.Mooncake != nil && oreq.KVTransfer.DoRemotePrefill:
			mc := oreq.Mooncake
			dp := mc.DP
			t.decode(ctx, wr, oreq, mc.Room, mc.Bootstrap, &dp, "mooncake")
		case t.r.Role == kvmanager.RolePrefill && oreq.SGLang != nil:
			t.prefillSGLang(ctx, wr, oreq)
		case t.r.Role == kvmanager.RolePrefill && oreq.KVTransfer != nil && oreq.KVTransfer.DoRemoteDecode:
			t.prefillVLLM(ctx, wr, oreq, id, req)
		case t.r.Role == kvmanager.RoleDecode && oreq.SGLang != nil:
			sg := oreq.SGLang
			t.decode(ctx, wr, oreq, sg.Room, t.sglangURL(sg), nil, "sglang")
		case t.r.Role == kvmanager.RoleDecode && oreq.KVTransfer != nil && oreq.KVTransfer.DoRemotePrefill:
			room, tk, oe := t.r.checkTicket(oreq.KVTransfer, oreq.Prompt, time.Now())
			if oe == nil {
				oe = t.r.ticketHolders(ctx, room, tk)
			}
			if oe == nil {
				_, oe = t.used.claim(room, time.UnixMilli(tk.ExpiresMS), time.Now())
			}
			if oe != nil {
				wr.Fail(oe)
				return
			}
			dp := tk.DP
			t.decode(ctx, wr, oreq, room, tk.Bootstrap, &dp, "vllm")
		case oreq.KVTransfer != nil:
			wr.Fail(openai.BadRequest("wrong_server", "kv_transfer_params with do_remote_decode=%t go to a %s server, this is a %s server",
				oreq.KVTransfer.DoRemoteDecode, map[bool]string{true: "prefill", false: "decode"}[oreq.KVTransfer.DoRemoteDecode], roleName(t.r.Role)))
		default:
			t.local(ctx, wr, oreq)
		}
	}
}

// requestID is the request's X-Request-Id (as vLLM takes it), or a fresh
// one.
func requestID(req *http.Request) string {
	if id := req.Header.Get("X-Request-Id"); id != "" && len(id) <= 128 && !strings.ContainsAny(id, "\"\\\r\n") {
		return id
	}
	var b [12]byte
	crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ext is the answer's "kvbridge" extension.
type ext struct {
	Mode        string             `json:"mode"`                  // sglang, vllm, local
	Room        uint64             `json:"room,omitempty,string"` // a string: routers that re-encode JSON as float64s keep it
	PrefixPages int                `json:"prefix_pages,omitempty"`
	PhasesMS    map[string]float64 `json:"phases_ms,omitempty"`
	// ReusedTokens: the prompt's tokens a prefill took from an earlier
	// turn's decode instance (multi-turn reuse) instead of computing them.
	ReusedTokens int `json:"reused_tokens,omitempty"`
}

// codeError is an OpenAI error for a failure code of a rank.
func codeError(code, format string, args ...any) *openai.Error {
	switch code {
	case CodeRoomReused:
		return openai.Errorf(409, code, format, args...)
	case CodeDeadline:
		return openai.Errorf(504, code, format, args...)
	case CodeNoPages, CodeRoomFailed, CodeLeaseExpiry, CodeClientGone:
		return openai.Errorf(503, code, format, args...)
	}
	return openai.Errorf(500, "internal", format, args...)
}

func (t *tinyRank) sglangURL(sg *openai.SGLang) string {
	port := sg.Port
	if port == 0 {
		port = t.r.sglangPort
	}
	return "http://" + net.JoinHostPort(sg.Host, strconv.Itoa(port))
}

// prefillRequest is the per-rank request of a prefill instance's room.
func (t *tinyRank) prefillRequest(oreq *openai.Request, room uint64, lease time.Duration, reuse *reusedPrefix) PrefillRequest {
	// (reuse: an earlier turn's prefix, fetched by the front, which is the
	// instance's one rank)
	pr := PrefillRequest{Room: room, Prompt: oreq.Prompt, TimeoutMS: int(t.r.reqTimeout.Milliseconds()), LeaseMS: int(lease.Milliseconds()), reuse: reuse}
	if oreq.AbortAt == "prefill" {
		pr.AbortAt = "compute"
	}
	if oreq.Fault == "swap-heads-prefill" {
		pr.Fault = "swap-heads"
	}
	return pr
}

// instancePrefill runs a room on every rank of its DP group (this rank's
// directly, the others' over /v1/prefill) and returns this rank's result,
// or the first member's when it is not in the group. With a lease the
// members answer once computed (Held); if any fails, every member's room
// is aborted.
//
// replay (vLLM's flow) is the request's kv_transfer_params: once the
// request is admitted, the earlier turn they may name is fetched (reuse.go)
// and only the rest of the prompt computed.
func (t *tinyRank) instancePrefill(ctx context.Context, oreq *openai.Request, room uint64, group int, lease time.Duration, replay *openai.KVTransferParams) (PrefillResult, *openai.Error) {
	r := t.r
	if group < 0 {
		group = int(room % uint64(max(r.Par.DPSize, 1)))
	}
	ms, err := t.members(group)
	if err != nil {
		t.refuseDisagg(oreq, "instance_incomplete", err.Error())
		return PrefillResult{}, openai.Errorf(503, "instance_incomplete", "room %d: %v", room, err)
	}
	release, oe := t.claim(room)
	if oe != nil {
		return PrefillResult{}, oe // (not told to the other side: the room is the other request's)
	}
	defer release()
	var reuse *reusedPrefix
	fetchStart := time.Now()
	if replay != nil {
		reuse = t.fetchReuse(ctx, replay, oreq.Prompt)
	}
	fetchMS := float64(time.Since(fetchStart).Microseconds()) / 1e3
	pr := t.prefillRequest(oreq, room, lease, reuse)
	results := make([]PrefillResult, len(ms))
	cl := r.client()
	ferr := fanOut(ms, func(i int, m member) error {
		var err error
		switch {
		case m.url == "" && lease > 0:
			results[i] = t.prefillHeld(ctx, pr, r.reqTimeout)
		case m.url == "":
			results[i] = t.prefill(ctx, pr, r.reqTimeout, nil)
		default:
			results[i], err = cl.Prefill(ctx, m.url, pr)
		}
		want := "Success"
		if lease > 0 {
			want = Held
		}
		if err == nil && (results[i].Status != want || results[i].Error != "") {
			return &rankFailure{results[i]}
		}
		return err
	})
	if ferr != nil {
		if lease > 0 {
			// Members that hold the room must not wait for a decode
			// request that will never come.
			t.abortMembers(ms, AbortRequest{Room: room, Reason: "prefill request failed on another rank of the instance"})
		}
		return PrefillResult{}, prefillError(room, ferr)
	}
	if replay != nil && replay.RemoteEngineID != nil && results[0].PhasesMS != nil {
		results[0].PhasesMS["reuse"] = fetchMS // (fetching an earlier turn, before the pass)
	}
	return results[0], nil
}

type rankFailure struct{ res PrefillResult }

func (f *rankFailure) Error() string {
	return fmt.Sprintf("room %d %s %s%s", f.res.Room, f.res.Status, f.res.Reason, f.res.Error)
}

// prefillError is the client's error for a failed instance prefill: the
// most specific member's code (a room reused or a peer's 400 first).
func prefillError(room uint64, err error) *openai.Error {
	var rf *rankFailure
	var se *StatusError
	switch {
	case errors.As(err, &se) && se.Code == http.StatusBadRequest:
		return openai.BadRequest("invalid_request", "room %d: %v", room, err)
	case errors.As(err, &rf):
		return codeError(rf.res.Code, "room %d failed on the prefill side: %v", room, err)
	case errors.Is(err, context.DeadlineExceeded):
		return codeError(CodeDeadline, "room %d: %v", room, err)
	}
	return codeError(CodeRoomFailed, "room %d failed on the prefill side: %v", room, err)
}

// claim reserves a room id on this front for one request until it ends.
// A second request naming a room another request is running here is
// refused 409 before any rank of the instance creates it: each rank
// checks only its own rooms, so two requests with one id (a router that
// reuses bootstrap_room) could otherwise each take some of the instance's
// ranks and fail both, or pair one's KV with the other's decode.
func (t *tinyRank) claim(room uint64) (release func(), oe *openai.Error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.claimed[room] {
		return nil, openai.Errorf(409, CodeRoomReused, "room %d is another request's on this instance: a router gave one room id to two requests", room)
	}
	t.claimed[room] = true
	return func() {
		t.mu.Lock()
		delete(t.claimed, room)
		t.mu.Unlock()
	}, nil
}

// abortMembers aborts a room on the members (this rank directly).
func (t *tinyRank) abortMembers(ms []member, a AbortRequest) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := t.r.client()
	fanOut(ms, func(_ int, m member) error {
		if m.url == "" {
			t.abortRoom(a)
			return nil
		}
		return cl.Abort(ctx, m.url, a)
	})
}

// refuseDisagg tells the other side of a refused request's room that it
// will not be served here (in the background, bounded): every rank of
// this instance that the room would run on creates and aborts it.
func (t *tinyRank) refuseDisagg(oreq *openai.Request, code, reason string) {
	if oreq == nil || !t.r.isFront() {
		return
	}
	a := AbortRequest{Reason: reason}
	group := -2 // the prefill instance's DP group holding the room: room % dp
	switch {
	case oreq.Offload != nil && t.r.Role == kvmanager.RolePrefill && oreq.KVTransfer.RemoteDecoder != nil:
		a.Room = oreq.Offload.Room
	case oreq.Offload != nil && oreq.KVTransfer.RemotePrefiller != nil:
		if oreq.Offload.Bootstrap == "" {
			return // no prefill instance named: nobody to tell
		}
		a.Room, a.Prefill = oreq.Offload.Room, oreq.Offload.Bootstrap
	case oreq.Offload != nil:
		return // a leg sent to the other role's server: refused, nothing of it here
	case oreq.Push != nil && t.r.Role == kvmanager.RolePrefill && oreq.KVTransfer.DoRemoteDecode:
		a.Room = oreq.Push.Room // (its group: room % dp, as its decode leg's)
	case oreq.Push != nil && oreq.KVTransfer.DoRemotePrefill && t.r.Role == kvmanager.RoleDecode:
		if oreq.Push.Bootstrap == "" {
			return // no prefill instance named: nobody to tell
		}
		a.Room, a.Prefill = oreq.Push.Room, oreq.Push.Bootstrap
	case oreq.Push != nil:
		return
	case oreq.Mooncake != nil && t.r.Role == kvmanager.RolePrefill:
		a.Room, group = oreq.Mooncake.Room, oreq.Mooncake.DP // (-1, unknown: every group)
	case oreq.Mooncake != nil && oreq.KVTransfer.DoRemotePrefill:
		if oreq.Mooncake.Bootstrap == "" {
			return // no prefill instance named: nobody to tell
		}
		a.Room, a.Prefill = oreq.Mooncake.Room, oreq.Mooncake.Bootstrap
		if dp := oreq.Mooncake.DP; dp >= 0 {
			a.PrefillDP = &dp
		}
	case oreq.Mooncake != nil:
		return // a prefill leg sent to a decode server: refused, nothing of it here
	case oreq.SGLang != nil && t.r.Role == kvmanager.RolePrefill:
		a.Room = oreq.SGLang.Room
	case oreq.SGLang != nil:
		a.Room, a.Prefill = oreq.SGLang.Room, t.sglangURL(oreq.SGLang)
	case oreq.KVTransfer != nil && oreq.KVTransfer.DoRemotePrefill && t.r.Role == kvmanager.RoleDecode:
		room, tk, oe := t.r.checkTicket(oreq.KVTransfer, oreq.Prompt, time.Now())
		if oe != nil {
			return // not a room of ours, or already released
		}
		dp := tk.DP
		a.Room, a.Prefill, a.PrefillDP = room, tk.Bootstrap, &dp
	default:
		return
	}
	t.lease.refused.WithLabelValues(code).Inc()
	t.r.wg.Add(1)
	go func() {
		defer t.r.wg.Done()
		if a.Prefill != "" {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			oe := t.probe(ctx, a.Prefill)
			cancel()
			if oe != nil {
				return // nobody to tell
			}
		}
		dp := -1
		if t.r.Role == kvmanager.RolePrefill {
			dp = group
			if group == -2 {
				dp = int(a.Room % uint64(max(t.r.Par.DPSize, 1)))
			}
		}
		ms, _ := t.members(dp)
		if ms == nil {
			ms = []member{{}}
		}
		if oreq.Mooncake != nil && a.Prefill != "" && a.PrefillDP == nil {
			// A decode leg whose engine id named no DP group: every rank
			// of the prefill instance is told (one group holds the room),
			// by one rank of this instance.
			a.PrefillAll = true
			ms = ms[:1]
		}
		t.abortMembers(ms, a)
	}()
}

// prefillTopology is the topology of the prefill instance at the
// bootstrap server boot (false when it cannot be read).
func (t *tinyRank) prefillTopology(boot string) (records.Topology, bool) {
	var topo records.Topology
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, boot+"/v1/topology", nil)
	if err != nil {
		return topo, false
	}
	resp, err := t.r.httpClient.Do(req)
	if err != nil {
		return topo, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&topo) != nil {
		return topo, false
	}
	// (bounded: a room has at most 1,024 sources)
	return topo, max(topo.DPSize, 1)*max(topo.TPSize, 1)*max(topo.PPSize, 1) <= 1024
}

// prefillSGLang: the prefill side of SGLang's wire. The answer (which the
// routers discard) is the first token, after the room ended.
func (t *tinyRank) prefillSGLang(ctx context.Context, wr *openai.Writer, oreq *openai.Request) {
	room := oreq.SGLang.Room
	res, oe := t.instancePrefill(ctx, oreq, room, -1, 0, nil)
	if oe != nil {
		wr.Fail(oe)
		return
	}
	wr.Token(res.FirstToken)
	wr.Finish(nil, ext{Mode: "sglang", Room: room, PhasesMS: res.PhasesMS})
}

// mooncakeDPHeader names the prefill leg's DP group in the
// MooncakeConnector wire (the llm-d sidecar sets it to the group whose
// engine id it gave the decode leg).
const mooncakeDPHeader = "X-data-parallel-rank"

// mooncakeDP reads the prefill leg's X-data-parallel-rank: a DP group of
// this instance; absent, the room's group (room % dp).
func (r *Rank) mooncakeDP(h string, room uint64) (int, *openai.Error) {
	n := max(r.Par.DPSize, 1)
	if h == "" {
		return int(room % uint64(n)), nil
	}
	dp, err := strconv.Atoi(h)
	if err != nil || dp < 0 || dp >= n || strconv.Itoa(dp) != h {
		return 0, openai.BadRequest("invalid_dp_rank", "%s %.16q is not a DP group of this instance, [0, %d)", mooncakeDPHeader, h, n)
	}
	return dp, nil
}

// prefillMooncake: the prefill side of the MooncakeConnector wire: as
// SGLang's (both legs at once, either first), the room named by the
// transfer id, on the DP group the header names.
func (t *tinyRank) prefillMooncake(ctx context.Context, wr *openai.Writer, oreq *openai.Request) {
	mc := oreq.Mooncake
	res, oe := t.instancePrefill(ctx, oreq, mc.Room, mc.DP, 0, nil)
	if oe != nil {
		wr.Fail(oe)
		return
	}
	wr.Token(res.FirstToken)
	wr.Finish(nil, ext{Mode: "mooncake", Room: mc.Room, PhasesMS: res.PhasesMS})
}

// prefillOffload: the prefill side of the OffloadingConnector wire (the
// sidecar sends it first, then the decode leg): the room named by the
// kv_request_id, computed and held under -kv-lease for the decode leg to
// start, as in vLLM's serial wire; the answer (which the sidecar
// discards) is the first token.
func (t *tinyRank) prefillOffload(ctx context.Context, wr *openai.Writer, oreq *openai.Request) {
	room := oreq.Offload.Room
	res, oe := t.instancePrefill(ctx, oreq, room, -1, t.r.kvLease, nil)
	if oe != nil {
		wr.Fail(oe)
		return
	}
	wr.Token(res.FirstToken)
	wr.Finish(nil, ext{Mode: "offloading", Room: room, PhasesMS: res.PhasesMS})
}

// serveMooncakeQuery answers GET /query on the bootstrap address as vLLM's
// MooncakeConnector bootstrap server does: for each DP group of the
// instance, by its number, the engine id the decode leg names it by.
func (r *Rank) serveMooncakeQuery(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet {
		w.Header().Set("Allow", "GET")
		http.Error(w, "GET /query", http.StatusMethodNotAllowed)
		return
	}
	out := map[string]map[string]any{}
	for dp := range max(r.Par.DPSize, 1) {
		out[strconv.Itoa(dp)] = map[string]any{"engine_id": openai.MooncakeEngineID(r.Instance, dp), "dp_rank": dp,
			"tp_size": r.Par.TPSize, "pp_size": max(r.Par.PPSize, 1), "bootstrap": r.bootURL}
	}
	writeJSON(w, out)
}

// randomRoom is a room id for vLLM's flow, where the prefill server picks
// it: 63 random bits.
func randomRoom() uint64 {
	var b [8]byte
	crand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) >> 1
}

// prefillVLLM: the prefill side of vLLM's serial wire: compute, hold the
// KV under the lease, answer the first token and kv_transfer_params.
func (t *tinyRank) prefillVLLM(ctx context.Context, wr *openai.Writer, oreq *openai.Request, id string, req *http.Request) {
	r := t.r
	room, lease := randomRoom(), r.kvLease
	if oreq.Push != nil {
		// vLLM push dispatched at once: the decode leg, from the cached
		// identity, starts the room its transfer id names. It was sent
		// with this leg, so its REQUESTs come about when this leg ends:
		// the KV is held for -push-claim only. (A decode leg refused for
		// a stale identity — the instance moved — cannot tell this one.)
		room, lease = oreq.Push.Room, min(lease, r.pushClaim)
	}
	// A later turn of a conversation (the llm-d sidecar's bidirectional
	// KV transfer replays the decode answer's kv_transfer_params here):
	// its prefix from the decode instance that keeps it, when it can.
	start := time.Now()
	boot := r.advertisedBootstrap(req)
	res, oe := t.instancePrefill(ctx, oreq, room, -1, lease, oreq.KVTransfer)
	if oe != nil {
		wr.Fail(oe)
		return
	}
	// Every member's lease began after start: the ticket's end is no later
	// than any of theirs.
	exp := start.Add(lease)
	group := int(room % uint64(max(r.Par.DPSize, 1)))
	ms, _ := t.members(group) // (instancePrefill ran on them)
	tk := &openai.Ticket{Version: ticketVersion, Room: strconv.FormatUint(room, 10), Bootstrap: boot, DP: group, Instance: r.Instance,
		Tokens: len(oreq.Prompt), Prompt: promptHashHex(oreq.Prompt), ExpiresMS: exp.UnixMilli(), Ranks: ticketRanks(ms, r.info())}
	r.sign(tk)
	kv := &openai.KVTransferParams{DoRemotePrefill: true, RemoteEngineID: &r.Instance, RemoteRequestID: id,
		RemoteBlockIDs: []int{}, RemoteNumTokens: len(oreq.Prompt), TPSize: r.Par.TPSize, PPSize: r.Par.PPSize,
		RemoteBlocksExpiryTime: float64(exp.UnixMilli()) / 1e3, TransferMode: "push", KVBridge: tk}
	for _, p := range res.Pages {
		kv.RemoteBlockIDs = append(kv.RemoteBlockIDs, int(p))
	}
	if u, err := url.Parse(boot); err == nil {
		host := u.Hostname()
		kv.RemoteHost = &host
		if p, err := strconv.Atoi(u.Port()); err == nil {
			kv.RemotePort = &p
		}
	}
	wr.Token(res.FirstToken)
	wr.Finish(kv, ext{Mode: "vllm", Room: room, PhasesMS: res.PhasesMS, ReusedTokens: res.Reused})
}

// advertisedBootstrap is the bootstrap URL decode ranks reach this
// instance at: this rank's, its host replaced by the address the request
// came in on when it is unspecified (a server bound to 0.0.0.0).
func (r *Rank) advertisedBootstrap(req *http.Request) string {
	u, err := url.Parse(r.bootURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return r.bootURL
	}
	if ip := net.ParseIP(u.Hostname()); ip != nil && ip.IsUnspecified() {
		if la, ok := req.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			if host, _, err := net.SplitHostPort(la.String()); err == nil {
				u.Host = net.JoinHostPort(host, u.Port())
			}
		}
	}
	return u.String()
}

// probe checks that a bootstrap server answers at url with its whole
// instance registered (GET /v1/topology, once; http and https URLs; an
// answer is trusted for 5 s), so a room naming one that nobody serves, or
// an instance not yet whole, fails now rather than at the bootstrap
// timeout (the rank's topology lookup retries until then, and a receiver's
// creation waits for it).
func (t *tinyRank) probe(ctx context.Context, boot string) *openai.Error {
	if !strings.HasPrefix(boot, "http://") && !strings.HasPrefix(boot, "https://") {
		return nil
	}
	if at, ok := t.probes.Load(boot); ok && time.Since(at.(time.Time)) < 5*time.Second {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, boot+"/v1/topology", nil)
	if err != nil {
		return openai.BadRequest("invalid_bootstrap", "bootstrap URL %.128q: %v", boot, err)
	}
	resp, err := t.r.httpClient.Do(req)
	if err == nil {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("GET /v1/topology answered %s: %s", resp.Status, strings.TrimSpace(string(msg)))
		}
	}
	if err != nil {
		return openai.Errorf(503, "bootstrap_unreachable", "no whole prefill instance at the kvbridge bootstrap server %s (named by bootstrap_host and bootstrap_port, or kv_transfer_params): %v", boot, err)
	}
	t.probes.Store(boot, time.Now())
	return nil
}

// decode runs a room on every rank of this decode instance — the others
// over /v1/generate, this one generating — and streams the tokens.
func (t *tinyRank) decode(ctx context.Context, wr *openai.Writer, oreq *openai.Request, room uint64, boot string, dp *int, mode string) {
	r := t.r
	fail := func(oe *openai.Error) {
		t.refuseDisagg(oreq, oe.Body.Code, oe.Body.Message)
		wr.Fail(oe)
	}
	if r.Par.DPSize > 1 {
		fail(openai.Errorf(500, "unsupported", "the example generates on decode instances of DP 1, this one has DP %d", r.Par.DPSize))
		return
	}
	ms, err := t.members(-1)
	if err != nil {
		fail(openai.Errorf(503, "instance_incomplete", "room %d: %v", room, err))
		return
	}
	release, oe := t.claim(room)
	if oe != nil {
		wr.Fail(oe) // (not told to the other side: the room is the other request's)
		return
	}
	defer release()
	if oe := t.probe(ctx, boot); oe != nil {
		wr.Fail(oe)
		return
	}
	gr := GenerateRequest{Room: room, Prompt: oreq.Prompt, MaxTokens: oreq.MaxTokens, Prefill: boot, PrefillDP: dp,
		TimeoutMS: int(r.reqTimeout.Milliseconds()), Keep: r.reuse != nil && (mode == "vllm" || mode == "push")}
	switch oreq.AbortAt {
	case "decode-before":
		gr.AbortAt = "before"
	case "decode-mid":
		gr.AbortAt = "mid"
	}
	if oreq.Fault == "swap-heads-decode" {
		gr.Fault = "swap-heads"
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	peerErr := make(chan error, 1)
	var peers []member
	for _, m := range ms {
		if m.url != "" {
			peers = append(peers, m)
			gr.Peers = append(gr.Peers, m.url)
		}
	}
	cl := r.client()
	pg := gr
	pg.Peers = nil
	go func() {
		peerErr <- fanOut(peers, func(_ int, m member) error {
			ev, err := cl.Generate(ctx, m.url, pg, nil)
			if err == nil && (ev.Status != "Success" || ev.Error != "") {
				err = fmt.Errorf("room %d %s %s%s", room, ev.Status, ev.Reason, ev.Error)
			}
			if err != nil {
				cancel() // this rank's gather would wait for the share
			}
			return err
		})
	}()
	ev := t.generate(ctx, gr, func(e GenerateEvent) error {
		if e.Token == nil {
			return nil
		}
		return wr.Token(*e.Token)
	})
	if ev.Status != "Success" || ev.Error != "" {
		cancel()
	}
	perr := <-peerErr
	switch {
	case ev.Status == "Success" && ev.Error == "" && perr == nil:
		// (ev.Reuse: the turn kept for the next, named as vLLM's decode
		// names the blocks it keeps, do_remote_decode set; released at once
		// when the answer does not reach the client)
		if err := wr.Finish(ev.Reuse, ext{Mode: mode, Room: room, PrefixPages: ev.PrefixPages, PhasesMS: ev.PhasesMS}); err != nil {
			t.unsent(ev.reuseRoom, err.Error())
		}
		return
	case ev.Code == CodeClientGone:
		r.log.Info("client gone mid-answer", zap.Uint64("room", room), zap.String("error", ev.Error))
		t.unsent(ev.reuseRoom, "the client went away")
	default:
		msg := fmt.Sprintf("room %d: %s %s%s", room, ev.Status, ev.Reason, ev.Error)
		if perr != nil && (ev.Code == "" || ev.Code == CodeClientGone) {
			msg, ev.Code = fmt.Sprintf("room %d: %v", room, perr), CodeRoomFailed
		} else if perr != nil {
			msg += "; " + perr.Error()
		}
		t.unsent(ev.reuseRoom, msg)
		wr.Fail(codeError(ev.Code, "%s", msg))
	}
}

// local serves a request without a P/D pair: the whole model on this rank.
func (t *tinyRank) local(ctx context.Context, wr *openai.Writer, oreq *openai.Request) {
	plen := len(oreq.Prompt)
	kv := tinyllm.NewDense(t.m.Layers, t.m.KVHeads, t.m.HeadDim, plen+oreq.MaxTokens)
	lg, err := t.m.Prefill(oreq.Prompt, kv, func(int) error { return ctx.Err() })
	if err == nil {
		_, err = t.m.Continue(tinyllm.Argmax(lg), plen, oreq.MaxTokens, kv, func(_, tok int) error { return wr.Token(tok) })
	}
	switch {
	case err == nil:
		wr.Finish(nil, ext{Mode: "local"})
	case ctx.Err() == context.DeadlineExceeded:
		wr.Fail(codeError(CodeDeadline, "the request's deadline (%s) passed", t.r.reqTimeout))
	case ctx.Err() == nil:
		wr.Fail(codeError(CodeInternal, "%v", err))
	}
}
