package e2e

// The tinyllm example end to end (issue 26): example prefill and decode
// ranks (internal/rankcmd, the example binaries' body, run here as
// re-executions of the test binary) computing real KV with a small
// Llama-architecture model, the example router in this process, and every
// completion compared with the same model run in this process.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/examples/internal/rankcmd"
	"github.com/kvbridge/kvbridge/examples/internal/router"
	"github.com/kvbridge/kvbridge/examples/internal/tinyllm"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func init() {
	if role := os.Getenv("KVBRIDGE_E2E_TINYLLM"); role != "" {
		var args []string
		if err := json.Unmarshal([]byte(os.Getenv("KVBRIDGE_E2E_TINYLLM_ARGS")), &args); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		r := kvmanager.RolePrefill
		if role == "decode" {
			r = kvmanager.RoleDecode
		}
		os.Exit(rankcmd.Main(r, args))
	}
}

// tinyE2E is the tests' model: small enough for the race detector, big
// enough that every head and position matters; 4-token pages, so prompts
// span pages and prefixes are reused.
var tinyE2E = tinyllm.Config{Layers: 2, QHeads: 4, KVHeads: 2, HeadDim: 16, FFN: 64, Vocab: 256, Seed: 11}

const tinyPageTokens = 4

type tinyProc struct {
	role string
	args []string
	cmd  *exec.Cmd
	http string // http://host:port
	boot string
	done chan struct{}
	// stderr is its log (read once it ended).
	stderr *bytes.Buffer
}

// startTinyRank runs a rank process and waits for its ready line.
func startTinyRank(t testing.TB, role string, args ...string) *tinyProc {
	t.Helper()
	p, err := startTinyRankErr(t, role, args...)
	require.NoError(t, err)
	return p
}

// startTinyRankErr is startTinyRank for any goroutine.
func startTinyRankErr(t testing.TB, role string, args ...string) (*tinyProc, error) {
	a, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KVBRIDGE_E2E_TINYLLM="+role, "KVBRIDGE_E2E_TINYLLM_ARGS="+string(a),
		"KVBRIDGE_SECRET="+string(testauth.Secret), "KVBRIDGE_HEARTBEAT=200ms")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &tinyProc{role: role, args: args, cmd: cmd, done: make(chan struct{}), stderr: &stderr}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case line <- sc.Text():
			default:
			}
		}
		cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if strings.Contains(p.stderr.String(), "WARNING: DATA RACE") {
			// A rank process built with -race reports a race on its
			// stderr and exits 66 only at its end: failed here.
			t.Errorf("%s %s: the race detector found a data race in the rank process", p.role, p.http)
		}
		if t.Failed() {
			// (read once the process ended: nothing writes it any more)
			log := p.stderr.String()
			t.Logf("%s %s's log, its last 8 KiB:\n%s", p.role, p.http, log[max(len(log)-8192, 0):])
		}
	})
	select {
	case l := <-line:
		for _, f := range strings.Fields(l) {
			if v, ok := strings.CutPrefix(f, "http="); ok {
				p.http = "http://" + v
			}
			if v, ok := strings.CutPrefix(f, "bootstrap="); ok {
				p.boot = v
			}
		}
	case <-p.done:
		return nil, fmt.Errorf("%s %v exited before it was ready:\n%s", role, args, stderr.String())
	case <-time.After(60 * time.Second):
		return nil, fmt.Errorf("%s %v not ready within 60 s", role, args)
	}
	// The ports it bound (asked for as :0) go into its arguments, so a
	// restart from p.args comes back on the same ones.
	p.args = slices.Clone(args)
	for i := 0; i+1 < len(p.args); i++ {
		switch p.args[i] {
		case "-http":
			p.args[i+1] = strings.TrimPrefix(p.http, "http://")
		case "-serve-bootstrap":
			p.args[i+1] = strings.TrimPrefix(p.boot, "http://")
		}
	}
	return p, nil
}

func (p *tinyProc) stop(t testing.TB) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Errorf("%s did not stop on SIGTERM", p.role)
		p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *tinyProc) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

type tinyCluster struct {
	m               *tinyllm.Model
	prefill, decode []*tinyProc
	rt              *router.Router
	url             string
	client          *http.Client
}

// startTinyCluster starts one prefill and one decode instance of the
// given shapes (one process per rank; prefill rank 0 serves the bootstrap
// server; each instance's other ranks join its first, the front) and a
// router over them.
func startTinyCluster(t testing.TB, cfg tinyllm.Config, layout string, pShape, dShape transfer.Parallel, prefillExtra ...string) *tinyCluster {
	t.Helper()
	return startTinyClusterWith(t, cfg, layout, pShape, dShape, tinyOpts{prefill: prefillExtra})
}

