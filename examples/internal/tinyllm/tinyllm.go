// Package tinyllm is a small Llama-architecture decoder in plain Go with
// seeded random weights: RMSNorm, rotary position embeddings (RoPE),
// grouped-query attention over a KV cache, a SwiGLU MLP and a tied-free LM
// head, in float32 with every reduction in a fixed order. Its logits are a
// pure function of the weights' seed, the prompt and the KV cache, so
// greedy decoding from KV computed in another process (and moved there by
// kvbridge) matches decoding in one process bit for bit, and a misplaced
// head, page or position changes the tokens.
//
// The KV cache is an interface (KV); Paged lays it out as kvbridge's
// regions do (one region per layer and K/V, K before V, pages of
// PageTokens tokens, NHD or HND inside a page, a TP rank's heads only, a PP
// stage's layers only), Dense is a plain array for a whole model.
package tinyllm

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// Config is the model's shape and seed.
type Config struct {
	Layers  int
	QHeads  int // query heads
	KVHeads int // KV heads; QHeads is a multiple of it (grouped-query attention)
	HeadDim int // even (RoPE rotates pairs)
	FFN     int // the MLP's intermediate size
	Vocab   int
	Seed    uint64
	// RopeTheta is RoPE's base (0: 10000).
	RopeTheta float64
}

// Default is the demo's model: 4 layers, 8 query and 2 KV heads of 32,
// hidden 256, FFN 512, vocabulary 2048 (about 3 M multiply-adds a token).
var Default = Config{Layers: 4, QHeads: 8, KVHeads: 2, HeadDim: 32, FFN: 512, Vocab: 2048, Seed: 1}

// Hidden is the residual stream's width (QHeads × HeadDim).
func (c Config) Hidden() int { return c.QHeads * c.HeadDim }

// Validate checks the shape.
func (c Config) Validate() error {
	switch {
	case c.Layers < 1 || c.QHeads < 1 || c.KVHeads < 1 || c.HeadDim < 2 || c.FFN < 1 || c.Vocab < 2:
		return fmt.Errorf("tinyllm: layers, heads, FFN ≥ 1, head dim ≥ 2 and vocab ≥ 2 needed, got %+v", c)
	case c.QHeads%c.KVHeads != 0:
		return fmt.Errorf("tinyllm: %d query heads are not a multiple of %d KV heads", c.QHeads, c.KVHeads)
	case c.HeadDim%2 != 0:
		return fmt.Errorf("tinyllm: head dim %d is odd (RoPE rotates pairs)", c.HeadDim)
	case c.Layers > 1024 || c.Hidden() > 1<<14 || c.FFN > 1<<16 || c.Vocab > 1<<20:
		return errors.New("tinyllm: model too large for an example")
	}
	return nil
}

// Fingerprint names the model exactly (shape and seed): two ranks serve
// the same model only if their fingerprints are equal.
func (c Config) Fingerprint() string {
	return fmt.Sprintf("tinyllm:L%d:Q%d:KV%d:D%d:F%d:V%d:S%d:T%g", c.Layers, c.QHeads, c.KVHeads, c.HeadDim, c.FFN, c.Vocab, c.Seed, c.theta())
}

func (c Config) theta() float64 {
	if c.RopeTheta == 0 {
		return 10000
	}
	return c.RopeTheta
}

type layer struct {
	attnNorm, mlpNorm []float32
	wq, wk, wv, wo    []float32 // [out][in], row-major
	wg, wu, wd        []float32
}

// Model holds the weights.
type Model struct {
	Config
	embed, lmHead []float32 // [Vocab][Hidden]
	norm          []float32
	layers        []layer
	invFreq       []float64
}

// New builds the model with weights drawn from its seed.
func New(c Config) (*Model, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x7e1e))
	mat := func(out, in int, gain float64) []float32 {
		w := make([]float32, out*in)
		a := gain * math.Sqrt(3/float64(in))
		for i := range w {
			w[i] = float32((2*rng.Float64() - 1) * a)
		}
		return w
	}
	norm := func(n int) []float32 {
		w := make([]float32, n)
		for i := range w {
			w[i] = float32(0.8 + 0.4*rng.Float64())
		}
		return w
	}
	h, kvd := c.Hidden(), c.KVHeads*c.HeadDim
	m := &Model{Config: c}
	m.embed = mat(c.Vocab, h, 1)
	for l := 0; l < c.Layers; l++ {
		m.layers = append(m.layers, layer{
			attnNorm: norm(h), mlpNorm: norm(h),
			// A sharp attention (large q·k) makes the output depend on
			// which positions and heads it reads: a misplaced head or page
			// changes the tokens.
			wq: mat(h, h, 2), wk: mat(kvd, h, 2), wv: mat(kvd, h, 1), wo: mat(h, h, 1),
			wg: mat(c.FFN, h, 1), wu: mat(c.FFN, h, 1), wd: mat(h, c.FFN, 1),
		})
	}
	m.norm = norm(h)
	m.lmHead = mat(c.Vocab, h, 1)
	for i := 0; i < c.HeadDim/2; i++ {
		m.invFreq = append(m.invFreq, math.Pow(c.theta(), -2*float64(i)/float64(c.HeadDim)))
	}
	return m, nil
}

