package main

// -compute tinyllm: the demo's ranks serve a real model (examples/internal/tinyllm)
// behind the example router, and every completion is compared with the
// same model run in this process.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/examples/internal/router"
	"github.com/kvbridge/kvbridge/examples/internal/tinyllm"
	"github.com/kvbridge/kvbridge/transfer"
)

type tinyOptions struct {
	bin                       string
	requests, conc, gen       int
	minTok, maxTok            int
	abortRate                 float64
	seed                      uint64
	cfg                       tinyllm.Config
	pageTokens, pages         int
	decodePT                  int // the decode ranks' page tokens (pageTokens: the prefill ranks')
	rankArgs, prefillArgs     []string
	pShape, dShape            transfer.Parallel
	instances, decodeInstance int
	policy, fault             string
	topology                  string
	wire                      string
	multiTurn                 bool
}

// parseTiny reads -tinyllm's key=value list over tinyllm.Default.
func parseTiny(spec string) (tinyllm.Config, int, error) {
	c, pt := tinyllm.Default, 16
	if spec == "" {
		return c, pt, nil
	}
	for _, kv := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 1 {
			return c, pt, fmt.Errorf("-tinyllm %q: want key=positive integer, comma-separated", kv)
		}
		switch k {
		case "layers":
			c.Layers = n
		case "q-heads":
			c.QHeads = n
		case "kv-heads":
			c.KVHeads = n
		case "head-dim":
			c.HeadDim = n
		case "ffn":
			c.FFN = n
		case "vocab":
			c.Vocab = n
		case "seed":
			c.Seed = uint64(n)
		case "page-tokens":
			pt = n
		default:
			return c, pt, fmt.Errorf("-tinyllm: unknown key %q (layers, q-heads, kv-heads, head-dim, ffn, vocab, seed, page-tokens)", k)
		}
	}
	return c, pt, c.Validate()
}

// tinyRankArgs are the rank flags for the model.
func tinyRankArgs(c tinyllm.Config, pt int) []string {
	return []string{"-compute", "tinyllm", "-layers", strconv.Itoa(c.Layers), "-q-heads", strconv.Itoa(c.QHeads),
		"-kv-heads", strconv.Itoa(c.KVHeads), "-head-dim", strconv.Itoa(c.HeadDim), "-ffn", strconv.Itoa(c.FFN),
		"-vocab", strconv.Itoa(c.Vocab), "-model-seed", strconv.FormatUint(c.Seed, 10), "-page-tokens", strconv.Itoa(pt)}
}

// tinyMapping is the model's KV as the rank mapping sees it.
func tinyMapping(c tinyllm.Config, pt int, layout transfer.PageLayout) transfer.Model {
	return transfer.Model{Layers: c.Layers, KVHeads: c.KVHeads, HeadBytes: 4 * c.HeadDim, PageTokens: pt, Layout: layout}
}

type tinyWork struct {
	prompt      []int
	text        string // a text prompt (its bytes are prompt)
	stream      bool
	abort       string
	want, got   []int
	ttft, tpot  float64 // ms
	attempts    int
	prefixPages int
	err         error
	// -multi-turn: the second turn (the prompt, the reply, new tokens)
	// and the prompt tokens its prefill reused.
	next   *tinyWork
	reused int
}