// tinyOpts are a cluster's extra rank flags; decodeNoBootstrap starts the
// decode ranks without -bootstrap (each room names its prefill instance:
// SGLang's wire); wire is the router's.
type tinyOpts struct {
	prefill, decode   []string
	decodeNoBootstrap bool
	wire              string
}

func startTinyClusterWith(t testing.TB, cfg tinyllm.Config, layout string, pShape, dShape transfer.Parallel, o tinyOpts) *tinyCluster {
	t.Helper()
	m, err := tinyllm.New(cfg)
	require.NoError(t, err)
	common := []string{"-compute", "tinyllm", "-layers", strconv.Itoa(cfg.Layers), "-q-heads", strconv.Itoa(cfg.QHeads),
		"-kv-heads", strconv.Itoa(cfg.KVHeads), "-head-dim", strconv.Itoa(cfg.HeadDim), "-ffn", strconv.Itoa(cfg.FFN),
		"-vocab", strconv.Itoa(cfg.Vocab), "-model-seed", strconv.FormatUint(cfg.Seed, 10), "-page-tokens", strconv.Itoa(tinyPageTokens),
		"-pages", "128", "-page-layout", layout, "-warm=false", "-engine", "ucx", "-ucx-tls", "posix,cma,self",
		"-max-misses", "2", "-sweep-interval", "50ms"}
	c := &tinyCluster{m: m}
	shape := func(name string, par transfer.Parallel) []string {
		return append(slices.Clone(common), "-instance", name, "-tp", strconv.Itoa(par.TPSize), "-tp-rank", strconv.Itoa(par.TPRank),
			"-pp", strconv.Itoa(par.PPSize), "-pp-rank", strconv.Itoa(par.PPRank), "-dp", strconv.Itoa(par.DPSize), "-dp-rank", strconv.Itoa(par.DPRank),
			"-http", "127.0.0.1:0") // the rank prints its address; a port picked here could be taken before it binds
	}
	// Prefill rank 0 first (it serves the bootstrap server), then the
	// others at once.
	type spec struct {
		role string
		args []string
	}
	var specs []spec
	for _, role := range []string{"prefill", "decode"} {
		sh := map[string]transfer.Parallel{"prefill": pShape, "decode": dShape}[role].Norm()
		for dp := 0; dp < sh.DPSize; dp++ {
			for pp := 0; pp < sh.PPSize; pp++ {
				for tp := 0; tp < sh.TPSize; tp++ {
					args := shape(role+"-0", transfer.Parallel{TPSize: sh.TPSize, TPRank: tp, PPSize: sh.PPSize, PPRank: pp, DPSize: sh.DPSize, DPRank: dp})
					if role == "prefill" {
						args = append(args, o.prefill...)
					} else {
						args = append(args, o.decode...)
					}
					specs = append(specs, spec{role, args})
				}
			}
		}
	}
	procs := make([]*tinyProc, len(specs))
	procs[0] = startTinyRank(t, "prefill", append(specs[0].args, "-serve-bootstrap", "127.0.0.1:0")...)
	// The decode instance's front, then every other rank at once, each
	// joining its front.
	d0 := slices.IndexFunc(specs, func(s spec) bool { return s.role == "decode" })
	args := func(i int) []string {
		a := specs[i].args
		if specs[i].role == "prefill" || !o.decodeNoBootstrap {
			a = append(a, "-bootstrap", procs[0].boot)
		}
		if i != 0 && i != d0 {
			a = append(a, "-front", procs[map[bool]int{true: 0, false: d0}[specs[i].role == "prefill"]].http)
		}
		return a
	}
	procs[d0] = startTinyRank(t, "decode", args(d0)...)
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i := 1; i < len(specs); i++ {
		if i == d0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			procs[i], errs[i] = startTinyRankErr(t, specs[i].role, args(i)...)
		}()
	}
	wg.Wait()
	for i, p := range procs {
		require.NoError(t, errs[i])
		if specs[i].role == "prefill" {
			c.prefill = append(c.prefill, p)
		} else {
			c.decode = append(c.decode, p)
		}
	}
	urls := func(ps []*tinyProc) (u []string) {
		for _, p := range ps {
			u = append(u, p.http)
		}
		return u
	}
	c.client = &http.Client{}
	t.Cleanup(func() {
		// The router's idle connections first (a server's shutdown waits
		// 5 s for a connection that never carried a request), then every
		// rank but the bootstrap server's at once, then that one.
		c.client.CloseIdleConnections()
		var wg sync.WaitGroup
		for _, p := range append(slices.Clone(c.prefill[1:]), c.decode...) {
			wg.Add(1)
			go func() { defer wg.Done(); p.stop(t) }()
		}
		wg.Wait()
		c.prefill[0].stop(t)
	})
	c.rt, err = router.New(context.Background(), router.Config{Prefill: [][]string{urls(c.prefill)}, Decode: [][]string{urls(c.decode)},
		Token: testauth.Auth().BootstrapToken(), Retries: 5, Timeout: 20 * time.Second, Client: c.client, Wire: o.wire})
	require.NoError(t, err)
	srv := httptest.NewServer(c.rt.Handler())
	t.Cleanup(srv.Close)
	c.url = srv.URL
	return c
}

