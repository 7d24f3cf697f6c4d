package router

// vLLM push from a cached prefill identity, and multi-turn reuse, as the
// llm-d sidecar's nixlv2 connector runs them (pkg/sidecar/proxy:
// nixl_push_identity.go, bidirectional_kv.go).

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/examples/internal/openai"
)

// pushIdentityFields are the fields of a prefill answer's
// kv_transfer_params cached as the prefill instance's push identity
// (true: required).
var pushIdentityFields = map[string]bool{"remote_engine_id": true, "remote_host": true, "remote_port": true, "tp_size": true,
	"transfer_mode": true, "pp_size": false, "dcp_size": false}

// pushIdentity reads the identity in a prefill answer's
// kv_transfer_params: transfer_mode "push" and every required field a
// string or a number.
func pushIdentity(raw json.RawMessage) (map[string]any, bool) {
	var m map[string]any
	if json.Unmarshal(raw, &m) != nil || m["transfer_mode"] != "push" {
		return nil, false
	}
	id := map[string]any{}
	for f, req := range pushIdentityFields {
		v, present := m[f]
		if !present && !req {
			continue
		}
		switch v.(type) {
		case string, float64:
			id[f] = v
		default:
			return nil, false
		}
	}
	return id, true
}

// attemptPush: vLLM push. With no identity cached for the prefill
// instance, the serial flow (attemptVLLM), which caches the one its
// answer carries; with one, both legs at once with a fresh transfer_id —
// the prefill front the body capped to one token with the nixlv2 fields
// (null) and the transfer id, the decode front the client's body with the
// identity, do_remote_prefill, remote_request_id and the transfer id,
// whose answer is the client's. A decode leg that fails drops the
// identity (the next request goes serially and learns it again) and
// cancels the prefill leg.
func (rt *Router) attemptPush(parent context.Context, pre, dec *Instance, cr *CompletionRequest, abort string, emit func(int) error, rep *KVReport) error {
	v, _ := rt.identities.Load(pre.Name)
	identity, _ := v.(map[string]any)
	if identity == nil {
		return rt.attemptVLLM(parent, pre, dec, cr, abort, emit, rep)
	}
	ctx, cancel := context.WithTimeout(parent, rt.cfg.Timeout)
	defer cancel()
	defer rt.track(pre, dec)()
	reqID, xfer := randomID(), "tx"+randomID()
	pbody := clientBody(cr, abort)
	pkv := map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil, "transfer_id": xfer}
	rt.replay(cr, pkv, rep)
	pbody["kv_transfer_params"] = pkv
	pbody["stream"] = false
	pbody["max_tokens"], pbody["max_completion_tokens"] = 1, 1
	dkv := maps.Clone(identity)
	dkv["do_remote_prefill"], dkv["do_remote_decode"], dkv["remote_request_id"], dkv["transfer_id"] = true, false, reqID, xfer
	dbody := clientBody(cr, abort)
	dbody["kv_transfer_params"] = dkv
	type result struct {
		raw json.RawMessage
		err error
	}
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	pc := make(chan result, 1)
	go func() {
		a, err := rt.openaiPost(pctx, pre.Ranks[0].URL+"/v1/completions", pbody, reqID, nil)
		var raw json.RawMessage
		if a != nil {
			raw = a.Raw
		}
		pc <- result{raw, err}
	}()
	a, err := rt.openaiPost(ctx, dec.Ranks[0].URL+"/v1/completions", dbody, reqID, emit)
	report(a, rep)
	if err != nil {
		pcancel()
		<-pc
		rt.identities.Delete(pre.Name)
		return fmt.Errorf("decode: %w", err)
	}
	pr := <-pc
	if pr.err != nil {
		// The decode leg's answer is whole (its room met the prefill's
		// KV): the client has it. The prefill leg's failure after that is
		// noted, not the client's; its identity is learnt again.
		rep.Failures = append(rep.Failures, "prefill (after the answer): "+pr.err.Error())
		rt.identities.Delete(pre.Name)
		rt.keepTurn(cr, a)
		return nil
	}
	rt.prefillAnswered(pre, pr.raw, rep)
	rt.keepTurn(cr, a)
	return nil
}

// prefillAnswered reads a prefill answer: the identity it carries (push),
// the tokens it reused (multi-turn).
func (rt *Router) prefillAnswered(pre *Instance, raw json.RawMessage, rep *KVReport) {
	var ans struct {
		KV  json.RawMessage `json:"kv_transfer_params"`
		Ext struct {
			Reused int `json:"reused_tokens"`
		} `json:"kvbridge"`
	}
	if json.Unmarshal(raw, &ans) != nil {
		return
	}
	rep.ReusedTokens = ans.Ext.Reused
	if rt.cfg.Wire != "push" {
		return
	}
	if idn, ok := pushIdentity(ans.KV); ok {
		rt.identities.Store(pre.Name, idn)
	} else {
		rt.identities.Delete(pre.Name)
	}
}

