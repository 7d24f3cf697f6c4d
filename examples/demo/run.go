package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/examples/internal/cli"
	"github.com/kvbridge/kvbridge/examples/internal/rankcmd"
	"github.com/kvbridge/kvbridge/examples/internal/router"
	"github.com/kvbridge/kvbridge/examples/internal/tinyllm"
	"github.com/kvbridge/kvbridge/internal/etcdtest"
	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/transfer"
)

// demoFlags are the demo's flags, settled: defaults of -short, -chaos,
// -discovery etcd and -compute tinyllm applied where a flag was not given.
type demoFlags struct {
	bin                           string
	requests, conc                int
	abortRate                     float64
	model                         string
	pages, minTok, maxTok         int
	engine, tls                   string
	short, identity, hostile      bool
	hostileRounds                 int
	chaos                         bool
	serveEtcd                     string
	chaosDuration, chaosQuiet     time.Duration
	seed                          uint64
	pShape, dShape                transfer.Parallel
	instances, decodeInstances    int
	discovery, dpPick, pageLayout string
	mla                           bool
	compute, tinySpec             string
	gen                           int
	policy, fault, wire           string
	multiTurn                     bool
	layerwise, digest             bool
	layerGroup                    int
	transfer                      string          // -transfer: push or pull
	set                           map[string]bool // the flags given
	fs                            *flag.FlagSet
	kv                            kvmodel.Model
	tinyCfg                       tinyllm.Config
	tinyPT                        int
	layout                        transfer.PageLayout
	common, prefillArgs           []string // every rank's flags; a prefill rank's
	decodeArgs                    []string // a decode rank's
	prefillPT, decodePT           int      // tokens per page on each side (0: the model's)
}