// makePrompts draws the workload: lengths log-uniform in [minTok, maxTok],
// a third of the prompts text, a third starting with a shared 40-token
// preamble (a system prompt: the decode rank's prefix cache serves its
// whole pages), some aborted on purpose at a random stage (the router
// retries them).
func makePrompts(o tinyOptions) []tinyWork {
	rng := rand.New(rand.NewPCG(o.seed, 26))
	pre := make([]int, 40)
	for i := range pre {
		pre[i] = rng.IntN(o.cfg.Vocab)
	}
	stages := []string{"prefill", "decode-before", "decode-mid"}
	work := make([]tinyWork, o.requests)
	for i := range work {
		w := &work[i]
		n := o.minTok + rng.IntN(o.maxTok-o.minTok+1)
		switch {
		case i%3 == 0 && o.cfg.Vocab >= 256:
			var b strings.Builder
			for b.Len() < n {
				b.WriteString([]string{"the ", "KV ", "cache ", "moves ", "from ", "prefill ", "to ", "decode. "}[rng.IntN(8)])
			}
			w.text = b.String()[:n]
			w.prompt = router.Text(w.text)
		case i%3 == 1:
			w.prompt = append(slices.Clone(pre), make([]int, max(n-len(pre), 1))...)
			for j := len(pre); j < len(w.prompt); j++ {
				w.prompt[j] = rng.IntN(o.cfg.Vocab)
			}
		default:
			w.prompt = make([]int, n)
			for j := range w.prompt {
				w.prompt[j] = rng.IntN(o.cfg.Vocab)
			}
		}
		w.stream = i%2 == 0
		if rng.Float64() < o.abortRate {
			w.abort = stages[rng.IntN(len(stages))]
		}
		if o.multiTurn {
			// (its prompt is known once the first turn's reply is: single)
			w.next = &tinyWork{stream: !w.stream, prompt: make([]int, 4+rng.IntN(12))}
			for j := range w.next.prompt {
				w.next.prompt[j] = rng.IntN(o.cfg.Vocab)
			}
		}
	}
	return work
}

// single runs every prompt in this process: prefill then decode steps,
// timed as TTFT (the prefill's forward pass and first token) and TPOT.
func single(m *tinyllm.Model, work []tinyWork, gen int) (ttft, tpot []float64, err error) {
	for i := range work {
		w := &work[i]
		start := time.Now()
		kv := tinyllm.NewDense(m.Layers, m.KVHeads, m.HeadDim, len(w.prompt)+gen)
		lg, err := m.Prefill(w.prompt, kv, nil)
		if err != nil {
			return nil, nil, err
		}
		var first time.Time
		w.want, _ = m.Continue(tinyllm.Argmax(lg), len(w.prompt), gen, kv, func(i, _ int) error {
			if i == 0 {
				first = time.Now()
			}
			return nil
		})
		ttft = append(ttft, ms(first.Sub(start)))
		if gen > 1 {
			tpot = append(tpot, ms(time.Since(first))/float64(gen-1))
		}
		if n := w.next; n != nil {
			// -multi-turn: the second turn's prompt is this one's, its
			// reply and the new tokens drawn (not timed here).
			n.prompt = append(append(slices.Clone(w.prompt), w.want...), n.prompt...)
			if n.want, err = m.Generate(n.prompt, gen); err != nil {
				return nil, nil, err
			}
		}
	}
	return ttft, tpot, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// complete sends one request through the router and reads the answer
// (an SSE stream or one JSON object).
func complete(url string, w *tinyWork, gen int, fault string) {
	body := map[string]any{"max_tokens": gen, "stream": w.stream}
	if w.text != "" {
		body["prompt"] = w.text
	} else {
		body["prompt"] = w.prompt
	}
	if w.abort != "" {
		body["abort_at"] = w.abort
	}
	if fault != "" {
		body["fault"] = fault
	}
	b, _ := json.Marshal(body)
	start := time.Now()
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		w.err = err
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		w.err = fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))
		return
	}
	var first time.Time
	var rep *router.KVReport
	if !w.stream {
		var c router.Completion
		if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || len(c.Choices) != 1 {
			w.err = fmt.Errorf("answer: %v", err)
			return
		}
		first = time.Now()
		w.got, rep = c.Choices[0].TokenIDs, c.KV
		w.ttft = ms(first.Sub(start)) // (not streamed: the whole answer)
		if rep != nil {
			w.ttft, w.tpot = rep.TTFTMS, rep.TPOTMS // the router's view
		}
	} else {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			if data == "[DONE]" {
				break
			}
			var c router.Completion
			if err := json.Unmarshal([]byte(data), &c); err != nil || len(c.Choices) != 1 {
				w.err = fmt.Errorf("event %.80q: not a completion chunk", data)
				return
			}
			if len(c.Choices[0].TokenIDs) > 0 && w.got == nil {
				first = time.Now()
			}
			w.got = append(w.got, c.Choices[0].TokenIDs...)
			if c.KV != nil {
				rep = c.KV
			}
		}
		if rep == nil {
			w.err = errors.New("the stream ended without its final chunk")
			return
		}
		w.ttft = ms(first.Sub(start))
		if len(w.got) > 1 {
			w.tpot = ms(time.Since(first)) / float64(len(w.got)-1)
		}
	}
	if rep != nil {
		w.attempts, w.prefixPages, w.reused = rep.Attempts, rep.PrefixPages, rep.ReusedTokens
	}
}

