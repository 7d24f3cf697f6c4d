package rankcmd

// -compute tinyllm: the example ranks serve a real model (internal/tinyllm).
//
//	prefill: POST /v1/prefill {room, prompt}: the forward pass over the
//	         prompt into this rank's pages (its TP rank's KV heads, its PP
//	         stage's layers), the first token into the aux item, and the
//	         pages sent to the decode ranks that asked (one Send, or with
//	         -layerwise one SendLayers per layer group as the pass finishes
//	         it); the answer is the room's outcome.
//	decode:  POST /v1/generate {room, prompt, max_tokens, prefill, ...}:
//	         pages for the prompt (fewer when a cached prefix covers its
//	         first pages: RequestSpec.Prefix), the room received, then the
//	         instance's first rank generates greedily and streams NDJSON
//	         events (one per token, then a final one); the other ranks hold
//	         their share until that rank has read it (GET /v1/kv).
//
//	front:   each instance's first rank also serves the OpenAI routes for
//	         the whole instance (openai.go, front.go, lease.go).
//
// The example has no collective: a decode instance of several ranks
// gathers its ranks' KV onto its first rank over HTTP after the transfer
// (a real engine computes attention on every rank and all-reduces). Every
// prefill rank computes the whole forward pass and keeps only its share,
// as a TP rank holds only its heads.

import (
	"context"
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/examples/internal/openai"
	"github.com/kvbridge/kvbridge/examples/internal/tinyllm"
	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/kvbridge/kvbridge/transfer"
)

// Info is GET /v1/info.
type Info struct {
	Role          string              `json:"role"`
	Model         kvmodel.Model       `json:"model"`
	Endpoint      string              `json:"endpoint"`
	Bootstrap     string              `json:"bootstrap"`
	Engine        string              `json:"engine"`
	Pages         int                 `json:"pages"`
	BytesPerToken uint64              `json:"bytes_per_token"`
	Instance      string              `json:"instance"`
	Parallel      transfer.Parallel   `json:"parallel"`
	Compute       string              `json:"compute"`
	Fingerprint   string              `json:"fingerprint,omitempty"` // the tinyllm model's
	Layout        transfer.PageLayout `json:"page_layout"`
	Vocab         int                 `json:"vocab,omitempty"` // the tinyllm model's
	Epoch         uint64              `json:"epoch"`           // the rank's process (its control-plane epoch)
}

func (r *Rank) vocab() int {
	if r.tiny == nil {
		return 0
	}
	return r.tiny.m.Vocab
}

func (r *Rank) fingerprint() string {
	if r.tiny == nil {
		return ""
	}
	return r.tiny.m.Fingerprint()
}

// tinyModel is the model the flags describe and its KV layout.
func tinyModel(o *options) (kvmodel.Model, *tinyllm.Model, error) {
	c := tinyllm.Default
	c.Seed = o.modelSeed
	for _, ov := range []struct{ v, dst *int }{{&o.layers, &c.Layers}, {&o.heads, &c.KVHeads}, {&o.dim, &c.HeadDim},
		{&o.qHeads, &c.QHeads}, {&o.ffn, &c.FFN}, {&o.vocab, &c.Vocab}} {
		if *ov.v > 0 {
			*ov.dst = *ov.v
		}
	}
	if o.dtype != 0 && o.dtype != 4 {
		return kvmodel.Model{}, nil, fmt.Errorf("-compute tinyllm keeps its KV in float32: -dtype-bytes %d", o.dtype)
	}
	tl, err := tinyllm.New(c)
	if err != nil {
		return kvmodel.Model{}, nil, err
	}
	pt := 16
	if o.pageTok > 0 {
		pt = o.pageTok
	}
	return kvmodel.Model{Name: "tinyllm", Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, DTypeBytes: 4, PageTokens: pt}, tl, nil
}

// tinyRank is a rank's model state.
type tinyRank struct {
	r               *Rank
	m               *tinyllm.Model
	cache           *tinyllm.Cache
	layout          transfer.PageLayout
	first, heads    int
	layer0, nlayers int
	prefix          *prefixCache // a decode instance of one rank, -prefix-cache-pages > 0
	mu              sync.Mutex
	held            map[uint64]*heldRoom
	live            map[uint64]func(reason string) // rooms running here, how to abort each (/v1/abort)
	view            instanceView                   // the front's: its instance's other ranks
	lease           *leaseMetrics                  // prefill: rooms held for a later decode request
	used            *usedTickets                   // decode front: kv_transfer_params already served
	probes          sync.Map                       // decode front: bootstrap URL → time.Time it last answered
	claimed         map[uint64]bool                // front: rooms a request is running on this instance (claim)
}