func newDemoFlags() *demoFlags {
	o := &demoFlags{fs: flag.NewFlagSet("demo", flag.ContinueOnError), set: map[string]bool{}}
	fs := o.fs
	self, _ := os.Executable()
	fs.StringVar(&o.bin, "bin", filepath.Dir(self), "directory holding the prefill and decode binaries")
	fs.IntVar(&o.requests, "requests", 200, "requests to run")
	fs.IntVar(&o.conc, "concurrency", 8, "requests in flight")
	fs.Float64Var(&o.abortRate, "abort-rate", 0.05, "fraction of requests aborted at a random stage")
	fs.StringVar(&o.model, "model", "llama3-8b", "model layout preset")
	fs.IntVar(&o.pages, "pages", 1024, "pages per layer region on each rank")
	fs.IntVar(&o.minTok, "min-tokens", 128, "shortest request")
	fs.IntVar(&o.maxTok, "max-tokens", 8192, "longest request")
	fs.StringVar(&o.engine, "engine", "ucx", "engine")
	fs.StringVar(&o.tls, "ucx-tls", "posix,cma,self", "UCX transports")
	fs.BoolVar(&o.short, "short", false, "a quick run for CI: tiny model, 60 requests")
	fs.BoolVar(&o.identity, "identity", true, "per-rank identity: the demo makes a CA and gives every rank its own certificate and key (KVBRIDGE_CA_FILE, KVBRIDGE_IDENTITY_FILE); false: the shared secret alone")
	fs.BoolVar(&o.hostile, "hostile", false, "while the workload runs, attack both ranks with every class of bad input (see hostile.go)")
	fs.IntVar(&o.hostileRounds, "hostile-rounds", 20, "with -hostile: attack rounds run at least, even past the workload")
	fs.BoolVar(&o.chaos, "chaos", false, "a chaos soak instead of a fixed workload: rooms for -chaos-duration while ranks are SIGKILLed and restarted on new ports, SIGSTOPped past the heartbeat bound, and the bootstrap server or etcd restarts (see chaos.go)")
	fs.StringVar(&o.serveEtcd, "serve-etcd", "", "internal: run only an etcd member (dir,client-host:port,peer-host:port), the -chaos soak's etcd process")
	fs.DurationVar(&o.chaosDuration, "chaos-duration", 30*time.Second, "with -chaos: how long the traffic and faults run (at least one fault of each kind runs, even past it)")
	fs.DurationVar(&o.chaosQuiet, "chaos-quiet", time.Minute, "with -chaos: traffic without faults after them, before the spared rank's memory is compared with its steady start")
	fs.Uint64Var(&o.seed, "seed", uint64(time.Now().UnixNano()), "workload seed")
	fs.IntVar(&o.pShape.TPSize, "prefill-tp", 2, "TP size of each prefill instance (one process per rank)")
	fs.IntVar(&o.pShape.PPSize, "prefill-pp", 1, "PP size of each prefill instance")
	fs.IntVar(&o.pShape.DPSize, "dp", 1, "DP attention groups of each prefill instance")
	fs.IntVar(&o.dShape.TPSize, "decode-tp", 1, "TP size of the decode instance")
	fs.IntVar(&o.dShape.PPSize, "decode-pp", 1, "PP size of the decode instance")
	fs.IntVar(&o.instances, "prefill-instances", 1, "prefill instances; the driver picks one per request, as a router does")
	fs.IntVar(&o.decodeInstances, "decode-instances", 1, "decode instances; the driver picks one per request")
	fs.StringVar(&o.discovery, "discovery", "http", "http (the first prefill rank serves the bootstrap server) or etcd (an embedded etcd server; with 2 prefill and 2 decode instances unless given)")
	fs.StringVar(&o.dpPick, "dp-pick", "auto", "prefill DP group per request: auto (room % dp, decided by decode), explicit (chosen by the driver and told to decode) or lookup (chosen by the driver, published by prefill, looked up by decode)")
	fs.StringVar(&o.pageLayout, "page-layout", "HND", "order inside a page: HND (head-major, one segment per page per head slice) or NHD (token-major)")
	fs.BoolVar(&o.mla, "mla", false, "an MLA model (tiny-mla with -short, else deepseek-v3)")
	fs.StringVar(&o.compute, "compute", "fill", "what the ranks put in the KV cache: fill (a check pattern every decode rank verifies) or tinyllm (a small Llama-architecture model behind the example router; every completion compared with the same model run in this process)")
	fs.StringVar(&o.tinySpec, "tinyllm", "", "with -compute tinyllm: the model, key=value,... over the default layers=4,q-heads=8,kv-heads=2,head-dim=32,ffn=512,vocab=2048,seed=1,page-tokens=16")
	fs.IntVar(&o.gen, "gen", 16, "with -compute tinyllm: tokens generated per request (max_tokens)")
	fs.StringVar(&o.policy, "policy", "round-robin", "with -compute tinyllm: the router's instance choice, round-robin or least-loaded")
	fs.StringVar(&o.fault, "fault", "", "with -compute tinyllm: a deliberate fault on every request (swap-heads-prefill, swap-heads-decode: a wrong head mapping), so the comparison must fail")
	fs.StringVar(&o.wire, "wire", "kvbridge", "with -compute tinyllm: how the router drives a pair: kvbridge (every rank's per-rank routes), sglang (SGLang's router: bootstrap_host/port/room to both instances' fronts at once), vllm (vLLM's serial kv_transfer_params flow), push (vLLM push: both legs at once from the prefill's cached identity), mooncake (vLLM's MooncakeConnector wire) or offloading (vLLM's OffloadingConnector P2P wire)")
	fs.BoolVar(&o.multiTurn, "multi-turn", false, "with -compute tinyllm and -wire vllm or push, instances of one rank: every request has a second turn (its prompt, the reply and new tokens) whose prefill fetches the first turn's KV from the decode instance (the ranks' -reuse-pages, the router's -multi-turn) and computes only the new tokens; checked token-identical too")
	fs.BoolVar(&o.digest, "digest", false, "every room asks for a digest: the prefill ranks send a CRC-32C of each page they push, the decode ranks check it before Success (docs/PROTOCOL.md \"Digest\"; pushed or pulled); the summary counts the pages checked and any mismatch")
	fs.BoolVar(&o.layerwise, "layerwise", false, "the prefill ranks send each room layer group by layer group (sender.SendLayers) instead of one Send per chunk")
	fs.IntVar(&o.layerGroup, "layer-group", 1, "with -layerwise: layers per SendLayers call")
	fs.IntVar(&o.prefillPT, "prefill-page-tokens", 0, "tokens per page on the prefill ranks (0: the model's); pages of the two sides may differ when one size divides the other")
	fs.IntVar(&o.decodePT, "decode-page-tokens", 0, "tokens per page on the decode ranks (0: the model's)")
	fs.StringVar(&o.transfer, "transfer", "push", "push (the prefill ranks write each room into the decode ranks' pages) or pull (the decode ranks read what the prefill ranks publish, under a lease; docs/PROTOCOL.md \"Pull\")")
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
	return o
}