// replayFields are the fields of a decode answer's kv_transfer_params
// replayed onto the next turn's prefill leg (the sidecar's allowlist).
var replayFields = []string{"remote_engine_id", "remote_request_id", "remote_host", "remote_port", "remote_block_ids",
	"remote_num_tokens", "remote_blocks_expiry_time", "tp_size", "dcp_size", "pp_size", "transfer_mode"}

// turnCache keeps decode answers' kv_transfer_params (multi-turn reuse)
// under a digest of the conversation they end — the prompt and the reply
// — until a later prompt that extends it takes them (once), they expire
// (remote_blocks_expiry_time), or maxTurns newer ones push them out.
type turnCache struct {
	mu    sync.Mutex
	turns map[[32]byte]turn
	lens  map[int]int // conversation lengths held, and how many of each
	order []turnSlot  // oldest first; a slot whose seq is not its key's entry's is stale
	seq   uint64
}

type turn struct {
	params  map[string]any
	n       int
	expires time.Time
	seq     uint64
}

type turnSlot struct {
	key [32]byte
	seq uint64
}

const maxTurns = 4096

// tokensHash digests tokens; keyAt reads the digest of the first n so far
// (a hash's Sum does not reset it: one pass gives every prefix's key).
type tokensHash struct{ h hash.Hash }

func newTokensHash() tokensHash { return tokensHash{sha256.New()} }

func (t tokensHash) write(toks []int) {
	var b [4]byte
	for _, tok := range toks {
		binary.LittleEndian.PutUint32(b[:], uint32(tok))
		t.h.Write(b[:])
	}
}

func (t tokensHash) key() (k [32]byte) {
	t.h.Sum(k[:0])
	return k
}

func tokensKey(toks []int) [32]byte {
	h := newTokensHash()
	h.write(toks)
	return h.key()
}

func (c *turnCache) drop(k [32]byte) {
	if t, ok := c.turns[k]; ok {
		delete(c.turns, k)
		if c.lens[t.n]--; c.lens[t.n] == 0 {
			delete(c.lens, t.n)
		}
	}
}

// put keeps params for the conversation conv.
func (c *turnCache) put(conv []int, params map[string]any, expires time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := tokensKey(conv)
	c.drop(k)
	c.seq++
	c.turns[k] = turn{params: params, n: len(conv), expires: expires, seq: c.seq}
	c.lens[len(conv)]++
	c.order = append(c.order, turnSlot{k, c.seq})
	for len(c.turns) > maxTurns {
		s := c.order[0]
		c.order = c.order[1:]
		if t, ok := c.turns[s.key]; ok && t.seq == s.seq {
			c.drop(s.key)
		}
	}
	if len(c.order) > 2*maxTurns {
		// Stale slots (taken or replaced entries) compacted away.
		live := c.order[:0]
		for _, s := range c.order {
			if t, ok := c.turns[s.key]; ok && t.seq == s.seq {
				live = append(live, s)
			}
		}
		c.order = live
	}
}

// take returns (and forgets) the params of the longest conversation
// prompt extends, nil if none: one pass over the prompt.
func (c *turnCache) take(prompt []int, now time.Time) map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	lens := slices.Sorted(maps.Keys(c.lens))
	h := newTokensHash()
	var keys [][32]byte
	at := 0
	for _, n := range lens {
		if n >= len(prompt) {
			break
		}
		h.write(prompt[at:n])
		at = n
		keys = append(keys, h.key())
	}
	for i := len(keys) - 1; i >= 0; i-- {
		if t, ok := c.turns[keys[i]]; ok {
			c.drop(keys[i])
			if now.Before(t.expires) {
				return t.params
			}
		}
	}
	return nil
}

// replay puts the kept turn a request's prompt extends (multi-turn) onto
// its prefill leg's kv_transfer_params.
func (rt *Router) replay(cr *CompletionRequest, kv map[string]any, rep *KVReport) {
	if !rt.cfg.MultiTurn {
		return
	}
	if p := rt.turns.take(cr.tokens, time.Now()); p != nil {
		maps.Copy(kv, p)
		rep.Replayed = true
	}
}

// keepTurn keeps a decode answer's kv_transfer_params (multi-turn) under
// the conversation it ends: the prompt and the reply.
func (rt *Router) keepTurn(cr *CompletionRequest, a *openai.Answer) {
	if !rt.cfg.MultiTurn || a == nil || len(a.Raw) == 0 {
		return
	}
	var ans struct {
		KV map[string]any `json:"kv_transfer_params"`
	}
	if json.Unmarshal(a.Raw, &ans) != nil || ans.KV == nil {
		return
	}
	if d, _ := ans.KV["do_remote_decode"].(bool); !d {
		return
	}
	p := map[string]any{}
	for _, f := range replayFields {
		if v, ok := ans.KV[f]; ok {
			p[f] = v
		}
	}
	exp, _ := ans.KV["remote_blocks_expiry_time"].(float64)
	rt.turns.put(append(slices.Clone(cr.tokens), a.Tokens...), p, time.UnixMilli(int64(exp*1000)))
}
