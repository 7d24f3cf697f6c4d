package tinyllm

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var small = Config{Layers: 3, QHeads: 4, KVHeads: 2, HeadDim: 8, FFN: 24, Vocab: 97, Seed: 7}

// medium is big enough for greedy output to vary and to depend on every head.
var medium = Config{Layers: 2, QHeads: 4, KVHeads: 2, HeadDim: 16, FFN: 64, Vocab: 256, Seed: 1}

// reference is the same maths written plainly, with no cache at all: every
// step recomputes the whole sequence's K and V from scratch, in float64.
func reference(m *Model, prompt []int, n int) (tokens []int, logits [][]float64) {
	seq := slices.Clone(prompt)
	h, d := m.Hidden(), m.HeadDim
	mv := func(w []float32, x []float64, out int) []float64 {
		y := make([]float64, out)
		for o := range y {
			for i, v := range x {
				y[o] += float64(w[o*len(x)+i]) * v
			}
		}
		return y
	}
	norm := func(x []float64, w []float32) []float64 {
		ss := 0.0
		for _, v := range x {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(len(x))+1e-5)
		y := make([]float64, len(x))
		for i, v := range x {
			y[i] = v * inv * float64(w[i])
		}
		return y
	}
	rope := func(x []float64, pos int) {
		for hh := 0; hh < len(x)/d; hh++ {
			for i := 0; i < d/2; i++ {
				s, c := math.Sincos(float64(pos) * math.Pow(m.theta(), -2*float64(i)/float64(d)))
				a, b := x[hh*d+i], x[hh*d+i+d/2]
				x[hh*d+i], x[hh*d+i+d/2] = a*c-b*s, b*c+a*s
			}
		}
	}
	for len(tokens) < n {
		T := len(seq)
		xs := make([][]float64, T)
		for t, tok := range seq {
			xs[t] = make([]float64, h)
			for i := range xs[t] {
				xs[t][i] = float64(m.embed[tok*h+i])
			}
		}
		for l := range m.layers {
			w := &m.layers[l]
			ks, vs, qs := make([][]float64, T), make([][]float64, T), make([][]float64, T)
			for t := range xs {
				nx := norm(xs[t], w.attnNorm)
				qs[t], ks[t], vs[t] = mv(w.wq, nx, h), mv(w.wk, nx, m.KVHeads*d), mv(w.wv, nx, m.KVHeads*d)
				rope(qs[t], t)
				rope(ks[t], t)
			}
			for t := range xs {
				o := make([]float64, h)
				for qh := 0; qh < m.QHeads; qh++ {
					g := qh / (m.QHeads / m.KVHeads)
					sc := make([]float64, t+1)
					mx := math.Inf(-1)
					for p := 0; p <= t; p++ {
						for i := 0; i < d; i++ {
							sc[p] += qs[t][qh*d+i] * ks[p][g*d+i]
						}
						sc[p] /= math.Sqrt(float64(d))
						mx = max(mx, sc[p])
					}
					sum := 0.0
					for p := range sc {
						sc[p] = math.Exp(sc[p] - mx)
						sum += sc[p]
					}
					for p := 0; p <= t; p++ {
						for i := 0; i < d; i++ {
							o[qh*d+i] += sc[p] / sum * vs[p][g*d+i]
						}
					}
				}
				ao := mv(w.wo, o, h)
				for i := range xs[t] {
					xs[t][i] += ao[i]
				}
				nx := norm(xs[t], w.mlpNorm)
				gt, up := mv(w.wg, nx, m.FFN), mv(w.wu, nx, m.FFN)
				for i := range gt {
					gt[i] = gt[i] / (1 + math.Exp(-gt[i])) * up[i]
				}
				dn := mv(w.wd, gt, h)
				for i := range xs[t] {
					xs[t][i] += dn[i]
				}
			}
		}
		lg := mv(m.lmHead, norm(xs[T-1], m.norm), m.Vocab)
		best := 0
		for i, v := range lg {
			if v > lg[best] {
				best = i
			}
		}
		tokens, logits = append(tokens, best), append(logits, lg)
		seq = append(seq, best)
	}
	return tokens, logits
}

func randPrompt(rng *rand.Rand, n, vocab int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = rng.IntN(vocab)
	}
	return p
}

// pagedCache is a TP-1, PP-1 paged cache of npages pages over fresh
// memory, and a scattered page table for n positions.
func pagedCache(t *testing.T, m *Model, layout transfer.PageLayout, pageTokens, npages, first, heads, n int, rng *rand.Rand) *Seq {
	t.Helper()
	regions := make([][]byte, 2*m.Layers)
	for i := range regions {
		regions[i] = make([]byte, npages*pageTokens*heads*m.HeadDim*4)
	}
	c, err := NewCache(regions, 0, first, heads, m.HeadDim, pageTokens, layout)
	require.NoError(t, err)
	perm := rng.Perm(npages)
	var pages []uint32
	for i := 0; i < (n+pageTokens-1)/pageTokens; i++ {
		pages = append(pages, uint32(perm[i]))
	}
	return &Seq{C: c, Pages: pages}
}