// defaults sets the flags not given on the command line.
func (o *demoFlags) defaults(v map[string]string) {
	for name, val := range v {
		if !o.set[name] {
			o.fs.Set(name, val)
		}
	}
}

// settle applies the mode defaults and checks the flags together, before
// any process starts: an error is a usage error (exit 2).
func (o *demoFlags) settle() error {
	o.fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	if o.multiTurn && !o.set["prefill-tp"] {
		o.pShape.TPSize = 1 // (instances of one rank)
	}
	if o.short { // defaults for a quick run; flags given explicitly win
		o.defaults(map[string]string{"model": "tiny", "requests": "60", "pages": "4096", "max-tokens": "2048"})
	}
	if o.chaos { // a quick model by default: the soak is about the faults
		o.defaults(map[string]string{"model": "tiny", "pages": "4096", "max-tokens": "2048", "concurrency": "4"})
		if o.hostile || o.set["prefill-instances"] || o.set["decode-instances"] || o.set["dp"] || o.dpPick != "auto" {
			return errors.New("-chaos runs one prefill and one decode instance (DP 1) without -hostile")
		}
	}
	if o.mla {
		o.model = map[bool]string{true: "tiny-mla", false: "deepseek-v3"}[o.short]
	}
	m, ok := kvmodel.Presets[o.model]
	if !ok {
		return fmt.Errorf("-model %q: want one of %s", o.model, kvmodel.PresetNames())
	}
	o.kv = m
	switch o.discovery {
	case "etcd":
		if !o.chaos {
			o.defaults(map[string]string{"prefill-instances": "2", "decode-instances": "2"})
		}
		if o.hostile {
			return errors.New("-hostile attacks the HTTP bootstrap server: use it with -discovery http")
		}
	case "http":
	default:
		return fmt.Errorf("-discovery %q: want http or etcd", o.discovery)
	}
	o.pShape, o.dShape = o.pShape.Norm(), o.dShape.Norm()
	if o.compute != "fill" && o.compute != "tinyllm" {
		return fmt.Errorf("-compute %q: want fill or tinyllm", o.compute)
	}
	var err error
	if o.tinyCfg, o.tinyPT, err = parseTiny(o.tinySpec); err != nil {
		return err
	}
	// The shapes are checked before any process starts: a pair the rank
	// mapping does not support is refused in one line.
	if o.layout, err = transfer.ParsePageLayout(o.pageLayout); err != nil {
		return err
	}
	mapping := m.Mapping(o.layout)
	if o.compute == "tinyllm" {
		mapping = tinyMapping(o.tinyCfg, o.tinyPT, o.layout)
	}
	if err := o.pageSizes(mapping.PageTokens); err != nil {
		return err
	}
	if err := router.CheckTopology(mapping, o.pShape, o.dShape); err != nil {
		return fmt.Errorf("refused before starting any process: prefill (DP %d × PP %d × TP %d) → decode (PP %d × TP %d): %v",
			o.pShape.DPSize, o.pShape.PPSize, o.pShape.TPSize, o.dShape.PPSize, o.dShape.TPSize, err)
	}
	if o.compute == "tinyllm" {
		if o.chaos || o.hostile || o.discovery != "http" || o.mla {
			return errors.New("-compute tinyllm runs with HTTP discovery, without -chaos, -hostile or -mla")
		}
		o.defaults(map[string]string{"requests": "40", "concurrency": "4", "min-tokens": "16", "max-tokens": "96", "pages": "512", "abort-rate": "0.1"})
		if o.short {
			o.defaults(map[string]string{"requests": "16", "max-tokens": "64"})
		}
		if o.minTok < 1 || o.maxTok < o.minTok || o.gen < 1 {
			return errors.New("want 1 ≤ -min-tokens ≤ -max-tokens and -gen ≥ 1")
		}
	}
	if o.multiTurn {
		one := transfer.Parallel{}.Norm()
		switch {
		case o.compute != "tinyllm" || (o.wire != "vllm" && o.wire != "push"):
			return errors.New("-multi-turn is for -compute tinyllm with -wire vllm or push (it rides vLLM's kv_transfer_params)")
		case o.pShape.Norm() != one || o.dShape.Norm() != one:
			return errors.New("-multi-turn runs instances of one rank (the example keeps and fetches a turn on one rank)")
		}
	}
	if need := o.roomPages(o.maxTok); o.compute == "fill" && need > o.pages {
		// (The driver admits a request once every rank can hold it: one
		// no rank can hold would wait for good.)
		return fmt.Errorf("refused before starting any process: a %d-token request needs %d pages of %d tokens, a rank holds %d (-pages): raise -pages or lower -max-tokens",
			o.maxTok, need, min(o.prefillPT, o.decodePT), o.pages)
	}
	o.common = []string{"-model", o.model, "-pages", strconv.Itoa(o.pages), "-engine", o.engine, "-ucx-tls", o.tls, "-page-layout", o.pageLayout}
	if o.compute == "tinyllm" {
		o.common = append(o.common, tinyRankArgs(o.tinyCfg, o.tinyPT)...)
	}
	o.prefillArgs = append(append([]string{}, o.common...), "-page-tokens", strconv.Itoa(o.prefillPT))
	o.decodeArgs = append(append([]string{}, o.common...), "-page-tokens", strconv.Itoa(o.decodePT))
	if o.layerwise {
		o.prefillArgs = append(o.prefillArgs, "-layerwise", "-layer-group", strconv.Itoa(o.layerGroup))
	}
	if o.multiTurn {
		reuse := strconv.Itoa(max(o.pages/2, 16))
		o.prefillArgs = append(o.prefillArgs, "-reuse-pages", reuse)
		o.decodeArgs = append(o.decodeArgs, "-reuse-pages", reuse)
	}
	if o.digest {
		o.decodeArgs = append(o.decodeArgs, "-digest")
	}
	switch o.transfer {
	case "push":
	case "pull":
		o.decodeArgs = append(o.decodeArgs, "-pull")
	default:
		return fmt.Errorf("-transfer %q: want push or pull", o.transfer)
	}
	return nil
}