// KV is a KV cache as the model reads and writes it: the K and V vectors
// (HeadDim float32 each) of a global layer, a position and a global KV head.
type KV interface {
	Slot(layer, pos, head int) (k, v []float32)
}

// dot is a·b with four accumulators in a fixed order. The explicit
// float32 conversions forbid fused multiply-adds, so every build rounds
// alike.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	n := len(a) &^ 3
	for i := 0; i < n; i += 4 {
		s0 += float32(a[i] * b[i])
		s1 += float32(a[i+1] * b[i+1])
		s2 += float32(a[i+2] * b[i+2])
		s3 += float32(a[i+3] * b[i+3])
	}
	for i := n; i < len(a); i++ {
		s0 += float32(a[i] * b[i])
	}
	return (s0 + s1) + (s2 + s3)
}

// matVec is y = W x for W [len(y)][len(x)].
func matVec(y, w, x []float32) {
	n := len(x)
	for o := range y {
		y[o] = dot(w[o*n:(o+1)*n], x)
	}
}

func rmsNorm(y, x, w []float32) {
	var ss float32
	for _, v := range x {
		ss += float32(v * v)
	}
	inv := float32(1 / math.Sqrt(float64(ss/float32(len(x))+1e-5)))
	for i, v := range x {
		y[i] = float32(v*inv) * w[i]
	}
}

// rope rotates each head of x (heads × HeadDim) for position pos, in the
// rotate-half form (pairs i and i + HeadDim/2).
func (m *Model) rope(x []float32, pos int) {
	d, half := m.HeadDim, m.HeadDim/2
	for i := 0; i < half; i++ {
		s, c := math.Sincos(float64(pos) * m.invFreq[i])
		cs, sn := float32(c), float32(s)
		for h := 0; h < len(x)/d; h++ {
			a, b := x[h*d+i], x[h*d+i+half]
			x[h*d+i] = float32(a*cs) - float32(b*sn)
			x[h*d+i+half] = float32(b*cs) + float32(a*sn)
		}
	}
}

func silu(x float32) float32 { return x / (1 + float32(math.Exp(float64(-x)))) }

// scratch holds one token's intermediate vectors.
type scratch struct {
	n, q, k, v, o, att []float32
	g, u               []float32
}

func (m *Model) newScratch() *scratch {
	h, kvd := m.Hidden(), m.KVHeads*m.HeadDim
	return &scratch{n: make([]float32, h), q: make([]float32, h), k: make([]float32, kvd), v: make([]float32, kvd),
		o: make([]float32, h), att: make([]float32, h), g: make([]float32, m.FFN), u: make([]float32, m.FFN)}
}

// layerStep runs layer l for the token at pos whose residual stream is x
// (updated in place): its K and V go into kv at pos, then attention reads
// positions 0..pos.
func (m *Model) layerStep(l int, x []float32, pos int, kv KV, s *scratch) {
	w := &m.layers[l]
	d := m.HeadDim
	rmsNorm(s.n, x, w.attnNorm)
	matVec(s.q, w.wq, s.n)
	matVec(s.k, w.wk, s.n)
	matVec(s.v, w.wv, s.n)
	m.rope(s.q, pos)
	m.rope(s.k, pos)
	for h := 0; h < m.KVHeads; h++ {
		k, v := kv.Slot(l, pos, h)
		copy(k, s.k[h*d:(h+1)*d])
		copy(v, s.v[h*d:(h+1)*d])
	}
	group := m.QHeads / m.KVHeads
	scale := float32(1 / math.Sqrt(float64(d)))
	if cap(s.att) < pos+1 {
		s.att = make([]float32, pos+1)
	}
	sc := s.att[:pos+1]
	for qh := 0; qh < m.QHeads; qh++ {
		q := s.q[qh*d : (qh+1)*d]
		g := qh / group
		mx := float32(math.Inf(-1))
		for p := 0; p <= pos; p++ {
			k, _ := kv.Slot(l, p, g)
			sc[p] = dot(q, k) * scale
			mx = max(mx, sc[p])
		}
		var sum float32
		for p := range sc {
			sc[p] = float32(math.Exp(float64(sc[p] - mx)))
			sum += sc[p]
		}
		o := s.o[qh*d : (qh+1)*d]
		clear(o)
		for p := 0; p <= pos; p++ {
			_, v := kv.Slot(l, p, g)
			a := sc[p] / sum
			for i := range o {
				o[i] += float32(a * v[i])
			}
		}
	}
	matVec(s.n, w.wo, s.o)
	for i := range x {
		x[i] += s.n[i]
	}
	rmsNorm(s.n, x, w.mlpNorm)
	matVec(s.g, w.wg, s.n)
	matVec(s.u, w.wu, s.n)
	for i := range s.g {
		s.g[i] = float32(silu(s.g[i]) * s.u[i])
	}
	matVec(s.n, w.wd, s.g)
	for i := range x {
		x[i] += s.n[i]
	}
}