func (r *Rank) initTiny(m *tinyllm.Model, o *options) error {
	pl, _ := transfer.ParsePageLayout(o.pageLayout)
	first, heads, err := r.Mapping.Heads(r.Par.TPSize, r.Par.TPRank)
	if err != nil {
		return err
	}
	l0, nl := r.Mapping.StageLayers(r.Par.PPSize, r.Par.PPRank)
	c, err := tinyllm.NewCache(r.kv, l0, first, heads, m.HeadDim, r.Model.PageTokens, pl)
	if err != nil {
		return err
	}
	t := &tinyRank{r: r, m: m, cache: c, layout: pl, first: first, heads: heads, layer0: l0, nlayers: nl, held: map[uint64]*heldRoom{},
		live: map[uint64]func(string){}, view: instanceView{members: map[int]member{}}, used: newUsedTickets(), claimed: map[uint64]bool{}}
	reg := r.reg
	if r.Role != kvmanager.RolePrefill {
		reg = nil // (a decode rank holds nothing: the metrics are a prefill rank's)
	}
	if t.lease, err = newLeaseMetrics(reg); err != nil {
		return err
	}
	if reg == nil && r.reg != nil {
		if err := r.reg.Register(t.lease.refused); err != nil { // (refusals are both fronts')
			return err
		}
	}
	single := r.Par.TPSize*r.Par.PPSize*r.Par.DPSize == 1
	if r.Role == kvmanager.RoleDecode && single && o.prefixPages != 0 {
		n := o.prefixPages
		if n < 0 {
			n = o.pages / 8
		}
		if n > 0 {
			t.prefix = newPrefixCache(n, r.Model.PageTokens)
		}
	}
	r.tiny = t
	return nil
}

func (t *tinyRank) routes(mux *http.ServeMux) {
	t.openaiRoutes(mux)
	mux.HandleFunc("/v1/abort", t.serveAbort)
	mux.HandleFunc("/v1/instance/join", t.serveJoin)
	if t.r.Role == kvmanager.RolePrefill {
		mux.HandleFunc("/v1/prefill", t.servePrefill)
		return
	}
	mux.HandleFunc("/v1/generate", t.serveGenerate)
	mux.HandleFunc("/v1/kv", t.serveKV)
}

// guard serves h only with the bearer token.
func (r *Rank) guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.authorized(w, req) {
			h.ServeHTTP(w, req)
		}
	})
}