// pageSizes settles each side's tokens per page (the model's, pageTokens,
// unless given) and checks that one divides the other.
func (o *demoFlags) pageSizes(pageTokens int) error {
	for _, pt := range []*int{&o.prefillPT, &o.decodePT} {
		if *pt < 0 {
			return fmt.Errorf("page tokens %d: want ≥ 1 (or 0 for the model's)", *pt)
		}
		if *pt == 0 {
			*pt = pageTokens
		}
	}
	if err := kvlayout.PageRatio(o.prefillPT, o.decodePT); err != nil {
		return fmt.Errorf("refused before starting any process: %v", err)
	}
	// The prefill ranks send rooms in chunks of 128 pages (32 in the
	// chaos soak), and every chunk but a room's last must end on a decode
	// page.
	chunk := 128
	if o.chaos {
		chunk = chaosChunk
	}
	if r := o.decodePT / o.prefillPT; chunk%max(r, 1) != 0 {
		return fmt.Errorf("refused before starting any process: a decode page holds %d prefill pages, which does not divide the prefill ranks' chunks of %d pages", r, chunk)
	}
	return nil
}

// pagesSaid is the pages' tokens as the summaries say them.
func (o *demoFlags) pagesSaid() string {
	if o.decodePT != o.prefillPT {
		return fmt.Sprintf("%d-token prefill and %d-token decode", o.prefillPT, o.decodePT)
	}
	return fmt.Sprintf("%d-token", o.prefillPT)
}

