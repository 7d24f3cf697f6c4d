// Command demo is what `make demo` runs: it starts an example prefill rank
// (serving the bootstrap server) and a decode rank as separate processes on
// loopback, drives a workload of requests of mixed lengths with a few aborts
// at random stages, shows progress, and ends with a summary. It exits
// non-zero if any room failed without an abort, any page differs, or any
// room is left pinned.
package main

import (
	"bufio"
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/etcdtest"
	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/rankcmd"
	"github.com/kvbridge/kvbridge/internal/router"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/transfer"
)

type proc struct {
	name     string
	log      string // its stderr (zap's JSON log)
	cmd      *exec.Cmd
	http     string
	boot     string
	endpoint string // control endpoint
	epoch    uint64 // its control-plane epoch
	warmup   time.Duration
	args     []string // its flags (a restart starts it with them again)
}

// secretFile is the demo deployment's shared secret, made at start (unless
// KVBRIDGE_SECRET or KVBRIDGE_SECRET_FILE is set) and handed to every
// process; token is its bootstrap token, for POST /v1/room.
var (
	secretFile, token string
	auth              *bootstrap.Auth
	// logs are the rank processes' log files: removed after a clean run,
	// named in the summary otherwise.
	logs []string
	// logsMu guards logs: the ranks of an instance start in parallel.
	logsMu sync.Mutex
)

func makeSecret() (cleanup func(), err error) {
	auth, _, err = bootstrap.AuthFromEnv()
	if err != nil {
		return nil, err
	}
	cleanup = func() {}
	if auth == nil {
		var b [32]byte
		if _, err := crand.Read(b[:]); err != nil {
			return nil, err
		}
		f, err := os.CreateTemp("", "kvbridge-demo-secret-*")
		if err != nil {
			return nil, err
		}
		secret := hex.EncodeToString(b[:])
		if _, err := f.WriteString(secret); err != nil {
			return nil, err
		}
		f.Close()
		secretFile, cleanup = f.Name(), func() { os.Remove(f.Name()) }
		if auth, err = bootstrap.NewAuth([]byte(secret)); err != nil {
			return nil, err
		}
	}
	token = auth.BootstrapToken()
	return cleanup, nil
}

func start(bin, name string, args ...string) (*proc, error) {
	cmd := exec.Command(filepath.Join(bin, name), args...)
	cmd.Env = os.Environ()
	if secretFile != "" {
		cmd.Env = append(cmd.Env, bootstrap.EnvSecretFile+"="+secretFile)
	}
	if ca != nil && (name == "prefill" || name == "decode") {
		env, err := identityEnv(name, args)
		if err != nil {
			return nil, err
		}
		cmd.Env = append(cmd.Env, env...)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	logf, err := os.CreateTemp("", "kvbridge-demo-"+name+"-*.log")
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w (build it: make demo)", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logf.Name(), args: args}
	logsMu.Lock()
	logs = append(logs, logf.Name())
	logsMu.Unlock()
	line := make(chan string, 1)
	eof := make(chan struct{}) // stdout closed: the process exited
	go func() {
		defer close(eof)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case line <- sc.Text():
			default:
			}
		}
	}()
	select {
	case <-eof:
		err := cmd.Wait()
		select {
		case l := <-line: // printed its line, then exited at once
			return nil, fmt.Errorf("%s exited right after starting (%q): %v (log: %s)%s", name, l, err, logf.Name(), logTail(logf.Name()))
		default:
		}
		return nil, fmt.Errorf("%s did not start: %v (log: %s)%s", name, err, logf.Name(), logTail(logf.Name()))
	case l := <-line:
		for _, f := range strings.Fields(l) {
			if v, ok := strings.CutPrefix(f, "http="); ok {
				p.http = "http://" + v
			}
			if v, ok := strings.CutPrefix(f, "bootstrap="); ok {
				p.boot = v
			}
			if v, ok := strings.CutPrefix(f, "endpoint="); ok {
				p.endpoint = v
			}
			if v, ok := strings.CutPrefix(f, "epoch="); ok {
				p.epoch, _ = strconv.ParseUint(v, 10, 64)
			}
			if v, ok := strings.CutPrefix(f, "warmup="); ok {
				p.warmup, _ = time.ParseDuration(v)
			}
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		return nil, fmt.Errorf("%s did not start in 60 s (log: %s)%s", name, logf.Name(), logTail(logf.Name()))
	}
	return p, nil
}