type tinyReq struct {
	prompt         []int
	text           string
	gen            int
	stream         bool
	abortAt, fault string
}

type tinyAnswer struct {
	tokens []int
	rep    router.KVReport
}

// complete sends one request through the router.
func (c *tinyCluster) complete(t *testing.T, r tinyReq) (tinyAnswer, error) {
	t.Helper()
	body := map[string]any{"max_tokens": r.gen, "stream": r.stream, "abort_at": r.abortAt, "fault": r.fault, "prompt": r.prompt}
	if r.text != "" {
		body["prompt"] = r.text
	}
	b, _ := json.Marshal(body)
	resp, err := c.client.Post(c.url+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		return tinyAnswer{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		return tinyAnswer{}, fmt.Errorf("%s: %s", resp.Status, msg)
	}
	var a tinyAnswer
	if !r.stream {
		var cm router.Completion
		if err := json.NewDecoder(resp.Body).Decode(&cm); err != nil {
			return a, err
		}
		if cm.KV == nil || len(cm.Choices) != 1 {
			return a, fmt.Errorf("answer without kvbridge report or one choice: %+v", cm)
		}
		return tinyAnswer{cm.Choices[0].TokenIDs, *cm.KV}, nil
	}
	sc := bufio.NewScanner(resp.Body)
	final := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var cm router.Completion
		if err := json.Unmarshal([]byte(data), &cm); err != nil || len(cm.Choices) != 1 {
			return a, fmt.Errorf("event %q", data)
		}
		a.tokens = append(a.tokens, cm.Choices[0].TokenIDs...)
		if cm.KV != nil {
			a.rep, final = *cm.KV, true
		}
	}
	if !final {
		return a, fmt.Errorf("stream without its final chunk (%v)", sc.Err())
	}
	return a, nil
}

// expect runs a request and requires the single-process tokens.
func (c *tinyCluster) expect(t *testing.T, r tinyReq) tinyAnswer {
	t.Helper()
	prompt := r.prompt
	if r.text != "" {
		prompt = router.Text(r.text)
	}
	want, err := c.m.Generate(prompt, r.gen)
	require.NoError(t, err)
	a, err := c.complete(t, r)
	require.NoError(t, err, "%d-token prompt", len(prompt))
	require.Equal(t, want, a.tokens, "%d-token prompt (abort %q): tokens (actual), the single-process run's (expected)", len(prompt), r.abortAt)
	return a
}

func tinyPrompt(rng *rand.Rand, n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = rng.IntN(tinyE2E.Vocab)
	}
	return p
}

// mixed runs prompts of several lengths (one page, several, a partial
// last page), streamed and not, a text one, and two sharing a prefix.
func (c *tinyCluster) mixed(t *testing.T, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	for i, n := range []int{1, 4, 9, 23} {
		c.expect(t, tinyReq{prompt: tinyPrompt(rng, n), gen: 6, stream: i%2 == 0})
	}
	c.expect(t, tinyReq{text: "the KV cache moves from prefill to decode", gen: 6, stream: true})
}

// wrongHeads: the same request with a deliberately wrong head mapping on
// one side gives other tokens (the comparison can fail).
func (c *tinyCluster) wrongHeads(t *testing.T, fault string) {
	t.Helper()
	r := tinyReq{prompt: tinyPrompt(rand.New(rand.NewPCG(9, 9)), 21), gen: 8, fault: fault}
	want, _ := c.m.Generate(r.prompt, r.gen)
	a, err := c.complete(t, r)
	require.NoError(t, err)
	require.NotEqual(t, want, a.tokens, "%s: the tokens did not change: the check cannot see a wrong head mapping", fault)
}