// roomPages is how many pages a room of tokens takes on the side holding
// more of them.
func (o *demoFlags) roomPages(tokens int) int {
	pt := min(o.prefillPT, o.decodePT)
	return (tokens + pt - 1) / pt
}

// topology is the summary's one-line description of the deployment.
func (o *demoFlags) topology() string {
	pages := o.pagesSaid()
	return fmt.Sprintf("prefill %d × (DP %d × PP %d × TP %d) → decode %d × (PP %d × TP %d), %s %s pages, %s, %s discovery, %s",
		o.instances, o.pShape.DPSize, o.pShape.PPSize, o.pShape.TPSize, o.decodeInstances, o.dShape.PPSize, o.dShape.TPSize,
		pages, strings.ToUpper(o.pageLayout), o.model, o.discovery, o.transfer)
}

func (o *demoFlags) announce() {
	switch {
	case o.chaos:
		fmt.Printf("kvbridge demo -chaos: rooms of %d–%d tokens (%s layout) for %v, %d in flight, %.0f%% aborted, engine %s, seed %d\ntopology: %s\n",
			o.minTok, o.maxTok, o.model, o.chaosDuration, o.conc, 100*o.abortRate, o.engine, o.seed, o.topology())
	case o.compute == "fill":
		fmt.Printf("kvbridge demo: %d requests of %d–%d tokens (%s layout), %d in flight, %.0f%% aborted, engine %s, seed %d\ntopology: %s\n",
			o.requests, o.minTok, o.maxTok, o.model, o.conc, 100*o.abortRate, o.engine, o.seed, o.topology())
	default:
		fmt.Printf("kvbridge demo -compute tinyllm: %d requests of %d–%d-token prompts through the router, %d tokens each, %d in flight, %.0f%% aborted and retried, engine %s, seed %d\n",
			o.requests, o.minTok, o.maxTok, o.gen, o.conc, 100*o.abortRate, o.engine, o.seed)
	}
}

// security makes the run's shared secret and, with -identity, its CA; the
// cleanup removes them.
func (o *demoFlags) security() (func(), error) {
	cleanup, err := makeSecret()
	if err != nil {
		return nil, fmt.Errorf("shared secret: %w", err)
	}
	if !o.identity {
		fmt.Println("security: shared secret only (-identity=false: any holder of the secret can speak as any rank)")
		return cleanup, nil
	}
	icleanup, err := makeCA()
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("identity: %w", err)
	}
	fmt.Println("security: shared secret and per-rank identity (a CA made for this run; each rank process gets its own certificate and key)")
	return func() { icleanup(); cleanup() }, nil
}