func runTiny(o tinyOptions) int {
	m, err := tinyllm.New(o.cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 2
	}
	work := makePrompts(o)
	pages := fmt.Sprintf("%d-token pages", o.pageTokens)
	if o.decodePT != o.pageTokens {
		pages = fmt.Sprintf("%d-token prefill and %d-token decode pages", o.pageTokens, o.decodePT)
	}
	fmt.Printf("model                      %s (%d layers, %d query and %d KV heads of %d, FFN %d, vocabulary %d), %s\n",
		o.cfg.Fingerprint(), o.cfg.Layers, o.cfg.QHeads, o.cfg.KVHeads, o.cfg.HeadDim, o.cfg.FFN, o.cfg.Vocab, pages)
	sTTFT, sTPOT, err := single(m, work, o.gen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo: single-process run:", err)
		return 1
	}
	var prefills, decodes []*instance
	defer func() {
		for _, in := range append(prefills, decodes...) {
			in.stop()
		}
	}()
	for k := 0; k < o.instances; k++ {
		in, err := startInstance(o.bin, "prefill", fmt.Sprintf("prefill-%d", k), "", o.pShape, o.prefillArgs)
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			return 1
		}
		prefills = append(prefills, in)
	}
	for k := 0; k < o.decodeInstance; k++ {
		in, err := startInstance(o.bin, "decode", fmt.Sprintf("decode-%d", k), prefills[0].boot, o.dShape, o.rankArgs)
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			return 1
		}
		decodes = append(decodes, in)
	}
	rargs := []string{"-listen", "127.0.0.1:0", "-policy", o.policy, "-wire", o.wire}
	if o.multiTurn {
		rargs = append(rargs, "-multi-turn")
	}
	for _, s := range []struct {
		flag string
		ins  []*instance
	}{{"-prefill", prefills}, {"-decode", decodes}} {
		for _, in := range s.ins {
			var urls []string
			for _, p := range in.ranks {
				urls = append(urls, p.http)
			}
			rargs = append(rargs, s.flag, strings.Join(urls, ","))
		}
	}
	rt, err := start(o.bin, "router", rargs...)
	if err != nil || rt.http == "" {
		fmt.Fprintln(os.Stderr, "demo: router:", err)
		return 1
	}
	defer rt.stop()
	fmt.Printf("router %s · %d prefill and %d decode instances (%d processes)\n", rt.http, len(prefills), len(decodes),
		len(prefills)*len(prefills[0].ranks)+len(decodes)*len(decodes[0].ranks)+1)

	start := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, o.conc)
	var mu sync.Mutex
	done := 0
	for i := range work {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			complete(rt.http, &work[i], o.gen, o.fault)
			if n := work[i].next; n != nil && work[i].err == nil {
				complete(rt.http, n, o.gen, o.fault) // the conversation's second turn
			}
			mu.Lock()
			done++
			fmt.Fprintf(os.Stderr, "\r%s %d/%d ", bar(done, len(work)), done, len(work))
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	fmt.Fprintln(os.Stderr)

	var ttft, tpot []float64
	identical, retried, prefixReq, prefixPages := 0, 0, 0, 0
	var problems []string
	for i := range work {
		w := &work[i]
		switch {
		case w.err != nil:
			problems = append(problems, fmt.Sprintf("request %d (%d-token prompt, abort %q): %v", i, len(w.prompt), w.abort, w.err))
			continue
		case !slices.Equal(w.got, w.want):
			problems = append(problems, fmt.Sprintf("request %d (%d-token prompt, abort %q): tokens %v, the single-process run's %v", i, len(w.prompt), w.abort, w.got, w.want))
		default:
			identical++
		}
		ttft, tpot = append(ttft, w.ttft), append(tpot, w.tpot)
		if w.attempts > 1 {
			retried++
		}
		if w.abort != "" && w.attempts < 2 {
			problems = append(problems, fmt.Sprintf("request %d: aborted on purpose (%s) but served in %d attempt", i, w.abort, w.attempts))
		}
		if w.prefixPages > 0 {
			prefixReq++
			prefixPages += w.prefixPages
		}
	}
	turns, turnsIdentical, turnsReused, reusedTokens, turnTokens := 0, 0, 0, 0, 0
	for i := range work {
		n := work[i].next
		if n == nil || work[i].err != nil {
			continue
		}
		turns++
		turnTokens += len(n.prompt)
		switch {
		case n.err != nil:
			problems = append(problems, fmt.Sprintf("request %d's second turn (%d-token prompt): %v", i, len(n.prompt), n.err))
		case !slices.Equal(n.got, n.want):
			problems = append(problems, fmt.Sprintf("request %d's second turn (%d-token prompt): tokens %v, the single-process run's %v", i, len(n.prompt), n.got, n.want))
		default:
			turnsIdentical++
		}
		if n.reused == len(work[i].prompt)+len(work[i].want)-1 {
			turnsReused++ // (the first turn's whole KV: its prompt and reply but the last token)
		}
		reusedTokens += n.reused
	}
	if o.multiTurn && turnsReused == 0 {
		problems = append(problems, fmt.Sprintf("-multi-turn: none of %d second turns reused its first turn's whole KV", turns))
	}
	pinnedRooms, problems := pinnedAll(append(prefills, decodes...), problems)
	problems = leasesReleased(instanceURLs(prefills), demoLeaseBound, problems)
	for _, v := range [][]float64{ttft, tpot, sTTFT, sTPOT} {
		sort.Float64s(v)
	}
	fmt.Printf("\n%-26s %s\n", "topology", o.topology)
	fmt.Printf("%-26s %d (%d-%d-token prompts, %d tokens each, %d in flight, %s)\n", "requests", len(work), o.minTok, o.maxTok, o.gen, o.conc, o.policy)
	fmt.Printf("%-26s %d\n", "token-identical", identical)
	fmt.Printf("%-26s %d (aborted on purpose at a random stage, served on a fresh room)\n", "retried", retried)
	fmt.Printf("%-26s %d\n", "failed", len(work)-identical)
	fmt.Printf("%-26s %d requests, %d pages not transferred\n", "prefix reused", prefixReq, prefixPages)
	if o.multiTurn {
		fmt.Printf("%-26s %d of %d token-identical; %d of %d prefilled from the first turn's whole KV, fetched from the decode instance: %d of their %d prompt tokens not computed\n",
			"second turns", turnsIdentical, turns, turnsReused, turns, reusedTokens, turnTokens)
	}
	fmt.Printf("%-26s %.1f s\n", "wall time", elapsed.Seconds())
	fmt.Printf("%-26s %-34s %s\n", "", "through the router", "single process")
	fmt.Printf("%-26s %-34s %.2f ms / %.2f ms\n", "TTFT p50 / p99", fmt.Sprintf("%.2f ms / %.2f ms", pct(ttft, 0.5), pct(ttft, 0.99)), pct(sTTFT, 0.5), pct(sTTFT, 0.99))
	fmt.Printf("%-26s %-34s %.2f ms / %.2f ms\n", "TPOT p50 / p99", fmt.Sprintf("%.2f ms / %.2f ms", pct(tpot, 0.5), pct(tpot, 0.99)), pct(sTPOT, 0.5), pct(sTPOT, 0.99))
	fmt.Printf("%-26s %v\n", "rooms pinned", pinnedRooms)
	return verdict(problems, 20, "", logs, "OK: every completion through the router is token-identical to the single-process run, nothing pinned.")
}