// logTail is the first lines of a rank's log that say why it stopped (a
// Go crash's own lines, not its goroutine dump), indented, for an error.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var keep []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(l, "goroutine ") && len(keep) > 0 {
			break // the rest is the goroutine dump
		}
		keep = append(keep, "\n    "+l)
	}
	if len(keep) > 20 {
		keep = keep[len(keep)-20:]
	}
	return strings.Join(keep, "")
}

func (p *proc) stop() error {
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		return fmt.Errorf("%s did not stop on SIGTERM", p.name)
	}
}

func post(url string, body any) (rankcmd.RoomResult, error) {
	var res rankcmd.RoomResult
	b, _ := json.Marshal(body)
	req, err := http.NewRequest(http.MethodPost, url+"/v1/room", bytes.NewReader(b))
	if err != nil {
		return res, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := httpClient.Do(req)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return res, fmt.Errorf("%s: %s", resp.Status, data)
	}
	return res, json.Unmarshal(data, &res)
}

var metricLine = regexp.MustCompile(`^(kvbridge_rooms|kvbridge_rooms_past_deadline)(\{[^}]*\})? ([0-9.e+-]+)$`)

// pinned reads a rank's /metrics: live non-terminal rooms and rooms past
// their deadline.
// pinnedAll sums the rooms every rank of insts holds live or past their
// deadline, adding to problems what could not be read and any pinned room.
func pinnedAll(insts []*instance, problems []string) (float64, []string) {
	n := 0.0
	for _, in := range insts {
		for _, p := range in.ranks {
			live, over, err := pinned(p.http)
			if err != nil {
				problems = append(problems, "reading metrics: "+err.Error())
			}
			n += live + over
		}
	}
	if n != 0 {
		problems = append(problems, fmt.Sprintf("%v rooms left live or past their deadline", n))
	}
	return n, problems
}

func pinned(url string) (live, overdue float64, err error) {
	return pinnedWith(http.DefaultClient, url)
}

// pinnedWith is pinned through a given client (one with a timeout, for a
// rank that may be stopped).
func pinnedWith(cl *http.Client, url string) (live, overdue float64, err error) {
	resp, err := cl.Get(url + "/metrics")
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		m := metricLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, _ := strconv.ParseFloat(m[3], 64)
		switch {
		case m[1] == "kvbridge_rooms_past_deadline":
			overdue += v
		case !strings.Contains(m[2], `status="Failed"`) && !strings.Contains(m[2], `status="Success"`):
			live += v
		}
	}
	return live, overdue, sc.Err()
}

type outcome struct {
	tokens   int
	abort    string
	dec, pre []rankcmd.RoomResult // every decode rank, every prefill rank of the room's DP group
	err      error
}

// instance is a group of rank processes started together.
type instance struct {
	name  string
	boot  string
	ranks []*proc // by global rank index: ((dp × PP) + pp) × TP + tp
	par   []transfer.Parallel
}

func (in *instance) stop() {
	for _, p := range in.ranks {
		p.stop()
	}
}

// group returns the ranks of one DP group.
func (in *instance) group(dp int) []*proc {
	var out []*proc
	for i, p := range in.ranks {
		if in.par[i].DPRank == dp {
			out = append(out, p)
		}
	}
	return out
}