func run(args []string) int {
	o := newDemoFlags()
	if code, ok := cli.Parse(o.fs, args); !ok {
		return code
	}
	if o.serveEtcd != "" {
		return serveEtcd(o.serveEtcd)
	}
	if err := o.settle(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 2
	}
	o.announce()
	cleanup, err := o.security()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	defer cleanup()
	switch {
	case o.compute == "tinyllm":
		topology := fmt.Sprintf("prefill %d × (DP %d × PP %d × TP %d) → decode %d × (PP %d × TP %d), %s pages, tinyllm, %s sends, "+o.wire+" wire, "+o.transfer,
			o.instances, o.pShape.DPSize, o.pShape.PPSize, o.pShape.TPSize, o.decodeInstances, o.dShape.PPSize, o.dShape.TPSize, strings.ToUpper(o.pageLayout),
			map[bool]string{false: "whole-chunk", true: fmt.Sprintf("layer-wise (%d per group)", o.layerGroup)}[o.layerwise])
		return runTiny(tinyOptions{bin: o.bin, requests: o.requests, conc: o.conc, gen: o.gen, minTok: o.minTok, maxTok: o.maxTok,
			abortRate: o.abortRate, seed: o.seed, cfg: o.tinyCfg, pageTokens: o.prefillPT, decodePT: o.decodePT, pages: o.pages, rankArgs: o.decodeArgs, prefillArgs: o.prefillArgs,
			pShape: o.pShape, dShape: o.dShape, instances: o.instances, decodeInstance: o.decodeInstances, policy: o.policy, fault: o.fault, topology: topology, wire: o.wire, multiTurn: o.multiTurn})
	case o.dpPick == "lookup":
		o.prefillArgs = append(append([]string{}, o.prefillArgs...), "-publish-dp") // a prefill-only flag
	}
	if o.chaos {
		return runChaos(chaosOptions{bin: o.bin, duration: o.chaosDuration, seed: o.seed, discovery: o.discovery, conc: o.conc,
			abortRate: o.abortRate, minTok: o.minTok, maxTok: o.maxTok, model: o.kv, modelName: o.model, pages: o.pages,
			prefillArgs: o.prefillArgs, decodeArgs: o.decodeArgs, roomPages: o.roomPages, pageTokens: o.pagesSaid(), pShape: o.pShape, dShape: o.dShape, quiet: o.chaosQuiet})
	}
	return runFill(o)
}

// fillRun is one -compute fill run: its instances, its attacker (with
// -hostile) and its requests.
type fillRun struct {
	o                 *demoFlags
	prefills, decodes []*instance
	att               *attacker
	rssStart          map[string]float64
	work              []outcome

	mu                    sync.Mutex
	done, okN, abN, failN int
	moved                 uint64
	start                 time.Time
	elapsed               time.Duration
}

// runFill starts the instances, runs the workload (under attack with
// -hostile) and prints the summary and the verdict.
func runFill(o *demoFlags) int {
	r := &fillRun{o: o, rssStart: map[string]float64{}}
	stop, err := r.startInstances()
	defer stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	prefill, decode := r.prefills[0].ranks[0], r.decodes[0].ranks[0]
	fmt.Printf("bootstrap %s · prefill %s · decode %s (%d processes)\n", prefill.boot, prefill.http, decode.http,
		len(r.decodes)*len(r.decodes[0].ranks)+len(r.prefills)*len(r.prefills[0].ranks))
	stopAttack := func() {}
	if o.hostile {
		if r.att, err = newAttacker(prefill, decode, o.kv, o.layout, o.pages, o.hostileRounds); err != nil {
			fmt.Fprintln(os.Stderr, "demo: attacker:", err)
			return 1
		}
		defer r.att.close()
		actx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { r.att.run(actx); close(done) }()
		stopAttack = func() { cancel(); <-done }
		defer stopAttack()
	}
	r.drive()
	stopAttack()
	fmt.Fprintln(os.Stderr)
	return r.summary()
}