// Logits are the LM head's output for a residual stream.
func (m *Model) logits(x []float32) []float32 {
	n := make([]float32, m.Hidden())
	rmsNorm(n, x, m.norm)
	out := make([]float32, m.Vocab)
	matVec(out, m.lmHead, n)
	return out
}

// Argmax is the greedy choice: the highest logit, the lowest id on a tie.
func Argmax(logits []float32) int {
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	return best
}

func (m *Model) checkTokens(tokens []int) error {
	for _, t := range tokens {
		if t < 0 || t >= m.Vocab {
			return fmt.Errorf("tinyllm: token %d outside the vocabulary [0, %d)", t, m.Vocab)
		}
	}
	return nil
}

// Prefill runs the forward pass over tokens (positions 0..len−1) layer by
// layer, writing every layer's K and V into kv, and returns the logits of
// the last position. afterLayer (if not nil) is called once each layer's
// K and V are all written — where a layer-wise sender hands the layer to
// kvbridge; an error from it stops the pass.
func (m *Model) Prefill(tokens []int, kv KV, afterLayer func(layer int) error) ([]float32, error) {
	return m.PrefillFrom(tokens, 0, kv, afterLayer)
}

// PrefillFrom is Prefill over positions from..len−1 only: kv already holds
// every layer's K and V of positions 0..from−1 (a prefix computed
// elsewhere — by the decode instance of an earlier turn — and fetched).
// A position's K and V depend only on the tokens up to it, so the result
// is Prefill's, bit for bit, when that prefix was computed for the same
// tokens.
func (m *Model) PrefillFrom(tokens []int, from int, kv KV, afterLayer func(layer int) error) ([]float32, error) {
	if len(tokens) == 0 {
		return nil, errors.New("tinyllm: empty prompt")
	}
	if from < 0 || from >= len(tokens) {
		return nil, fmt.Errorf("tinyllm: a prefix of %d tokens leaves nothing of a %d-token prompt to compute", from, len(tokens))
	}
	if err := m.checkTokens(tokens); err != nil {
		return nil, err
	}
	h := m.Hidden()
	xs := make([]float32, len(tokens)*h)
	for t, tok := range tokens[from:] {
		t += from
		copy(xs[t*h:(t+1)*h], m.embed[tok*h:(tok+1)*h])
	}
	s := m.newScratch()
	for l := 0; l < m.Layers; l++ {
		for t := from; t < len(tokens); t++ {
			m.layerStep(l, xs[t*h:(t+1)*h], t, kv, s)
		}
		if afterLayer != nil {
			if err := afterLayer(l); err != nil {
				return nil, err
			}
		}
	}
	return m.logits(xs[(len(tokens)-1)*h:]), nil
}

// Step runs one decode step: token tok at position pos (K and V of
// positions < pos already in kv), and returns the logits.
func (m *Model) Step(tok, pos int, kv KV) []float32 {
	h := m.Hidden()
	x := make([]float32, h)
	copy(x, m.embed[tok*h:(tok+1)*h])
	s := m.newScratch()
	for l := 0; l < m.Layers; l++ {
		m.layerStep(l, x, pos, kv, s)
	}
	return m.logits(x)
}

// Continue generates greedily from a cache that holds the prompt's K and
// V (positions 0..promptLen−1) and the first token (from the prefill's
// logits): it returns n tokens, first included, calling emit (if not nil)
// with each as it is chosen; an error from emit stops it.
func (m *Model) Continue(first, promptLen, n int, kv KV, emit func(i, tok int) error) ([]int, error) {
	out := make([]int, 0, n)
	tok := first
	for i := 0; i < n; i++ {
		if i > 0 {
			tok = Argmax(m.Step(tok, promptLen+i-1, kv))
		}
		out = append(out, tok)
		if emit != nil {
			if err := emit(i, tok); err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// Generate is the single-process run: prefill then n − 1 decode steps in
// one cache (a Dense one); n tokens.
func (m *Model) Generate(prompt []int, n int) ([]int, error) {
	kv := NewDense(m.Layers, m.KVHeads, m.HeadDim, len(prompt)+n)
	lg, err := m.Prefill(prompt, kv, nil)
	if err != nil {
		return nil, err
	}
	return m.Continue(Argmax(lg), len(prompt), n, kv, nil)
}