// TestMatchesReference: greedy decoding over paged caches (NHD and HND,
// scattered pages) and a dense cache gives the same tokens as the plain
// float64 reference, logits within float32 rounding; paged and dense are
// bit-identical.
func TestMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, cfg := range []Config{small, {Layers: 2, QHeads: 4, KVHeads: 4, HeadDim: 4, FFN: 8, Vocab: 50, Seed: 3},
		{Layers: 2, QHeads: 6, KVHeads: 1, HeadDim: 6, FFN: 16, Vocab: 300, Seed: 9, RopeTheta: 500}} {
		m, err := New(cfg)
		require.NoError(t, err)
		for _, plen := range []int{1, 5, 16, 23} {
			prompt, n := randPrompt(rng, plen, cfg.Vocab), 9
			want, wantLogits := reference(m, prompt, n)
			dense, err := m.Generate(prompt, n)
			require.NoError(t, err)
			require.Equal(t, want, dense, "%+v prompt %d: dense vs reference", cfg, plen)
			for _, layout := range []transfer.PageLayout{transfer.NHD, transfer.HND} {
				seq := pagedCache(t, m, layout, 4, 16, 0, cfg.KVHeads, plen+n, rng)
				lg, err := m.Prefill(prompt, seq, nil)
				require.NoError(t, err)
				for i, v := range lg {
					require.InDelta(t, wantLogits[0][i], float64(v), 1e-3*(1+math.Abs(wantLogits[0][i])), "%+v %v: logit %d", cfg, layout, i)
				}
				got, _ := m.Continue(Argmax(lg), plen, n, seq, nil)
				require.Equal(t, dense, got, "%+v %v prompt %d: paged vs dense", cfg, layout, plen)
			}
		}
	}
}

// TestShardsReassemble: the KV a prefill computed, split into TP ranks'
// head shares (heads divided, and one head replicated over two ranks) and
// PP stages' layers, then put back into another layout's pages, decodes to
// exactly the single-process tokens.
func TestShardsReassemble(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, kvh := range []int{2, 1} {
		cfg := small
		cfg.KVHeads = kvh
		m, _ := New(cfg)
		prompt, n := randPrompt(rng, 19, cfg.Vocab), 8
		want, _ := m.Generate(prompt, n)
		full := NewDense(m.Layers, kvh, m.HeadDim, len(prompt))
		lg, _ := m.Prefill(prompt, full, nil)
		tm := transfer.Model{Layers: m.Layers, KVHeads: kvh, HeadBytes: 4 * m.HeadDim, PageTokens: 4, Layout: transfer.NHD}
		dst := pagedCache(t, m, transfer.HND, 4, 16, 0, kvh, len(prompt)+n, rng)
		for tp := 0; tp < 2; tp++ {
			for pp := 0; pp < 2; pp++ {
				first, heads, err := tm.Heads(2, tp)
				require.NoError(t, err)
				l0, nl := tm.StageLayers(2, pp)
				shard := pagedCache(t, m, transfer.NHD, 4, 8, first, heads, len(prompt), rng)
				shard.C.Layer0, shard.C.Layers, shard.C.Regions = l0, nl, shard.C.Regions[:2*nl]
				CopyShare(shard, full, 0, m.Layers, len(prompt))
				// What the decode side would receive from this shard.
				sub := &Seq{C: &Cache{Regions: dst.C.Regions[2*l0 : 2*(l0+nl)], Layer0: l0, Layers: nl, FirstHead: 0,
					Heads: dst.C.Heads, HeadDim: m.HeadDim, PageTokens: 4, Layout: transfer.HND}, Pages: dst.Pages}
				for l := l0; l < l0+nl; l++ {
					for p := 0; p < len(prompt); p++ {
						for h := first; h < first+heads; h++ {
							dk, dv := sub.Slot(l, p, h)
							sk, sv := shard.Slot(l, p, h)
							copy(dk, sk)
							copy(dv, sv)
						}
					}
				}
			}
		}
		got, _ := m.Continue(Argmax(lg), len(prompt), n, dst, nil)
		require.Equal(t, want, got, "kv heads %d: reassembled vs single process", kvh)
	}
}