// TestTinyllmTP2to1: prefill TP 2 (one KV head each) → decode TP 1, NHD
// pages; prompts of every shape; a reused prefix; requests aborted on
// purpose at every stage and retried on a fresh room; a wrong head
// mapping on the decode side changes the tokens.
func TestTinyllmTP2to1(t *testing.T) {
	t.Parallel() // its own processes and ports
	c := startTinyCluster(t, tinyE2E, "NHD", transfer.Parallel{TPSize: 2}, transfer.Parallel{TPSize: 1})
	c.mixed(t, 1)
	rng := rand.New(rand.NewPCG(2, 2))
	shared := tinyPrompt(rng, 12)
	c.expect(t, tinyReq{prompt: append(slices.Clone(shared), tinyPrompt(rng, 5)...), gen: 5})
	a := c.expect(t, tinyReq{prompt: append(slices.Clone(shared), tinyPrompt(rng, 7)...), gen: 5, stream: true})
	assert.EqualValues(t, 3, a.rep.PrefixPages, "the second prompt sharing 12 tokens reused pages")
	for _, at := range []string{"prefill", "decode-before", "decode-mid"} {
		a := c.expect(t, tinyReq{prompt: tinyPrompt(rng, 14), gen: 5, abortAt: at})
		assert.EqualValues(t, 2, a.rep.Attempts, "abort %s: attempts, failures %q; want the aborted room and its retry", at, a.rep.Failures)
		assert.Len(t, a.rep.Failures, 1, "abort %s: %d attempts, failures; want the aborted room and its retry", at, a.rep.Attempts)
	}
	c.wrongHeads(t, "swap-heads-decode")
}

// TestTinyllmTP1to2: prefill TP 1 → decode TP 2, HND pages, layer-wise
// sends (one SendLayers per layer as the forward pass finishes it): each
// decode rank receives its head, the first gathers the other's; a prefill
// rank that writes its heads swapped changes the tokens.
func TestTinyllmTP1to2(t *testing.T) {
	t.Parallel() // its own processes and ports
	c := startTinyCluster(t, tinyE2E, "HND", transfer.Parallel{TPSize: 1}, transfer.Parallel{TPSize: 2}, "-layerwise")
	c.mixed(t, 3)
	c.wrongHeads(t, "swap-heads-prefill")
}

// TestTinyllmReplicatedHeads: one KV head over prefill TP 2 (both ranks
// hold it; the second is a dummy link) → decode TP 1, HND.
func TestTinyllmReplicatedHeads(t *testing.T) {
	t.Parallel() // its own processes and ports
	cfg := tinyE2E
	cfg.KVHeads = 1
	c := startTinyCluster(t, cfg, "HND", transfer.Parallel{TPSize: 2}, transfer.Parallel{TPSize: 1})
	c.mixed(t, 4)
}

// TestTinyllmPP2to1: prefill PP 2 (two layers per stage) → decode PP 1,
// NHD, layer-wise; each stage writes its layers into the decode rank's
// regions, layer by layer.
func TestTinyllmPP2to1(t *testing.T) {
	t.Parallel() // its own processes and ports
	cfg := tinyE2E
	cfg.Layers = 4
	c := startTinyCluster(t, cfg, "NHD", transfer.Parallel{PPSize: 2}, transfer.Parallel{}, "-layerwise")
	c.mixed(t, 5)
}

// TestTinyllmPrefillRestarted: the prefill rank (which also serves the
// bootstrap server) is SIGKILLed while requests run and started again on
// the same ports (a new process, a new epoch); every request still
// completes token-identical, some of them on a retry.
func TestTinyllmPrefillRestarted(t *testing.T) {
	t.Parallel() // its own processes and ports
	c := startTinyCluster(t, tinyE2E, "NHD", transfer.Parallel{}, transfer.Parallel{})
	rng := rand.New(rand.NewPCG(6, 6))
	prompts := make([][]int, 12)
	for i := range prompts {
		prompts[i] = tinyPrompt(rng, 6+rng.IntN(20))
	}
	completed := make(chan int, len(prompts))
	errs := make([]error, len(prompts))
	answers := make([]tinyAnswer, len(prompts))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i, p := range prompts {
			answers[i], errs[i] = c.complete(t, tinyReq{prompt: p, gen: 5})
			completed <- i
		}
	}()
	<-completed
	<-completed
	c.prefill[0].kill()
	c.prefill[0] = startTinyRank(t, "prefill", c.prefill[0].args...)
	wg.Wait()
	retried := 0
	for i, p := range prompts {
		want, _ := c.m.Generate(p, 5)
		require.NoError(t, errs[i], "request %d", i)
		require.Equal(t, want, answers[i].tokens, "request %d: tokens (actual), the single-process run's (expected)", i)
		if answers[i].rep.Attempts > 1 {
			retried++
			t.Logf("request %d: %d attempts: %q", i, answers[i].rep.Attempts, answers[i].rep.Failures)
		}
	}
	require.NotZero(t, retried, "no request was retried: the restart went unseen")
}