// startInstance starts every rank of an instance (rank 0 first; a prefill
// rank 0 serves the bootstrap server unless boot is given).
func startInstance(bin, role, name, boot string, shape transfer.Parallel, common []string) (*instance, error) {
	shape = shape.Norm()
	in := &instance{name: name, boot: boot}
	for dp := 0; dp < shape.DPSize; dp++ {
		for pp := 0; pp < shape.PPSize; pp++ {
			for tp := 0; tp < shape.TPSize; tp++ {
				in.par = append(in.par, transfer.Parallel{TPSize: shape.TPSize, TPRank: tp, PPSize: shape.PPSize, PPRank: pp, DPSize: shape.DPSize, DPRank: dp})
			}
		}
	}
	base := func(i int) []string {
		p := in.par[i]
		a := append(append([]string{}, common...), "-instance", name,
			"-tp", strconv.Itoa(p.TPSize), "-tp-rank", strconv.Itoa(p.TPRank), "-pp", strconv.Itoa(p.PPSize),
			"-pp-rank", strconv.Itoa(p.PPRank), "-dp", strconv.Itoa(p.DPSize), "-dp-rank", strconv.Itoa(p.DPRank))
		if in.boot == "" {
			return append(a, "-serve-bootstrap", "127.0.0.1:0")
		}
		return append(a, "-bootstrap", in.boot)
	}
	args := base
	in.ranks = make([]*proc, len(in.par))
	first, err := start(bin, role, args(0)...)
	if err != nil {
		return nil, err
	}
	in.ranks[0] = first
	if in.boot == "" {
		in.boot = first.boot
	}
	if slices.Contains(common, "tinyllm") {
		// The OpenAI routes are the first rank's: the others join it.
		args = func(i int) []string { return append(base(i), "-front", first.http) }
	}
	// The other ranks in parallel (a prefill rank's start waits for nothing
	// but its own registration).
	errs := make([]error, len(in.par))
	var wg sync.WaitGroup
	for i := 1; i < len(in.par); i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			in.ranks[i], errs[i] = start(bin, role, args(i)...)
		}(i)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, p := range in.ranks {
			if p != nil {
				p.stop()
			}
		}
		return nil, err
	}
	return in, nil
}

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	self, _ := os.Executable()
	bin := fs.String("bin", filepath.Dir(self), "directory holding the prefill and decode binaries")
	requests := fs.Int("requests", 200, "requests to run")
	conc := fs.Int("concurrency", 8, "requests in flight")
	abortRate := fs.Float64("abort-rate", 0.05, "fraction of requests aborted at a random stage")
	model := fs.String("model", "llama3-8b", "model layout preset")
	pages := fs.Int("pages", 1024, "pages per layer region on each rank")
	minTok := fs.Int("min-tokens", 128, "shortest request")
	maxTok := fs.Int("max-tokens", 8192, "longest request")
	engine := fs.String("engine", "ucx", "engine")
	tls := fs.String("ucx-tls", "posix,cma,self", "UCX transports")
	short := fs.Bool("short", false, "a quick run for CI: tiny model, 60 requests")
	identity := fs.Bool("identity", true, "per-rank identity: the demo makes a CA and gives every rank its own certificate and key (KVBRIDGE_CA_FILE, KVBRIDGE_IDENTITY_FILE); false: the shared secret alone")
	hostile := fs.Bool("hostile", false, "while the workload runs, attack both ranks with every class of bad input (see hostile.go)")
	hostileRounds := fs.Int("hostile-rounds", 20, "with -hostile: attack rounds run at least, even past the workload")
	chaos := fs.Bool("chaos", false, "a chaos soak instead of a fixed workload: rooms for -chaos-duration while ranks are SIGKILLed and restarted on new ports, SIGSTOPped past the heartbeat bound, and the bootstrap server or etcd restarts (see chaos.go)")
	serveEtcdSpec := fs.String("serve-etcd", "", "internal: run only an etcd member (dir,client-host:port,peer-host:port), the -chaos soak's etcd process")
	chaosDuration := fs.Duration("chaos-duration", 30*time.Second, "with -chaos: how long the traffic and faults run (at least one fault of each kind runs, even past it)")
	chaosQuiet := fs.Duration("chaos-quiet", time.Minute, "with -chaos: traffic without faults after them, before the spared rank's memory is compared with its steady start")
	seed := fs.Uint64("seed", uint64(time.Now().UnixNano()), "workload seed")
	var pShape, dShape transfer.Parallel
	fs.IntVar(&pShape.TPSize, "prefill-tp", 2, "TP size of each prefill instance (one process per rank)")
	fs.IntVar(&pShape.PPSize, "prefill-pp", 1, "PP size of each prefill instance")
	fs.IntVar(&pShape.DPSize, "dp", 1, "DP attention groups of each prefill instance")
	fs.IntVar(&dShape.TPSize, "decode-tp", 1, "TP size of the decode instance")
	fs.IntVar(&dShape.PPSize, "decode-pp", 1, "PP size of the decode instance")
	instances := fs.Int("prefill-instances", 1, "prefill instances; the driver picks one per request, as a router does")
	decodeInstances := fs.Int("decode-instances", 1, "decode instances; the driver picks one per request")
	discovery := fs.String("discovery", "http", "http (the first prefill rank serves the bootstrap server) or etcd (an embedded etcd server; with 2 prefill and 2 decode instances unless given)")
	dpPick := fs.String("dp-pick", "auto", "prefill DP group per request: auto (room % dp, decided by decode), explicit (chosen by the driver and told to decode) or lookup (chosen by the driver, published by prefill, looked up by decode)")
	pageLayout := fs.String("page-layout", "HND", "order inside a page: HND (head-major, one segment per page per head slice) or NHD (token-major)")
	mla := fs.Bool("mla", false, "an MLA model (tiny-mla with -short, else deepseek-v3)")
	compute := fs.String("compute", "fill", "what the ranks put in the KV cache: fill (a check pattern every decode rank verifies) or tinyllm (a small Llama-architecture model behind the example router; every completion compared with the same model run in this process)")
	tinySpec := fs.String("tinyllm", "", "with -compute tinyllm: the model, key=value,... over the default layers=4,q-heads=8,kv-heads=2,head-dim=32,ffn=512,vocab=2048,seed=1,page-tokens=16")
	gen := fs.Int("gen", 16, "with -compute tinyllm: tokens generated per request (max_tokens)")
	policy := fs.String("policy", "round-robin", "with -compute tinyllm: the router's instance choice, round-robin or least-loaded")
	fault := fs.String("fault", "", "with -compute tinyllm: a deliberate fault on every request (swap-heads-prefill, swap-heads-decode: a wrong head mapping), so the comparison must fail")
	wire := fs.String("wire", "kvbridge", "with -compute tinyllm: how the router drives a pair: kvbridge (every rank's per-rank routes), sglang (SGLang's router: bootstrap_host/port/room to both instances' fronts at once) or vllm (vLLM's serial kv_transfer_params flow)")
	layerwise := fs.Bool("layerwise", false, "the prefill ranks send each room layer group by layer group (sender.SendLayers) instead of one Send per chunk")
	layerGroup := fs.Int("layer-group", 1, "with -layerwise: layers per SendLayers call")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `demo: what make demo runs. It starts example prefill and decode ranks as
separate processes on this machine (one per rank; the first prefill rank
serves the bootstrap server, or -discovery etcd embeds etcd), drives a
workload of requests of mixed lengths through them with a few aborts at
random stages, checks every page on the decode side, and prints a summary.
It exits non-zero if a request fails without an abort, a page differs, or
a room is left pinned. With -compute tinyllm the ranks serve a small
Llama-architecture model behind the example router instead, and every
completion must be token-identical to the same model run in this process.

usage: demo [flags]   (the prefill and decode binaries are taken from -bin)

flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *serveEtcdSpec != "" {
		return serveEtcd(*serveEtcdSpec)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *short { // defaults for a quick run; flags given explicitly win
		for name, v := range map[string]string{"model": "tiny", "requests": "60", "pages": "4096", "max-tokens": "2048"} {
			if !set[name] {
				fs.Set(name, v)
			}
		}
	}
	if *chaos { // a quick model by default: the soak is about the faults
		for name, v := range map[string]string{"model": "tiny", "pages": "4096", "max-tokens": "2048", "concurrency": "4"} {
			if !set[name] {
				fs.Set(name, v)
			}
		}
		if *hostile || set["prefill-instances"] || set["decode-instances"] || set["dp"] || *dpPick != "auto" {
			fmt.Fprintln(os.Stderr, "demo: -chaos runs one prefill and one decode instance (DP 1) without -hostile")
			return 2
		}
	}
	if *mla {
		*model = map[bool]string{true: "tiny-mla", false: "deepseek-v3"}[*short]
	}
	m, ok := kvmodel.Presets[*model]
	if !ok {
		fmt.Fprintf(os.Stderr, "demo: unknown model %q (have %s)\n", *model, kvmodel.PresetNames())
		return 2
	}
	if *discovery == "etcd" {
		for name, v := range map[string]string{"prefill-instances": "2", "decode-instances": "2"} {
			if !set[name] && !*chaos {
				fs.Set(name, v)
			}
		}
		if *hostile {
			fmt.Fprintln(os.Stderr, "demo: -hostile attacks the HTTP bootstrap server: use it with -discovery http")
			return 2
		}
	} else if *discovery != "http" {
		fmt.Fprintf(os.Stderr, "demo: -discovery %q: want http or etcd\n", *discovery)
		return 2
	}
	pShape, dShape = pShape.Norm(), dShape.Norm()
	if *compute != "fill" && *compute != "tinyllm" {
		fmt.Fprintf(os.Stderr, "demo: -compute %q: want fill or tinyllm\n", *compute)
		return 2
	}
	tinyCfg, tinyPT, terr := parseTiny(*tinySpec)
	if terr != nil {
		fmt.Fprintln(os.Stderr, "demo:", terr)
		return 2
	}
	// The shapes are checked before any process starts: a pair the rank
	// mapping does not support is refused in one line.
	{
		pl, err := transfer.ParsePageLayout(*pageLayout)
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			return 2
		}
		mapping := m.Mapping(pl)
		if *compute == "tinyllm" {
			mapping = tinyMapping(tinyCfg, tinyPT, pl)
		}
		if err := router.CheckTopology(mapping, pShape, dShape); err != nil {
			fmt.Fprintf(os.Stderr, "demo: refused before starting any process: prefill (DP %d × PP %d × TP %d) → decode (PP %d × TP %d): %v\n",
				pShape.DPSize, pShape.PPSize, pShape.TPSize, dShape.PPSize, dShape.TPSize, err)
			return 2
		}
	}
	if *compute == "tinyllm" {
		if *chaos || *hostile || *discovery != "http" || *mla {
			fmt.Fprintln(os.Stderr, "demo: -compute tinyllm runs with HTTP discovery, without -chaos, -hostile or -mla")
			return 2
		}
		for name, v := range map[string]string{"requests": "40", "concurrency": "4", "min-tokens": "16", "max-tokens": "96", "pages": "512", "abort-rate": "0.1"} {
			if !set[name] {
				fs.Set(name, v)
			}
		}
		if *short {
			for name, v := range map[string]string{"requests": "16", "max-tokens": "64"} {
				if !set[name] {
					fs.Set(name, v)
				}
			}
		}
		if *minTok < 1 || *maxTok < *minTok || *gen < 1 {
			fmt.Fprintln(os.Stderr, "demo: want 1 ≤ -min-tokens ≤ -max-tokens and -gen ≥ 1")
			return 2
		}
	}
	topology := fmt.Sprintf("prefill %d × (DP %d × PP %d × TP %d) → decode %d × (PP %d × TP %d), %s pages, %s, %s discovery",
		*instances, pShape.DPSize, pShape.PPSize, pShape.TPSize, *decodeInstances, dShape.PPSize, dShape.TPSize, strings.ToUpper(*pageLayout), *model, *discovery)
	if *chaos {
		fmt.Printf("kvbridge demo -chaos: rooms of %d–%d tokens (%s layout) for %v, %d in flight, %.0f%% aborted, engine %s, seed %d\ntopology: %s\n",
			*minTok, *maxTok, *model, *chaosDuration, *conc, 100**abortRate, *engine, *seed, topology)
	} else if *compute == "fill" {
		fmt.Printf("kvbridge demo: %d requests of %d–%d tokens (%s layout), %d in flight, %.0f%% aborted, engine %s, seed %d\ntopology: %s\n",
			*requests, *minTok, *maxTok, *model, *conc, 100**abortRate, *engine, *seed, topology)
	} else {
		fmt.Printf("kvbridge demo -compute tinyllm: %d requests of %d–%d-token prompts through the router, %d tokens each, %d in flight, %.0f%% aborted and retried, engine %s, seed %d\n",
			*requests, *minTok, *maxTok, *gen, *conc, 100**abortRate, *engine, *seed)
	}
	cleanup, serr := makeSecret()
	if serr != nil {
		fmt.Fprintln(os.Stderr, "demo: shared secret:", serr)
		return 1
	}
	defer cleanup()
	if *identity {
		icleanup, err := makeCA()
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo: identity:", err)
			return 1
		}
		defer icleanup()
	}
	if *identity {
		fmt.Println("security: shared secret and per-rank identity (a CA made for this run; each rank process gets its own certificate and key)")
	} else {
		fmt.Println("security: shared secret only (-identity=false: any holder of the secret can speak as any rank)")
	}
	common := []string{"-model", *model, "-pages", strconv.Itoa(*pages), "-engine", *engine, "-ucx-tls", *tls, "-page-layout", *pageLayout}
	if *compute == "tinyllm" {
		common = append(common, tinyRankArgs(tinyCfg, tinyPT)...)
	}
	prefillArgs := common
	if *layerwise {
		prefillArgs = append(append([]string{}, common...), "-layerwise", "-layer-group", strconv.Itoa(*layerGroup))
	}
	if *compute == "tinyllm" {
		topology := fmt.Sprintf("prefill %d × (DP %d × PP %d × TP %d) → decode %d × (PP %d × TP %d), %s pages, tinyllm, %s sends, "+*wire+" wire",
			*instances, pShape.DPSize, pShape.PPSize, pShape.TPSize, *decodeInstances, dShape.PPSize, dShape.TPSize, strings.ToUpper(*pageLayout),
			map[bool]string{false: "whole-chunk", true: fmt.Sprintf("layer-wise (%d per group)", *layerGroup)}[*layerwise])
		return runTiny(tinyOptions{bin: *bin, requests: *requests, conc: *conc, gen: *gen, minTok: *minTok, maxTok: *maxTok,
			abortRate: *abortRate, seed: *seed, cfg: tinyCfg, pageTokens: tinyPT, pages: *pages, rankArgs: common, prefillArgs: prefillArgs,
			pShape: pShape, dShape: dShape, instances: *instances, decodeInstance: *decodeInstances, policy: *policy, fault: *fault, topology: topology, wire: *wire})
	}
	if *dpPick == "lookup" {
		prefillArgs = append(append([]string{}, prefillArgs...), "-publish-dp") // a prefill-only flag
	}
	if *chaos {
		return runChaos(chaosOptions{bin: *bin, duration: *chaosDuration, seed: *seed, discovery: *discovery, conc: *conc,
			abortRate: *abortRate, minTok: *minTok, maxTok: *maxTok, model: m, modelName: *model, pages: *pages,
			common: prefillArgs, pShape: pShape, dShape: dShape, quiet: *chaosQuiet})
	}
	bootOf := func(name string) string { return "" } // http: the instance's first rank serves it
	if *discovery == "etcd" {
		etcd, err := etcdtest.Start()
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo: etcd:", err)
			return 1
		}
		defer etcd.Close()
		fmt.Printf("etcd %s (embedded)\n", etcd.Endpoint)
		bootOf = func(name string) string { return "etcd://" + etcd.Endpoint + "/" + name }
	}
	var prefills []*instance
	for k := 0; k < *instances; k++ {
		name := fmt.Sprintf("prefill-%d", k)
		in, err := startInstance(*bin, "prefill", name, bootOf(name), pShape, prefillArgs)
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			return 1
		}
		defer in.stop()
		prefills = append(prefills, in)
	}
	var decodeInsts []*instance
	for k := 0; k < *decodeInstances; k++ {
		in, err := startInstance(*bin, "decode", fmt.Sprintf("decode-%d", k), prefills[0].boot, dShape, common)
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			return 1
		}
		defer in.stop()
		decodeInsts = append(decodeInsts, in)
	}
	prefill, decode := prefills[0].ranks[0], decodeInsts[0].ranks[0]
	fmt.Printf("bootstrap %s · prefill %s · decode %s (%d processes)\n", prefill.boot, prefill.http, decode.http,
		len(decodeInsts)*len(decodeInsts[0].ranks)+len(prefills)*len(prefills[0].ranks))
	var att *attacker
	stopAttack := func() {}
	rssStart := map[string]float64{}
	if *hostile {
		pl, err := transfer.ParsePageLayout(*pageLayout)
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			return 2
		}
		if att, err = newAttacker(prefill, decode, m, pl, *pages, *hostileRounds); err != nil {
			fmt.Fprintln(os.Stderr, "demo: attacker:", err)
			return 1
		}
		defer att.close()
		actx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { att.run(actx); close(done) }()
		stopAttack = func() { cancel(); <-done }
		defer stopAttack()
	}

	rng := rand.New(rand.NewPCG(*seed, 7))
	stages := []string{"before", "mid", "after", "prefill"}
	work := make([]outcome, *requests)
	for i := range work {
		// Log-uniform lengths: many short requests, some long ones.
		l := math.Exp(math.Log(float64(*minTok)) + rng.Float64()*(math.Log(float64(*maxTok))-math.Log(float64(*minTok))))
		work[i].tokens = int(l)
		if rng.Float64() < *abortRate {
			work[i].abort = stages[rng.IntN(len(stages))]
		}
	}
	start := time.Now()
	var mu sync.Mutex
	done, okN, abN, failN := 0, 0, 0, 0
	var moved uint64
	sem := make(chan struct{}, *conc)
	// Admission by pages: a request starts only when every rank can hold
	// it, so requests never deadlock holding pages on one side each.
	budget := newBudget(*pages)
	var wg sync.WaitGroup
	for i := range work {
		sem <- struct{}{}
		need := (work[i].tokens + m.PageTokens - 1) / m.PageTokens
		budget.take(need)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			defer budget.give(need)
			w := &work[i]
			room := uint64(i + 1)
			// The router's choice: a prefill instance and its DP group,
			// and a decode instance.
			in := prefills[i%len(prefills)]
			decodes := decodeInsts[(i/len(prefills))%len(decodeInsts)]
			group := int(room % uint64(pShape.DPSize))
			dreq := rankcmd.RoomRequest{Room: room, Tokens: w.tokens, Prefill: in.boot, PrefillInstance: in.name}
			switch *dpPick {
			case "explicit":
				group = (i/len(prefills)*7 + 3) % pShape.DPSize
				dreq.PrefillDP = &group
			case "lookup":
				group = (i/len(prefills)*7 + 3) % pShape.DPSize
				lookup := kvmanager.LookupDP
				dreq.PrefillDP = &lookup
			}
			preq := rankcmd.RoomRequest{Room: room, Tokens: w.tokens}
			switch w.abort {
			case "before", "mid", "after":
				dreq.AbortAt = w.abort
			case "prefill":
				preq.AbortAfterChunks = 1
			}
			pranks := in.group(group)
			w.dec, w.pre = make([]rankcmd.RoomResult, len(decodes.ranks)), make([]rankcmd.RoomResult, len(pranks))
			errs := make([]error, len(decodes.ranks)+len(pranks))
			var rw sync.WaitGroup
			for j, p := range decodes.ranks {
				rw.Add(1)
				go func() { defer rw.Done(); w.dec[j], errs[j] = post(p.http, dreq) }()
			}
			if w.abort == "before" {
				time.Sleep(5 * time.Millisecond) // let the abort land before the senders exist
			}
			for j, p := range pranks {
				rw.Add(1)
				go func() { defer rw.Done(); w.pre[j], errs[len(decodes.ranks)+j] = post(p.http, preq) }()
			}
			rw.Wait()
			w.err = errors.Join(errs...)
			mu.Lock()
			done++
			if done == len(work)/4 && att != nil {
				rssStart["prefill"], rssStart["decode"] = rss(prefill), rss(decode)
			}
			switch {
			case judge(w) != "":
				failN++
			case allSucceeded(w.dec):
				okN++
				for _, d := range w.dec {
					moved += d.Bytes
				}
			default:
				abN++
			}
			el := time.Since(start).Seconds()
			fmt.Fprintf(os.Stderr, "\r%s %d/%d  ok %d  aborted %d  failed %d  %.2f GB/s ", bar(done, len(work)), done, len(work),
				okN, abN, failN, float64(moved)/el/1e9)
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	elapsed := time.Since(start)
	stopAttack()
	fmt.Fprintln(os.Stderr)

	var lat []float64
	verified, corrupt := 0, 0
	var problems []string
	for i := range work {
		w := &work[i]
		for _, d := range w.dec {
			verified += d.PagesVerified
			corrupt += d.Corrupt
		}
		if allSucceeded(w.dec) {
			slowest := 0.0
			for _, d := range w.dec {
				slowest = max(slowest, d.LatencyMS)
			}
			lat = append(lat, slowest)
		}
		if p := judge(w); p != "" {
			problems = append(problems, fmt.Sprintf("room %d (%d tokens, abort %q): %s", i+1, w.tokens, w.abort, p))
		}
	}
	pinnedRooms, problems := pinnedAll(append(prefills, decodeInsts...), problems)
	if att != nil {
		problems = append(problems, att.report(rssStart)...)
	}
	sort.Float64s(lat)
	fmt.Printf("\n%-26s %s\n", "topology", topology)
	fmt.Printf("%-26s %v\n", "requests", len(work))
	fmt.Printf("%-26s %d\n", "succeeded", okN)
	fmt.Printf("%-26s %d\n", "aborted", abN)
	fmt.Printf("%-26s %d\n", "failed", failN)
	fmt.Printf("%-26s %.2f GB\n", "bytes moved", float64(moved)/1e9)
	fmt.Printf("%-26s %.2f GB/s over %.1f s\n", "throughput", float64(moved)/elapsed.Seconds()/1e9, elapsed.Seconds())
	fmt.Printf("%-26s %.2f ms / %.2f ms\n", "latency p50 / p99", pct(lat, 0.50), pct(lat, 0.99))
	// Where the time goes, per phase (succeeded requests; decode: the
	// slowest rank, prefill: the slowest rank of the group).
	phase := func(side string, get func(w *outcome) []rankcmd.RoomResult, name string) {
		var v []float64
		for i := range work {
			w := &work[i]
			if !allSucceeded(w.dec) {
				continue
			}
			slowest := 0.0
			for _, r := range get(w) {
				slowest = max(slowest, r.PhasesMS[name])
			}
			v = append(v, slowest)
		}
		sort.Float64s(v)
		fmt.Printf("  %-24s %.2f ms / %.2f ms\n", side+" "+name, pct(v, 0.50), pct(v, 0.99))
	}
	for _, name := range []string{"pages", "transfer"} {
		phase("decode", func(w *outcome) []rankcmd.RoomResult { return w.dec }, name)
	}
	for _, name := range []string{"pages", "fill", "ready", "data"} {
		phase("prefill", func(w *outcome) []rankcmd.RoomResult { return w.pre }, name)
	}
	phase("decode", func(w *outcome) []rankcmd.RoomResult { return w.dec }, "verify")
	var warm []string
	for _, in := range append(prefills, decodeInsts...) {
		for _, p := range in.ranks {
			warm = append(warm, fmt.Sprintf("%s %v", p.name, p.warmup.Round(time.Millisecond)))
		}
	}
	fmt.Printf("%-26s %s (before the first request, not in any latency)\n", "memory warm-up", strings.Join(warm, ", "))
	fmt.Printf("%-26s %v\n", "rooms pinned", pinnedRooms)
	fmt.Printf("%-26s %d (corrupt %d)\n", "pages verified", verified, corrupt)
	return verdict(problems, 0, "", logs, "OK: every request succeeded or was aborted cleanly, every head of every page verified, nothing pinned.")
}

// verdict ends a run's summary: its problems (the first max of them, 0:
// all), then note and the ranks' logs, kept, and exit status 1; or, with
// none, the logs removed, ok and 0.
func verdict(problems []string, max int, note string, logs []string, ok string) int {
	if len(problems) > 0 {
		fmt.Println("\nPROBLEMS:")
		for i, p := range problems {
			if i == max && max > 0 {
				fmt.Printf("  … and %d more\n", len(problems)-max)
				break
			}
			fmt.Println("  " + p)
		}
		fmt.Printf("\n%sthe ranks' logs (kept):\n", note)
		for _, l := range logs {
			fmt.Println("  " + l)
		}
		return 1
	}
	for _, l := range logs {
		os.Remove(l)
	}
	fmt.Println("\n" + ok)
	return 0
}

func allSucceeded(rs []rankcmd.RoomResult) bool {
	for _, r := range rs {
		if r.Status != "Success" {
			return false
		}
	}
	return len(rs) > 0
}

// budget is a counting semaphore of pages.
type budget struct {
	mu   sync.Mutex
	cond *sync.Cond
	free int
}

func newBudget(n int) *budget {
	b := &budget{free: n}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *budget) take(n int) {
	b.mu.Lock()
	for b.free < n {
		b.cond.Wait()
	}
	b.free -= n
	b.mu.Unlock()
}

func (b *budget) give(n int) {
	b.mu.Lock()
	b.free += n
	b.mu.Unlock()
	b.cond.Broadcast()
}

// judge says what is wrong with an outcome ("" if nothing): errors,
// corrupt pages, a decode rank that succeeded while a prefill rank of the
// room did not, or any rank not succeeding in a room without an abort.
func judge(w *outcome) string {
	if w.err != nil {
		return w.err.Error()
	}
	for i, d := range w.dec {
		switch {
		case d.Error != "":
			return fmt.Sprintf("decode rank %d: %s", i, d.Error)
		case d.Corrupt > 0:
			return fmt.Sprintf("decode rank %d: %d pages corrupt", i, d.Corrupt)
		case d.Status != "Success" && d.Status != "Failed":
			return fmt.Sprintf("decode rank %d ended %s", i, d.Status)
		case w.abort == "" && d.Status != "Success":
			return fmt.Sprintf("failed without an abort: decode rank %d %s (%s)", i, d.Status, d.Reason)
		}
	}
	for i, p := range w.pre {
		switch {
		case p.Error != "":
			return fmt.Sprintf("prefill rank %d: %s", i, p.Error)
		case w.abort == "" && p.Status != "Success":
			return fmt.Sprintf("failed without an abort: prefill rank %d %s (%s)", i, p.Status, p.Reason)
		case allSucceeded(w.dec) && p.Status != "Success":
			return fmt.Sprintf("every decode rank succeeded, prefill rank %d %s: %s", i, p.Status, p.Reason)
		}
	}
	return ""
}

func bar(done, total int) string {
	const w = 30
	n := done * w / max(total, 1)
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", w-n) + "]"
}

func pct(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return v[min(len(v)-1, int(p*float64(len(v))))]
}