// TestPrefillFromEarlierTurn: a second turn (the first turn's prompt, its
// reply and new tokens) prefilled from the cache the first turn's decode
// left (its prompt and reply but the last token) computes only the new
// positions and gives the single-process tokens, bit for bit; a prefix
// computed for other tokens gives other tokens; a prefix that leaves
// nothing to compute is refused.
func TestPrefillFromEarlierTurn(t *testing.T) {
	m, _ := New(medium)
	rng := rand.New(rand.NewPCG(7, 8))
	prompt1, n := randPrompt(rng, 21, m.Vocab), 9
	kv1 := NewDense(m.Layers, m.KVHeads, m.HeadDim, len(prompt1)+n)
	lg, err := m.Prefill(prompt1, kv1, nil)
	require.NoError(t, err)
	reply, err := m.Continue(Argmax(lg), len(prompt1), n, kv1, nil)
	require.NoError(t, err)
	kept := len(prompt1) + n - 1 // (the last token was never fed)
	prompt2 := append(append(slices.Clone(prompt1), reply...), randPrompt(rng, 7, m.Vocab)...)
	want, err := m.Generate(prompt2, n)
	require.NoError(t, err)
	for _, from := range []int{kept, len(prompt1), 1} {
		kv2 := NewDense(m.Layers, m.KVHeads, m.HeadDim, len(prompt2)+n)
		copyPositions(kv2, kv1, m, from)
		lg2, err := m.PrefillFrom(prompt2, from, kv2, nil)
		require.NoError(t, err)
		got, _ := m.Continue(Argmax(lg2), len(prompt2), n, kv2, nil)
		require.Equal(t, want, got, "prefilled from position %d of the first turn's cache", from)
	}
	// Another conversation's cache at the same positions: other tokens.
	other := slices.Clone(prompt1)
	other[3] = (other[3] + 1) % m.Vocab
	kvo := NewDense(m.Layers, m.KVHeads, m.HeadDim, len(prompt1))
	_, err = m.Prefill(other, kvo, nil)
	require.NoError(t, err)
	kv2 := NewDense(m.Layers, m.KVHeads, m.HeadDim, len(prompt2)+n)
	copyPositions(kv2, kvo, m, len(prompt1))
	lg2, err := m.PrefillFrom(prompt2, len(prompt1), kv2, nil)
	require.NoError(t, err)
	got, _ := m.Continue(Argmax(lg2), len(prompt2), n, kv2, nil)
	require.NotEqual(t, want, got, "a prefix computed for other tokens")
	_, err = m.PrefillFrom(prompt2, len(prompt2), kv2, nil)
	require.Error(t, err, "a prefix covering the whole prompt")
}

func copyPositions(dst, src KV, m *Model, n int) {
	for l := 0; l < m.Layers; l++ {
		for p := 0; p < n; p++ {
			for h := 0; h < m.KVHeads; h++ {
				dk, dv := dst.Slot(l, p, h)
				sk, sv := src.Slot(l, p, h)
				copy(dk, sk)
				copy(dv, sv)
			}
		}
	}
}

// TestWrongHeadsChangeTokens: the same KV read with its heads swapped (a
// wrong head mapping), or one page's positions shifted, gives other
// tokens — the token check can fail.
func TestWrongHeadsChangeTokens(t *testing.T) {
	m, _ := New(medium)
	rng := rand.New(rand.NewPCG(5, 6))
	differ := 0
	for i := 0; i < 5; i++ {
		prompt, n := randPrompt(rng, 40, m.Vocab), 8
		want, _ := m.Generate(prompt, n)
		seq := pagedCache(t, m, transfer.HND, 16, 4, 0, m.KVHeads, len(prompt)+n, rng)
		lg, _ := m.Prefill(prompt, seq, nil)
		seq.Swap = true
		got, _ := m.Continue(Argmax(lg), len(prompt), n, seq, nil)
		if !slices.Equal(got, want) {
			differ++
		}
	}
	require.Equal(t, 5, differ, "prompts of 5 whose tokens swapped heads changed, want all")
}

// TestSeedsAndVariety: the same seed gives the same weights and tokens,
// another seed other tokens, and greedy output is not one repeated token.
func TestSeedsAndVariety(t *testing.T) {
	a, _ := New(medium)
	b, _ := New(medium)
	c := medium
	c.Seed = 2
	o, _ := New(c)
	prompt := randPrompt(rand.New(rand.NewPCG(1, 1)), 30, a.Vocab)
	ta, _ := a.Generate(prompt, 16)
	tb, _ := b.Generate(prompt, 16)
	to, _ := o.Generate(prompt, 16)
	require.Equal(t, ta, tb, "seed 1 twice")
	require.NotEqual(t, ta, to, "seed 1 and seed 2")
	distinct := map[int]bool{}
	for _, v := range ta {
		distinct[v] = true
	}
	require.GreaterOrEqual(t, len(distinct), 4, "16 tokens, distinct ones: %v", ta)
}

func TestRefusals(t *testing.T) {
	for _, c := range []Config{{}, {Layers: 1, QHeads: 3, KVHeads: 2, HeadDim: 4, FFN: 4, Vocab: 4}, {Layers: 1, QHeads: 2, KVHeads: 2, HeadDim: 3, FFN: 4, Vocab: 4}} {
		_, err := New(c)
		assert.Error(t, err, "%+v accepted", c)
	}
	m, _ := New(small)
	_, err := m.Prefill([]int{1, small.Vocab}, NewDense(3, 2, 8, 2), nil)
	assert.Error(t, err, "a token outside the vocabulary was accepted")
	_, err = m.Prefill(nil, NewDense(3, 2, 8, 2), nil)
	assert.Error(t, err, "an empty prompt was accepted")
}

func BenchmarkDefaultRequest(b *testing.B) {
	m, _ := New(Default)
	prompt := randPrompt(rand.New(rand.NewPCG(1, 1)), 64, m.Vocab)
	for b.Loop() {
		m.Generate(prompt, 16)
	}
}