// startInstances starts the discovery service (with -discovery etcd) and
// every prefill and decode instance; stop stops what started, even on an
// error.
func (r *fillRun) startInstances() (stop func(), err error) {
	o := r.o
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	bootOf := func(name string) string { return "" } // http: the instance's first rank serves it
	if o.discovery == "etcd" {
		etcd, err := etcdtest.Start()
		if err != nil {
			return stop, fmt.Errorf("etcd: %w", err)
		}
		stops = append(stops, etcd.Close)
		fmt.Printf("etcd %s (embedded)\n", etcd.Endpoint)
		bootOf = func(name string) string { return "etcd://" + etcd.Endpoint + "/" + name }
	}
	for k := 0; k < o.instances; k++ {
		name := fmt.Sprintf("prefill-%d", k)
		in, err := startInstance(o.bin, "prefill", name, bootOf(name), o.pShape, o.prefillArgs)
		if err != nil {
			return stop, err
		}
		stops = append(stops, in.stop)
		r.prefills = append(r.prefills, in)
	}
	for k := 0; k < o.decodeInstances; k++ {
		in, err := startInstance(o.bin, "decode", fmt.Sprintf("decode-%d", k), r.prefills[0].boot, o.dShape, o.decodeArgs)
		if err != nil {
			return stop, err
		}
		stops = append(stops, in.stop)
		r.decodes = append(r.decodes, in)
	}
	return stop, nil
}

// drive runs the workload: log-uniform lengths, a few aborts at random
// stages, -concurrency requests in flight, admitted by pages.
func (r *fillRun) drive() {
	o := r.o
	rng := rand.New(rand.NewPCG(o.seed, 7))
	stages := []string{"before", "mid", "after", "prefill"}
	r.work = make([]outcome, o.requests)
	for i := range r.work {
		// Log-uniform lengths: many short requests, some long ones.
		l := math.Exp(math.Log(float64(o.minTok)) + rng.Float64()*(math.Log(float64(o.maxTok))-math.Log(float64(o.minTok))))
		r.work[i].tokens = int(l)
		if rng.Float64() < o.abortRate {
			r.work[i].abort = stages[rng.IntN(len(stages))]
		}
	}
	r.start = time.Now()
	sem := make(chan struct{}, o.conc)
	// Admission by pages: a request starts only when every rank can hold
	// it, so requests never deadlock holding pages on one side each.
	budget := newBudget(o.pages)
	var wg sync.WaitGroup
	for i := range r.work {
		sem <- struct{}{}
		need := o.roomPages(r.work[i].tokens)
		budget.take(need)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			defer budget.give(need)
			r.request(i)
			r.tally(&r.work[i])
		}(i)
	}
	wg.Wait()
	r.elapsed = time.Since(r.start)
}