// authorized checks the bearer token (as POST /v1/room does).
func (r *Rank) authorized(w http.ResponseWriter, req *http.Request) bool {
	if r.token == "" {
		return true
	}
	got, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(r.token)) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="kvbridge"`)
		http.Error(w, req.URL.Path+" needs the deployment's bearer token", http.StatusUnauthorized)
		return false
	}
	return true
}

const maxModelBody = 1 << 20

// decodeBody reads one JSON object of at most maxModelBody bytes; false
// after answering the error.
func decodeBody(w http.ResponseWriter, req *http.Request, v any) bool {
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		http.Error(w, "POST a JSON object", http.StatusMethodNotAllowed)
		return false
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, req.Body, maxModelBody))
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("trailing data after the JSON value")
		}
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			http.Error(w, fmt.Sprintf("body exceeds %d bytes", maxModelBody), http.StatusRequestEntityTooLarge)
		} else {
			http.Error(w, "body must be one JSON object: "+err.Error(), http.StatusBadRequest)
		}
		return false
	}
	return true
}

// PrefillRequest is POST /v1/prefill.
type PrefillRequest struct {
	Room      uint64 `json:"room"`
	Prompt    []int  `json:"prompt"`
	TimeoutMS int    `json:"timeout_ms"`
	// LeaseMS > 0 holds the room for a decode request that comes later
	// (vLLM's serial flow): the answer comes once the forward pass is done
	// (Status "Held"), and the room then waits up to LeaseMS for its decode
	// ranks' REQUESTs — sending when they come, aborted at the lease's end
	// (counted) —, with TimeoutMS bounding its data phase.
	LeaseMS int `json:"lease_ms,omitempty"`
	// AbortAt "compute": abort the room once the forward pass is done,
	// before anything is sent (a prefill engine that fails a request).
	AbortAt string `json:"abort_at,omitempty"`
	// Fault "swap-heads" writes this rank's heads into its pages in
	// reverse order: a deliberately wrong head mapping, for tests.
	Fault string `json:"fault,omitempty"`
	// reuse is the prompt's prefix fetched from an earlier turn's decode
	// instance (reuse.go; an instance of one rank: never sent to another).
	reuse *reusedPrefix
}

// PrefillResult is its answer.
type PrefillResult struct {
	Room       uint64             `json:"room"`
	Status     string             `json:"status"`
	Reason     string             `json:"reason,omitempty"`
	FirstToken int                `json:"first_token"`
	PhasesMS   map[string]float64 `json:"phases_ms,omitempty"` // compute, ready, data
	Error      string             `json:"error,omitempty"`
	// Code classifies a failure (Codes); "" on success.
	Code string `json:"code,omitempty"`
	// Pages are the room's source pages on this rank (LeaseMS: held).
	Pages []uint32 `json:"pages,omitempty"`
	// LayerGroups (-layerwise): SendLayers calls; DuringPass of them
	// before the forward pass ended (the others waited for the REQUESTs,
	// or were the last group).
	LayerGroups int `json:"layer_groups,omitempty"`
	DuringPass  int `json:"during_pass,omitempty"`
	// Reused is the prompt's tokens whose KV came from an earlier turn
	// (not computed).
	Reused int `json:"reused,omitempty"`
}

// Failure codes of PrefillResult and GenerateEvent: what a front answers
// its client (openai.go).
const (
	CodeRoomReused  = "room_reused" // the room id is live or cleared within the tombstone TTL here
	CodeNoPages     = "no_pages"    // the rank had no free pages before the deadline
	CodeRoomFailed  = "room_failed" // the room failed (aborted, a peer died, refused)
	CodeDeadline    = "deadline"    // the request's deadline passed first
	CodeLeaseExpiry = "lease_expired"
	CodeInternal    = "internal"
	CodeClientGone  = "client_gone"
)

// Held is a PrefillResult's Status for a room computed and held for its
// decode request (LeaseMS).
const Held = "Held"

// checkPrompt validates a prompt against the model and the pool.
func (t *tinyRank) checkPrompt(prompt []int, extra int) error {
	maxTok := t.r.npage * t.r.Model.PageTokens
	if len(prompt) < 1 || len(prompt)+extra > maxTok {
		return fmt.Errorf("prompt of %d tokens (+ %d generated) not in [1, %d] (the rank's %d pages × %d tokens)", len(prompt), extra, maxTok, t.r.npage, t.r.Model.PageTokens)
	}
	for _, tok := range prompt {
		if tok < 0 || tok >= t.m.Vocab {
			return fmt.Errorf("token %d outside the vocabulary [0, %d)", tok, t.m.Vocab)
		}
	}
	return nil
}

func timeout(ms int) (time.Duration, error) {
	if ms < 0 || int64(ms) > maxRoomTimeout.Milliseconds() {
		return 0, fmt.Errorf("timeout_ms %d not in [0, %d] (0: 60000)", ms, maxRoomTimeout.Milliseconds())
	}
	if ms == 0 {
		ms = 60000
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// aux item: magic, first token, prompt length, prompt hash.
const auxMagic = 0x4d4c4c54 // "TLLM"

func promptHash(p []int) uint64 {
	h := fnv.New64a()
	var b [4]byte
	for _, t := range p {
		binary.LittleEndian.PutUint32(b[:], uint32(t))
		h.Write(b[:])
	}
	return h.Sum64()
}

func (t *tinyRank) auxIndex(room uint64) int {
	return int(room % uint64(len(t.r.aux)/kvmodel.AuxItemBytes))
}

func (t *tinyRank) auxItem(room uint64) []byte {
	i := t.auxIndex(room)
	return t.r.aux[i*kvmodel.AuxItemBytes : (i+1)*kvmodel.AuxItemBytes]
}

func (t *tinyRank) servePrefill(w http.ResponseWriter, req *http.Request) {
	if !t.r.authorized(w, req) {
		return
	}
	var pr PrefillRequest
	if !decodeBody(w, req, &pr) {
		return
	}
	d, err := timeout(pr.TimeoutMS)
	if err == nil {
		err = t.checkPrompt(pr.Prompt, 0)
	}
	if err == nil && pr.AbortAt != "" && pr.AbortAt != "compute" {
		err = fmt.Errorf("abort_at %.32q is not \"\" or compute", pr.AbortAt)
	}
	if err == nil && pr.Fault != "" && pr.Fault != "swap-heads" {
		err = fmt.Errorf("fault %.32q is not \"\" or swap-heads", pr.Fault)
	}
	if err == nil && (pr.LeaseMS < 0 || int64(pr.LeaseMS) > maxRoomTimeout.Milliseconds()) {
		err = fmt.Errorf("lease_ms %d not in [0, %d]", pr.LeaseMS, maxRoomTimeout.Milliseconds())
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if pr.LeaseMS > 0 {
		writeJSON(w, t.prefillHeld(req.Context(), pr, d))
		return
	}
	ctx, cancel := context.WithTimeout(req.Context(), d)
	defer cancel()
	writeJSON(w, t.prefill(ctx, pr, d, nil))
}

// prefillHeld starts a held room (PrefillRequest.LeaseMS) and returns once
// its forward pass is done (or it failed first). Until then the caller's
// ctx ending aborts it; after, the room lives on its own, bounded by the
// lease and the data phase's timeout.
func (t *tinyRank) prefillHeld(ctx context.Context, pr PrefillRequest, data time.Duration) PrefillResult {
	bg, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel)
	got := make(chan PrefillResult, 1)
	var once sync.Once
	answer := func(res PrefillResult) { once.Do(func() { got <- res }) }
	t.r.wg.Add(1)
	go func() {
		defer t.r.wg.Done()
		defer cancel()
		answer(t.prefill(bg, pr, data, func(res PrefillResult) {
			stop()
			answer(res)
		}))
	}()
	return <-got
}

// prefill runs one room: the forward pass, then the sends. With computed
// non-nil (a held room) it is called once the pass is done, the room then
// waits for its decode ranks up to the lease and sends within data.
func (t *tinyRank) prefill(ctx context.Context, pr PrefillRequest, data time.Duration, computed func(PrefillResult)) PrefillResult {
	res := PrefillResult{Room: pr.Room, PhasesMS: map[string]float64{}}
	mark := phases(res.PhasesMS, time.Now())
	r, plen, pt := t.r, len(pr.Prompt), t.r.Model.PageTokens
	src, err := r.getPages(ctx, (plen+pt-1)/pt)
	if err != nil {
		res.Error, res.Code = err.Error(), CodeNoPages
		return res
	}
	var s *sender.Sender
	defer func() { r.putSource(s, src) }()
	s, err = sender.New(r.P, pr.Room)
	if err != nil {
		res.Error, res.Code = err.Error(), roomErrCode(err)
		return res
	}
	defer s.Clear()
	defer t.setLive(pr.Room, s.Abort)()
	s.Init() // the decode ranks' REQUESTs come in while we compute
	seq := &tinyllm.Seq{C: t.cache, Pages: src, Swap: pr.Fault == "swap-heads"}
	full := tinyllm.NewDense(t.m.Layers, t.m.KVHeads, t.m.HeadDim, plen)
	aux := t.auxIndex(pr.Room)
	// Layer-wise: this rank's layers in groups of layerGroup; a group is
	// sent once the pass has finished its last layer and the room is
	// ready (groups finished before the REQUESTs came are sent then).
	// The final group goes after the logits, with the aux item.
	var groups [][2]int
	for lo := 0; lo < t.nlayers; lo += r.layerGroup {
		groups = append(groups, [2]int{lo, min(lo+r.layerGroup, t.nlayers)})
	}
	sent, done, ready := 0, 0, false
	var sendErr error
	flush := func(upto int) {
		for ; sent < upto && sendErr == nil; sent++ {
			g := groups[sent]
			sendErr = sendLayers(s, src, g[0], g[1], true, aux)
		}
	}
	after := func(int) error { return ctx.Err() } // a request that ended stops the pass
	if r.layerwise {
		after = func(l int) error {
			tinyllm.CopyShare(seq, full, l, l+1, plen)
			if l < t.layer0 || l >= t.layer0+t.nlayers {
				return nil
			}
			for done < len(groups)-1 && t.layer0+groups[done][1] <= l+1 {
				done++
			}
			if !ready {
				st := s.Poll()
				ready = st == kvmanager.WaitingForInput || st == kvmanager.Transferring
			}
			if ready {
				flush(done)
			}
			return ctx.Err()
		}
	}
	from := 0
	if pr.reuse != nil {
		full, from = pr.reuse.kv, pr.reuse.n
	}
	if rp := r.reuse; rp != nil {
		rp.reusedToks.Add(float64(from))
		rp.computed.Add(float64(plen - from))
	}
	res.Reused = from
	lg, err := t.m.PrefillFrom(pr.Prompt, from, full, after)
	if err != nil {
		res.Error, res.Code = err.Error(), CodeInternal
		if ctx.Err() != nil {
			res.Code = CodeDeadline
		}
		s.Abort("example: prefill: " + err.Error())
		return res
	}
	res.FirstToken = tinyllm.Argmax(lg)
	res.DuringPass = sent
	if !r.layerwise {
		tinyllm.CopyShare(seq, full, 0, t.m.Layers, plen)
	}
	item := t.auxItem(pr.Room)
	binary.LittleEndian.PutUint32(item[0:], auxMagic)
	binary.LittleEndian.PutUint32(item[4:], uint32(res.FirstToken))
	binary.LittleEndian.PutUint32(item[8:], uint32(plen))
	binary.LittleEndian.PutUint64(item[12:], promptHash(pr.Prompt))
	mark("compute")
	if pr.AbortAt == "compute" {
		s.Abort("example: prefill aborted after the forward pass")
	}
	readyCtx := ctx
	if computed != nil {
		// Held: answer now; the decode request comes when it comes.
		lease := time.Duration(pr.LeaseMS) * time.Millisecond
		held := res
		// Its own phases map: this room goes on marking its phases while
		// the answer is encoded (at once when its decode ranks' REQUESTs
		// came first, as with vLLM push dispatched concurrently).
		held.PhasesMS = maps.Clone(res.PhasesMS)
		held.Status, held.Pages = Held, slices.Clone(src)
		if st := s.Poll(); st == kvmanager.Failed {
			held.Status, held.Reason, held.Code = st.String(), s.Failure(), CodeRoomFailed
		}
		// Counted before the answer goes: a client that reads the gauge
		// once it has the answer sees the room held.
		t.lease.hold(len(src))
		start := time.Now()
		computed(held)
		var cancel context.CancelFunc
		readyCtx, cancel = context.WithTimeout(ctx, lease)
		defer cancel()
		defer func() { t.lease.release(len(src), time.Since(start)) }()
	}
	st, err := s.WaitReady(readyCtx)
	mark("ready")
	if st != kvmanager.WaitingForInput && st != kvmanager.Transferring {
		if computed != nil && readyCtx.Err() == context.DeadlineExceeded && ctx.Err() == nil && st != kvmanager.Failed {
			s.Abort(fmt.Sprintf("example: the KV lease of room %d expired after %d ms: no decode rank asked for it", pr.Room, pr.LeaseMS))
			t.lease.expired.Inc()
			res.Code = CodeLeaseExpiry
		}
		if res.Code == "" {
			res.Code = failCode(ctx, st)
		}
		res.Status, res.Reason = s.Poll().String(), s.Failure()
		if err != nil && res.Reason == "" {
			res.Reason = err.Error()
		}
		return res
	}
	if computed != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, data)
		defer cancel()
	}
	if r.layerwise {
		flush(len(groups))
		res.LayerGroups = sent
	} else {
		sendErr = s.Send(src, true, aux)
	}
	st, err = s.Wait(ctx)
	mark("data")
	res.Status, res.Reason = st.String(), s.Failure()
	if res.Reason == "" && sendErr != nil {
		res.Reason = sendErr.Error()
	}
	if err != nil && res.Reason == "" {
		res.Reason = err.Error()
	}
	if st != kvmanager.Success && st != kvmanager.Failed {
		s.Abort("example: prefill request ended: " + res.Reason)
	}
	if st != kvmanager.Success {
		res.Code = failCode(ctx, st)
	}
	return res
}

// roomErrCode classifies an error creating a room.
func roomErrCode(err error) string {
	if errors.Is(err, kvmanager.ErrRoomInUse) || errors.Is(err, kvmanager.ErrRoomCleared) {
		return CodeRoomReused
	}
	return CodeRoomFailed
}

// failCode classifies a room that did not succeed.
func failCode(ctx context.Context, st kvmanager.Poll) string {
	if st != kvmanager.Failed && ctx.Err() == context.DeadlineExceeded {
		return CodeDeadline
	}
	if st != kvmanager.Failed && ctx.Err() != nil {
		return CodeClientGone
	}
	return CodeRoomFailed
}

// GenerateRequest is POST /v1/generate.
type GenerateRequest struct {
	Room      uint64 `json:"room"`
	Prompt    []int  `json:"prompt"`
	MaxTokens int    `json:"max_tokens"`
	// Prefill is the chosen prefill instance's bootstrap URL ("" = this
	// rank's -bootstrap), PrefillDP its DP group (nil: room % dp_size).
	Prefill   string `json:"prefill,omitempty"`
	PrefillDP *int   `json:"prefill_dp,omitempty"`
	TimeoutMS int    `json:"timeout_ms"`
	// AbortAt: "before" (right after the REQUEST) or "mid" (at the first
	// data): the decode side aborts the room.
	AbortAt string `json:"abort_at,omitempty"`
	// Peers (the instance's first rank, with more than one): the other
	// ranks' HTTP URLs, whose shares it reads after the transfer.
	Peers []string `json:"peers,omitempty"`
	// Fault "swap-heads": attention reads every page's heads reversed (a
	// wrong head mapping, for tests).
	Fault string `json:"fault,omitempty"`
	// Keep (-reuse-pages): keep the turn's KV for the next turn's prefill
	// and name it in the final event's Reuse.
	Keep bool `json:"keep,omitempty"`
}

// GenerateEvent is one NDJSON line of /v1/generate's answer: a token, or
// the final event (Done).
type GenerateEvent struct {
	Token       *int               `json:"token,omitempty"`
	Index       int                `json:"index,omitempty"`
	Done        bool               `json:"done,omitempty"`
	Status      string             `json:"status,omitempty"` // the room's
	Reason      string             `json:"reason,omitempty"`
	Error       string             `json:"error,omitempty"`
	Code        string             `json:"code,omitempty"` // a failure's class (Codes)
	Tokens      int                `json:"tokens,omitempty"`
	PrefixPages int                `json:"prefix_pages,omitempty"` // pages a cached prefix covered (not transferred)
	PhasesMS    map[string]float64 `json:"phases_ms,omitempty"`    // pages, transfer, gather, generate
	// Reuse names the turn's kept KV (Keep): the answer's kv_transfer_params.
	Reuse *openai.KVTransferParams `json:"reuse,omitempty"`
	// reuseRoom is the kept turn's room (released at once when the answer
	// naming it does not reach the client).
	reuseRoom uint64
}

func (t *tinyRank) serveGenerate(w http.ResponseWriter, req *http.Request) {
	if !t.r.authorized(w, req) {
		return
	}
	var gr GenerateRequest
	if !decodeBody(w, req, &gr) {
		return
	}
	d, err := timeout(gr.TimeoutMS)
	switch {
	case err != nil:
	case gr.MaxTokens < 1 || gr.MaxTokens > 1<<16:
		err = fmt.Errorf("max_tokens %d not in [1, 65536]", gr.MaxTokens)
	case gr.AbortAt != "" && gr.AbortAt != "before" && gr.AbortAt != "mid":
		err = fmt.Errorf("abort_at %.32q is not \"\", before or mid", gr.AbortAt)
	case gr.Fault != "" && gr.Fault != "swap-heads":
		err = fmt.Errorf("fault %.32q is not \"\" or swap-heads", gr.Fault)
	case len(gr.Peers) > 256:
		err = errors.New("more than 256 peers")
	default:
		err = t.checkPrompt(gr.Prompt, gr.MaxTokens-1)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(req.Context(), d)
	defer cancel()
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	fl, _ := w.(http.Flusher)
	emit := func(ev GenerateEvent) error {
		if err := enc.Encode(ev); err != nil {
			return err
		}
		if fl != nil {
			fl.Flush()
		}
		return nil
	}
	emit(t.generate(ctx, gr, emit))
}

// failed ends a failed room on this rank: its pages go back to the pool
// once no write of it can land (Released), and a rank that does not
// generate tells the gatherer its share failed.
func (t *tinyRank) failed(rc *receiver.Receiver, room uint64, own []uint32, reason string) {
	ch := rc.Released()
	go func() {
		<-ch
		t.r.pages.Put(own)
	}()
	if !t.generates() {
		t.hold(room).fail(reason)
	}
}

// gatherer: the rank that generates is the instance's first.
func (t *tinyRank) generates() bool { return t.r.Par.Global() == 0 }

// generate runs one room on a decode rank and returns the final event.
func (t *tinyRank) generate(ctx context.Context, gr GenerateRequest, emit func(GenerateEvent) error) (ev GenerateEvent) {
	ev = GenerateEvent{Done: true, PhasesMS: map[string]float64{}}
	mark := phases(ev.PhasesMS, time.Now())
	r, pt, plen := t.r, t.r.Model.PageTokens, len(gr.Prompt)
	nPrompt := (plen + pt - 1) / pt
	var hit *prefixEntry
	k := 0
	if t.prefix != nil && t.generates() {
		if hit, k = t.prefix.lookup(gr.Prompt); hit != nil {
			defer t.prefix.release(hit)
		}
	}
	extra := 0
	if t.generates() {
		extra = (plen+gr.MaxTokens-1+pt-1)/pt - nPrompt
	}
	own, err := r.getPages(ctx, nPrompt-k+extra)
	if err != nil {
		ev.Error, ev.Code = err.Error(), CodeNoPages
		return ev
	}
	mark("pages")
	dst := own[:nPrompt-k]
	keep := false // pages quarantined, or handed to the prefix cache
	defer func() {
		if !keep {
			r.pages.Put(own)
		}
	}()
	rc, err := r.newReceiver(gr.Room, gr.Prefill, gr.PrefillDP)
	if err != nil {
		ev.Error, ev.Code = err.Error(), roomErrCode(err)
		return ev
	}
	defer rc.Clear()
	defer t.setLive(gr.Room, rc.Abort)()
	if err := rc.Init(ctx, kvmanager.RequestSpec{DstPages: dst, AuxIndex: t.auxIndex(gr.Room), Prefix: k}); err != nil {
		ev.Status, ev.Reason, ev.Code = kvmanager.Failed.String(), err.Error(), failCode(ctx, kvmanager.Failed)
		if ctx.Err() == context.DeadlineExceeded {
			ev.Code = CodeDeadline
		}
		// A REQUEST may be out to some prefill ranks: the pages wait for
		// Released as any failed room's do.
		if rc.Poll() != kvmanager.Failed {
			rc.Abort("example: " + err.Error())
		}
		keep = true
		t.failed(rc, gr.Room, own, ev.Reason)
		return ev
	}
	abortAt(ctx, rc, gr.AbortAt, "example: decode aborted")
	st, err := rc.Wait(ctx)
	mark("transfer")
	ev.Status, ev.Reason, ev.PrefixPages = st.String(), rc.Failure(), k
	if err != nil && ev.Reason == "" {
		ev.Reason = err.Error()
	}
	if st == kvmanager.Success && (gr.AbortAt == "mid" || gr.AbortAt == "before") {
		// The abort point came after the last page had landed (a small
		// room can finish between two polls of abortAt, or — its KV held
		// ready on the prefill side, as in vLLM's flow — between the
		// REQUEST and the abort right after it): the request is dropped
		// all the same, as its scheduler asked, and answered as aborted
		// so the router retries it. The room is over: nothing can land,
		// and its pages go back at once.
		stage := map[string]string{"mid": "mid-transfer", "before": "right after the request"}[gr.AbortAt]
		ev.Status, ev.Reason, ev.Code = kvmanager.Failed.String(), "example: decode aborted "+stage+", after the last page landed (dropped)", CodeRoomFailed
		if !t.generates() {
			t.hold(gr.Room).fail(ev.Reason)
		}
		return ev
	}
	if st != kvmanager.Success {
		ev.Code = failCode(ctx, st)
		if st != kvmanager.Failed {
			rc.Abort("example: decode request ended: " + ev.Reason)
		}
		// The pages are reused only once no write of the room can land
		// (after every prefill process that took the REQUEST acknowledged
		// the abort, or the quarantine): the answer does not wait for it,
		// so the router can retry at once.
		keep = true
		t.failed(rc, gr.Room, own, ev.Reason)
		return ev
	}
	var pages []uint32
	if hit != nil {
		pages = append(pages, hit.pages[:k]...)
	}
	pages = append(pages, own...)
	seq := &tinyllm.Seq{C: t.cache, Pages: pages, Swap: gr.Fault == "swap-heads"}
	if !t.generates() {
		// Hold the share until the instance's first rank has read it.
		h := t.hold(gr.Room)
		h.serve(seq, plen)
		select {
		case <-h.fetched:
		case <-ctx.Done():
			ev.Error, ev.Code = "the instance's first rank did not read this rank's share", failCode(ctx, 0)
		}
		t.unhold(gr.Room, h)
		mark("gather")
		return ev
	}
	item := t.auxItem(gr.Room)
	first := int(binary.LittleEndian.Uint32(item[4:]))
	if binary.LittleEndian.Uint32(item[0:]) != auxMagic || int(binary.LittleEndian.Uint32(item[8:])) != plen ||
		binary.LittleEndian.Uint64(item[12:]) != promptHash(gr.Prompt) || first >= t.m.Vocab {
		// Another prompt's KV: the room id was given to two requests,
		// whose legs paired crosswise (SGLang's wire cannot tell them
		// apart). The client may retry on a new room.
		ev.Error, ev.Code = fmt.Sprintf("room %d holds another prompt's KV: its id was given to two requests", gr.Room), CodeRoomReused
		return ev
	}
	var kv tinyllm.KV = seq
	if single := len(r.kv) == 2*t.m.Layers && t.heads == t.m.KVHeads; !single || len(gr.Peers) > 0 {
		dense := tinyllm.NewDense(t.m.Layers, t.m.KVHeads, t.m.HeadDim, plen+gr.MaxTokens)
		copyInto(dense, seq, t.layer0, t.nlayers, t.first, t.heads, plen)
		for _, p := range gr.Peers {
			if err := t.fetchShare(ctx, p, gr.Room, plen, dense); err != nil {
				ev.Error, ev.Code = fmt.Sprintf("gathering %s's share: %v", p, err), CodeRoomFailed
				return ev
			}
		}
		kv = dense
		if gr.Fault == "swap-heads" {
			kv = swapped{dense, t.m.KVHeads}
		}
		mark("gather")
	}
	toks, err := t.m.Continue(first, plen, gr.MaxTokens, kv, func(i, tok int) error {
		return emit(GenerateEvent{Token: &tok, Index: i})
	})
	ev.Tokens = len(toks)
	if err != nil {
		ev.Error, ev.Code = "streaming: "+err.Error(), CodeClientGone
	}
	mark("generate")
	if gr.Keep && err == nil && r.reuse != nil && r.reuse.p != nil && len(toks) > 0 {
		// The prompt's and the reply's K and V but the last token's
		// (never fed back): what the next turn's prompt starts with.
		ev.Reuse, ev.reuseRoom = t.keep(kv, append(slices.Clone(gr.Prompt), toks[:len(toks)-1]...), plen)
		mark("keep")
	}
	if t.prefix != nil && hit == nil && err == nil {
		// The prompt's whole pages become a prefix later prompts reuse;
		// generation never writes them.
		if n := plen / pt; n > 0 && t.prefix.insertFreeing(gr.Prompt[:n*pt], own[:n], r.pages.Put) {
			keep = true
			r.pages.Put(own[n:])
		}
	}
	return ev
}

// swapped reads a KV's heads in reverse (the swap-heads fault).
type swapped struct {
	kv    tinyllm.KV
	heads int
}

func (s swapped) Slot(l, p, h int) (k, v []float32) { return s.kv.Slot(l, p, s.heads-1-h) }

// copyInto copies a share (layers [l0, l0+nl), heads [h0, h0+nh), positions
// [0, n)) from src into a whole model's cache.
func copyInto(dst tinyllm.KV, src tinyllm.KV, l0, nl, h0, nh, n int) {
	for l := l0; l < l0+nl; l++ {
		for p := 0; p < n; p++ {
			for h := h0; h < h0+nh; h++ {
				dk, dv := dst.Slot(l, p, h)
				sk, sv := src.Slot(l, p, h)
				copy(dk, sk)
				copy(dv, sv)
			}
		}
	}
}

// heldRoom is a decode rank's share waiting for the first rank's read.
type heldRoom struct {
	ready   chan struct{} // closed once ok/reason/seq are set
	fetched chan struct{}
	once    sync.Once
	fonce   sync.Once
	ok      bool
	reason  string
	seq     *tinyllm.Seq
	n       int
	users   int
}

func (t *tinyRank) hold(room uint64) *heldRoom {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.held[room]
	if h == nil {
		h = &heldRoom{ready: make(chan struct{}), fetched: make(chan struct{})}
		t.held[room] = h
	}
	h.users++
	return h
}

func (t *tinyRank) unhold(room uint64, h *heldRoom) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if h.users--; h.users == 0 && t.held[room] == h {
		delete(t.held, room)
	}
}

func (h *heldRoom) serve(seq *tinyllm.Seq, n int) {
	h.once.Do(func() { h.ok, h.seq, h.n = true, seq, n; close(h.ready) })
}

func (h *heldRoom) fail(reason string) {
	h.once.Do(func() { h.reason = reason; close(h.ready) })
}

// serveKV is GET /v1/kv?room=N: this rank's share of a room it received
// (K then V per layer, positions, heads, HeadDim little-endian float32s;
// X-Layer0, X-Layers, X-First-Head, X-Heads, X-Positions say which),
// waiting for the room to end on this rank.
func (t *tinyRank) serveKV(w http.ResponseWriter, req *http.Request) {
	if !t.r.authorized(w, req) {
		return
	}
	room, err := strconv.ParseUint(req.URL.Query().Get("room"), 10, 64)
	if err != nil {
		http.Error(w, "query parameter room must be a room id", http.StatusBadRequest)
		return
	}
	h := t.hold(room)
	defer t.unhold(room, h)
	select {
	case <-h.ready:
	case <-req.Context().Done():
		return
	}
	if !h.ok {
		http.Error(w, "room failed on this rank: "+h.reason, http.StatusConflict)
		return
	}
	defer h.fonce.Do(func() { close(h.fetched) })
	for k, v := range map[string]int{"X-Layer0": t.layer0, "X-Layers": t.nlayers, "X-First-Head": t.first, "X-Heads": t.heads, "X-Positions": h.n} {
		w.Header().Set(k, strconv.Itoa(v))
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	buf := make([]byte, 0, 2*t.m.HeadDim*4)
	for l := t.layer0; l < t.layer0+t.nlayers; l++ {
		for kv := 0; kv < 2; kv++ {
			for p := 0; p < h.n; p++ {
				for hd := t.first; hd < t.first+t.heads; hd++ {
					k, v := h.seq.Slot(l, p, hd)
					x := k
					if kv == 1 {
						x = v
					}
					buf = buf[:0]
					for _, f := range x {
						buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(f))
					}
					if _, err := w.Write(buf); err != nil {
						return
					}
				}
			}
		}
	}
}

// fetchShare reads a peer's share of a room into dense.
func (t *tinyRank) fetchShare(ctx context.Context, peer string, room uint64, n int, dense *tinyllm.Dense) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v1/kv?room=%d", peer, room), nil)
	if err != nil {
		return err
	}
	if t.r.token != "" {
		req.Header.Set("Authorization", "Bearer "+t.r.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	hv := func(k string) int { v, _ := strconv.Atoi(resp.Header.Get(k)); return v }
	l0, nl, h0, nh, np := hv("X-Layer0"), hv("X-Layers"), hv("X-First-Head"), hv("X-Heads"), hv("X-Positions")
	if np != n || l0 < 0 || nl < 1 || l0+nl > t.m.Layers || h0 < 0 || nh < 1 || h0+nh > t.m.KVHeads {
		return fmt.Errorf("share of layers [%d,+%d) heads [%d,+%d) positions %d does not fit the model and prompt", l0, nl, h0, nh, np)
	}
	buf := make([]byte, t.m.HeadDim*4)
	for l := l0; l < l0+nl; l++ {
		for kv := 0; kv < 2; kv++ {
			for p := 0; p < n; p++ {
				for hd := h0; hd < h0+nh; hd++ {
					if _, err := io.ReadFull(resp.Body, buf); err != nil {
						return err
					}
					k, v := dense.Slot(l, p, hd)
					x := k
					if kv == 1 {
						x = v
					}
					for i := range x {
						x[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
					}
				}
			}
		}
	}
	return nil
}