// request runs request i: the router's choice of instances and DP group,
// the decode ranks' and the prefill group's calls, its abort if any.
func (r *fillRun) request(i int) {
	o := r.o
	w := &r.work[i]
	room := uint64(i + 1)
	// The router's choice: a prefill instance and its DP group, and a
	// decode instance.
	in := r.prefills[i%len(r.prefills)]
	decodes := r.decodes[(i/len(r.prefills))%len(r.decodes)]
	group := int(room % uint64(o.pShape.DPSize))
	dreq := rankcmd.RoomRequest{Room: room, Tokens: w.tokens, Prefill: in.boot, PrefillInstance: in.name}
	switch o.dpPick {
	case "explicit":
		group = (i/len(r.prefills)*7 + 3) % o.pShape.DPSize
		dreq.PrefillDP = &group
	case "lookup":
		group = (i/len(r.prefills)*7 + 3) % o.pShape.DPSize
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
}

// tally counts a finished request and redraws the progress line.
func (r *fillRun) tally(w *outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done++
	if r.done == len(r.work)/4 && r.att != nil {
		r.rssStart["prefill"], r.rssStart["decode"] = rss(r.prefills[0].ranks[0]), rss(r.decodes[0].ranks[0])
	}
	switch {
	case judge(w) != "":
		r.failN++
	case allSucceeded(w.dec):
		r.okN++
		for _, d := range w.dec {
			r.moved += d.Bytes
		}
	default:
		r.abN++
	}
	el := time.Since(r.start).Seconds()
	fmt.Fprintf(os.Stderr, "\r%s %d/%d  ok %d  aborted %d  failed %d  %.2f GB/s ", bar(r.done, len(r.work)), r.done, len(r.work),
		r.okN, r.abN, r.failN, float64(r.moved)/el/1e9)
}

// summary prints the run's figures and returns the verdict's exit code.
func (r *fillRun) summary() int {
	var lat []float64
	verified, corrupt := 0, 0
	var problems []string
	for i := range r.work {
		w := &r.work[i]
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
	pinnedRooms, problems := pinnedAll(append(r.prefills, r.decodes...), problems)
	problems = leasesReleased(instanceURLs(r.prefills), demoLeaseBound, problems)
	if r.att != nil {
		problems = append(problems, r.att.report(r.rssStart)...)
	}
	sort.Float64s(lat)
	fmt.Printf("\n%-26s %s\n", "topology", r.o.topology())
	fmt.Printf("%-26s %v\n", "requests", len(r.work))
	fmt.Printf("%-26s %d\n", "succeeded", r.okN)
	fmt.Printf("%-26s %d\n", "aborted", r.abN)
	fmt.Printf("%-26s %d\n", "failed", r.failN)
	fmt.Printf("%-26s %.2f GB\n", "bytes moved", float64(r.moved)/1e9)
	fmt.Printf("%-26s %.2f GB/s over %.1f s\n", "throughput", float64(r.moved)/r.elapsed.Seconds()/1e9, r.elapsed.Seconds())
	fmt.Printf("%-26s %.2f ms / %.2f ms\n", "latency p50 / p99", pct(lat, 0.50), pct(lat, 0.99))
	r.phases()
	var warm []string
	for _, in := range append(r.prefills, r.decodes...) {
		for _, p := range in.ranks {
			warm = append(warm, fmt.Sprintf("%s %v", p.name, p.warmup.Round(time.Millisecond)))
		}
	}
	fmt.Printf("%-26s %s (before the first request, not in any latency)\n", "memory warm-up", strings.Join(warm, ", "))
	fmt.Printf("%-26s %v\n", "rooms pinned", pinnedRooms)
	fmt.Printf("%-26s %d (corrupt %d)\n", "pages verified", verified, corrupt)
	if r.o.digest {
		checked, bad, err := digestCounts(r.decodes)
		if err != nil {
			problems = append(problems, "reading the digest counters: "+err.Error())
		}
		if bad != 0 {
			problems = append(problems, fmt.Sprintf("%v notifications did not match their digest", bad))
		}
		if checked == 0 && r.okN > 0 {
			problems = append(problems, "-digest: no page was checked by digest")
		}
		fmt.Printf("%-26s %v pages checked, %v mismatches\n", "digest (CRC-32C)", checked, bad)
	}
	return verdict(problems, 0, "", logs, "OK: every request succeeded or was aborted cleanly, every head of every page verified, nothing pinned.")
}

// phases prints where the time goes, per phase (succeeded requests;
// decode: the slowest rank, prefill: the slowest rank of the group).
func (r *fillRun) phases() {
	phase := func(side string, get func(w *outcome) []rankcmd.RoomResult, name string) {
		var v []float64
		for i := range r.work {
			w := &r.work[i]
			if !allSucceeded(w.dec) {
				continue
			}
			slowest := 0.0
			for _, res := range get(w) {
				slowest = max(slowest, res.PhasesMS[name])
			}
			v = append(v, slowest)
		}
		sort.Float64s(v)
		fmt.Printf("  %-24s %.2f ms / %.2f ms\n", side+" "+name, pct(v, 0.50), pct(v, 0.99))
	}
	dec := func(w *outcome) []rankcmd.RoomResult { return w.dec }
	pre := func(w *outcome) []rankcmd.RoomResult { return w.pre }
	for _, name := range []string{"pages", "transfer"} {
		phase("decode", dec, name)
	}
	for _, name := range []string{"pages", "fill", "ready", "data"} {
		phase("prefill", pre, name)
	}
	phase("decode", dec, "verify")
}
