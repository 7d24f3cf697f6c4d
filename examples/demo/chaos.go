package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/examples/internal/rankcmd"
	"github.com/kvbridge/kvbridge/internal/discovery"
	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/testnet"
	"github.com/kvbridge/kvbridge/transfer"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// The chaos mode (-chaos): the example ranks under the demo's real traffic
// while a seeded injector, one fault at a time, SIGKILLs a prefill rank, the
// decode rank, or both at once (the decode rank restarted first, so its
// first rooms look up a record still naming the dead prefill process), and
// restarts it on a new port (a pod restart: new control endpoint, new HTTP
// port, while the old record's lease still names the dead process);
// SIGSTOPs a rank for longer than the heartbeat bound and SIGCONTs it;
// restarts the bootstrap server (HTTP discovery: hosted by this driver, so
// the ranks' records are lost with it) or etcd (etcd discovery: its own
// process, SIGKILLed and started again on the same data directory and
// ports). Every kind of fault runs at least once per round, in a shuffled
// order each cycle. The ranks run with short timings (chaosEnv,
// chaosFlags) so a round is quick.
//
// The round fails unless:
//   - no page is corrupt (every head of every page of every room that
//     succeeded is checked by the decode rank);
//   - no room on any rank outlives its deadline plus chaosDeadlineSlack:
//     every live rank's kvbridge_rooms_past_deadline is 0 at every sample,
//     and every room whose POST is in flight is terminal or gone on every
//     live rank once chaosRoomBound has passed since its POST (the ranks'
//     bootstrap, waiting and stall deadlines, the longest pause, and the
//     slack); at the end no rank holds a live room or knows any room;
//   - no room fails outside a fault's window (from the injection until the
//     survivors served a room again, plus chaosGrace), every room's POSTs
//     return (a room that reaches its POST's timeout has hung), and the
//     rooms that fail inside a window fail cleanly (Failed with a reason,
//     or a POST broken by the kill of its rank: one to a rank never killed
//     is a problem);
//   - after each fault the survivors and the restarted rank serve a new
//     room byte-exact within chaosRecoveryBound of the restart (or resume);
//     after a restart of the bootstrap server or etcd every prefill rank's
//     record names its live endpoint within chaosRecordBound;
//   - every rank process's RSS at the end is within chaosRSSSlack of its
//     RSS at the start of its steady state (the initial ranks: once the
//     warm-up rooms succeeded; a restarted rank: chaosRSSSettle after its
//     restart, compared only if it then lived chaosRSSSettle more).

// The ranks' timings in a chaos round (KVBRIDGE_* variables and flags).
const (
	// A heartbeat bound of 1 s: make test once saw a live, unfaulted
	// prefill rank declared unreachable under 400 ms (200 ms × 2) while
	// the race-built checkers held the other core.
	chaosHeartbeat     = 250 * time.Millisecond
	chaosMaxMisses     = 4
	chaosSweep         = 100 * time.Millisecond
	chaosRegisterRetry = 100 * time.Millisecond
	chaosBootTimeout   = 4 * time.Second
	chaosWaitTimeout   = 4 * time.Second
	chaosStallTimeout  = 2 * time.Second
	chaosQuarantine    = 4 * time.Second
	chaosPending       = 4 * time.Second
	chaosTombstoneTTL  = 30 * time.Second
	chaosLease         = 2 * time.Second // bootstrap server and etcd leases
)

// The faults' sizes and the checks' bounds.
const (
	chaosHeartbeatBound = chaosHeartbeat * chaosMaxMisses
	chaosPauseMin       = 2 * chaosHeartbeatBound // every pause outlasts the heartbeat bound
	chaosPauseMax       = 5 * time.Second         // past the stall, bootstrap and waiting deadlines: a resumed rank settles rooms its peers failed
	chaosDownMax        = time.Second             // a killed rank, the bootstrap server or etcd stays down up to this long
	// chaosRecoveryBound: a restarted rank's peers reach it through the
	// old record's lease, three unanswered REGISTERs and a lookup, or the
	// heartbeat bound; plus scheduling on a busy 2-core machine.
	chaosRecoveryBound = 10 * time.Second
	chaosRecordBound   = chaosLease + 3*time.Second
	chaosDeadlineSlack = 3 * time.Second
	chaosRoomBound     = chaosBootTimeout + chaosWaitTimeout + chaosStallTimeout + chaosPauseMax + chaosDeadlineSlack
	chaosPostTimeout   = chaosRoomBound + 10*time.Second // the POSTs' timeout_ms: past chaosRoomBound, so the check sees a room the ranks did not end
	chaosGrace         = time.Second
	chaosRSSSettle     = 3 * time.Second
	chaosRSSSlackMiB   = 48.0
	chaosRSSSlackFrac  = 0.20
	chaosWarmRooms     = 10
	chaosChunk         = 32 // pages per Send: rooms of up to 4 chunks, so faults land between chunks
)

var chaosSlackText = fmt.Sprintf("%.0f%% + %.0f MiB", 100*chaosRSSSlackFrac, chaosRSSSlackMiB)

func chaosEnv() map[string]string {
	return map[string]string{
		"KVBRIDGE_HEARTBEAT":         chaosHeartbeat.String(),
		"KVBRIDGE_BOOTSTRAP_TIMEOUT": chaosBootTimeout.String(),
		"KVBRIDGE_WAITING_TIMEOUT":   chaosWaitTimeout.String(),
		"KVBRIDGE_STALL_TIMEOUT":     chaosStallTimeout.String(),
		"KVBRIDGE_QUARANTINE":        chaosQuarantine.String(),
		"KVBRIDGE_TOMBSTONE_TTL":     chaosTombstoneTTL.String(),
		"KVBRIDGE_ETCD_LEASE_TTL":    chaosLease.String(),
	}
}

func chaosFlags() []string {
	return []string{"-max-misses", strconv.Itoa(chaosMaxMisses), "-sweep-interval", chaosSweep.String(),
		"-register-retry", chaosRegisterRetry.String(), "-pending-timeout", chaosPending.String(), "-pprof"}
}

type chaosOptions struct {
	bin            string
	duration       time.Duration
	seed           uint64
	discovery      string
	conc           int
	abortRate      float64
	minTok, maxTok int
	model          kvmodel.Model
	modelName      string
	pages          int
	prefillArgs    []string // a prefill rank's flags
	decodeArgs     []string // a decode rank's flags
	roomPages      func(tokens int) int
	pageTokens     string // the pages' tokens, as the summary says them
	pShape, dShape transfer.Parallel
	// quiet is the traffic without faults after them, before the spared
	// prefill rank's memory is compared with its steady start.
	quiet time.Duration
}

// fault is one injected fault and what followed it.
type fault struct {
	n         int
	kind      string // kill, pause, restart-bootstrap, restart-etcd
	role      string // the rank's role (kill, pause)
	rank      int
	victims   []*proc // the processes killed or paused
	start     time.Time
	recovered time.Time // restarted, resumed
	served    time.Time // the first probe room that succeeded after it (zero: none)
	note      string
}

func (f *fault) label() string {
	if f.role != "" {
		return fmt.Sprintf("%s %s", f.kind, f.role)
	}
	return f.kind
}

// window is the time the fault can explain a room's failure in.
func (f *fault) window(now time.Time) (time.Time, time.Time) {
	end := f.served
	if end.IsZero() {
		end = now
	}
	return f.start, end.Add(chaosGrace)
}

// croom is one room the chaos driver ran.
type croom struct {
	id         uint64
	tokens     int
	abort      string
	probe      bool
	start, end time.Time
	ranks      []*proc // decode ranks, then prefill ranks
	ndec       int
	res        []rankcmd.RoomResult
	errs       []error
}

// cluster is the chaos round's processes, discovery and bookkeeping.
type cluster struct {
	o        chaosOptions
	etcd     *proc // bin/demo -serve-etcd
	etcdDir  string
	boot     *bootstrap.Server
	bootAddr string
	bootURL  string
	client   *http.Client

	mu      sync.Mutex
	prefill *instance
	decode  *instance
	paused  map[*proc]bool
	killed  map[*proc]bool
	born    map[*proc]time.Time // when a process was (re)started
	rssBase map[*proc]float64
	// sparedMem: the spared prefill rank's memory after the quiet phase.
	sparedMem  string
	sparedHeap string // the spared rank's heap profiles at its steady start and at the end
	sparedMaps int    // its mappings of UCX shared-memory segments at its steady start
	inflight   map[uint64]*croom
	rooms      []*croom
	faults     []*fault
	problems   []string
	nextRoom   atomic.Uint64
	samples    int
	t0         time.Time
	once       map[string]bool // problems reported once per key
	okN        int             // rooms succeeded (probes included), for the progress line
	failN      int
	shown      time.Time
	counters   []string // each rank's counters at the end
}

func (c *cluster) problem(format string, a ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.problems = append(c.problems, fmt.Sprintf(format, a...))
}

// problemOnce reports a problem the sampler may see again and again once
// per key.
func (c *cluster) problemOnce(key, format string, a ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.once[key] {
		return
	}
	c.once[key] = true
	c.problems = append(c.problems, fmt.Sprintf(format, a...))
}

func jsonDecode(resp *http.Response, v any) error { return json.NewDecoder(resp.Body).Decode(v) }

func (c *cluster) ranks() []*proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append(append([]*proc{}, c.prefill.ranks...), c.decode.ranks...)
}

func (c *cluster) startBoot(addr string) error {
	srv, err := bootstrap.NewServer(bootstrap.ServerConfig{Token: token, LeaseTTL: chaosLease})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err = srv.Start(addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // the old listener's port, until it is free again
	}
	if err != nil {
		return err
	}
	c.boot, c.bootURL = srv, srv.URL()
	c.bootAddr = strings.TrimPrefix(c.bootURL, "http://")
	return nil
}

// startEtcd starts the round's etcd in its own process (bin/demo
// -serve-etcd) on a fresh data directory and free loopback ports.
func (c *cluster) startEtcd() error {
	dir, err := os.MkdirTemp("", "kvbridge-chaos-etcd-*")
	if err != nil {
		return err
	}
	c.etcdDir = dir
	// Ports outside the kernel's ephemeral range: etcd is killed and
	// started again on them, and meanwhile another socket could be given
	// one of the ephemeral range as its own.
	var ports []string
	for range 2 {
		p, err := testnet.Port()
		if err != nil {
			return err
		}
		ports = append(ports, net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	}
	c.etcd, err = start(c.o.bin, "demo", "-serve-etcd", dir+","+ports[0]+","+ports[1])
	return err
}

// serveEtcd runs one etcd member in this process until SIGTERM (the chaos
// soak's etcd; spec is dir,client host:port,peer host:port). It prints
// "etcd ready endpoint=host:port" once it serves.
func serveEtcd(spec string) int {
	parts := strings.Split(spec, ",")
	if len(parts) != 3 {
		fmt.Fprintln(os.Stderr, "demo: -serve-etcd wants dir,client-host:port,peer-host:port")
		return 2
	}
	cu, pu := url.URL{Scheme: "http", Host: parts[1]}, url.URL{Scheme: "http", Host: parts[2]}
	cfg := embed.NewConfig()
	cfg.Dir = parts[0]
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo: etcd:", err)
		return 1
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		fmt.Fprintln(os.Stderr, "demo: etcd not ready within 60 s")
		return 1
	}
	fmt.Printf("etcd ready endpoint=%s\n", parts[1])
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "demo: etcd:", err)
		return 1
	}
	e.Close()
	return 0
}

func runChaos(o chaosOptions) int {
	for k, v := range chaosEnv() { // inherited by every rank process
		os.Setenv(k, v)
	}
	c := &cluster{o: o, paused: map[*proc]bool{}, killed: map[*proc]bool{}, born: map[*proc]time.Time{}, rssBase: map[*proc]float64{},
		inflight: map[uint64]*croom{}, once: map[string]bool{}, t0: time.Now(), client: &http.Client{Timeout: chaosPostTimeout + 20*time.Second}}
	httpClient = c.client
	var bootFor func(name string) string
	if o.discovery == "etcd" {
		if err := c.startEtcd(); err != nil {
			fmt.Fprintln(os.Stderr, "demo: etcd:", err)
			return 1
		}
		defer func() {
			c.etcd.cmd.Process.Signal(syscall.SIGKILL) // its data is thrown away
			c.etcd.cmd.Wait()
			os.RemoveAll(c.etcdDir)
		}()
		bootFor = func(name string) string { return "etcd://" + c.etcd.endpoint + "/" + name }
		fmt.Printf("etcd %s (its own process; SIGKILLed and started again on the same data and ports)\n", c.etcd.endpoint)
	} else {
		// A port outside the ephemeral range: the server is restarted on it.
		port, err := testnet.Port()
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo: bootstrap server:", err)
			return 1
		}
		if err := c.startBoot(net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err != nil {
			fmt.Fprintln(os.Stderr, "demo: bootstrap server:", err)
			return 1
		}
		defer func() { c.boot.Close(context.Background()) }()
		bootFor = func(string) string { return c.bootURL }
		fmt.Printf("bootstrap server %s (in the driver; restarted on the same port, its records lost)\n", c.bootURL)
	}
	prefillArgs := append(append([]string{}, o.prefillArgs...), chaosFlags()...)
	decodeArgs := append(append([]string{}, o.decodeArgs...), chaosFlags()...)
	var err error
	if c.prefill, err = startInstance(o.bin, "prefill", "prefill-0", bootFor("prefill-0"), o.pShape, prefillArgs); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	defer func() { c.prefill.stop() }()
	if c.decode, err = startInstance(o.bin, "decode", "decode-0", bootFor("prefill-0"), o.dShape, decodeArgs); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	defer func() { c.decode.stop() }()
	now := time.Now()
	for _, p := range c.ranks() {
		c.born[p] = now
	}
	fmt.Printf("%d rank processes; heartbeat %v × %d, sweep %v, deadlines bootstrap %v, waiting %v, stall %v, quarantine %v, leases %v\n",
		len(c.ranks()), chaosHeartbeat, chaosMaxMisses, chaosSweep, chaosBootTimeout, chaosWaitTimeout, chaosStallTimeout, chaosQuarantine, chaosLease)

	start := time.Now()
	ctx, stopWork := context.WithCancel(context.Background())
	var work sync.WaitGroup
	budget := newBudget(o.pages)
	rng := rand.New(rand.NewPCG(o.seed, 11))
	var rngMu sync.Mutex
	for w := 0; w < o.conc; w++ {
		work.Add(1)
		go func() {
			defer work.Done()
			for ctx.Err() == nil {
				rngMu.Lock()
				l := math.Exp(math.Log(float64(o.minTok)) + rng.Float64()*(math.Log(float64(o.maxTok))-math.Log(float64(o.minTok))))
				abort := ""
				if rng.Float64() < o.abortRate {
					abort = []string{"before", "mid", "after", "prefill"}[rng.IntN(4)]
				}
				rngMu.Unlock()
				r := &croom{tokens: int(l), abort: abort}
				need := o.roomPages(r.tokens)
				budget.take(need)
				c.runRoom(r)
				budget.give(need)
			}
		}()
	}
	sampleCtx, stopSampling := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() { c.sampler(sampleCtx); close(sampled) }()

	// Steady state: the warm-up rooms succeeded; then the faults.
	warmBy := time.Now().Add(30 * time.Second)
	for c.succeeded() < chaosWarmRooms && time.Now().Before(warmBy) {
		time.Sleep(20 * time.Millisecond)
	}
	steady := time.Now()
	for _, p := range c.ranks() {
		c.mu.Lock()
		c.rssBase[p] = rss(p)
		c.mu.Unlock()
	}
	if p := c.spared(); p != nil {
		c.sparedHeap = heapProfile(p, "start")
		c.sparedMaps = shmMaps(p)
	}
	frng := rand.New(rand.NewPCG(o.seed, 13))
	kinds := []string{"kill prefill", "kill decode", "kill prefill+decode", "pause prefill", "pause decode", "restart-bootstrap"}
	if o.discovery == "etcd" {
		kinds[5] = "restart-etcd"
	}
	fatal := false
	for cycle := 0; !fatal && (cycle == 0 || time.Since(start) < o.duration); cycle++ {
		order := append([]string{}, kinds...)
		frng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, k := range order {
			gap := time.Duration(300+frng.IntN(1200)) * time.Millisecond
			time.Sleep(gap) // traffic without a fault (random fault timing, seeded)
			if err := c.inject(k, frng); err != nil {
				c.problem("%s: %v", k, err)
				fatal = true
				break
			}
			if cycle > 0 && time.Since(start) >= o.duration {
				break
			}
		}
	}
	// Traffic without faults for the quiet phase: the spared rank's memory
	// must come back to its steady start (tombstones past their TTL,
	// buffers, goroutines of dead peers all gone), then drain.
	faultsEnded := time.Now()
	time.Sleep(max(o.quiet, time.Second))
	c.checkSpared(time.Since(faultsEnded))
	stopWork()
	work.Wait()
	elapsed := time.Since(start)
	stopSampling()
	<-sampled
	fmt.Fprintln(os.Stderr)
	c.finalChecks()
	return c.report(elapsed, time.Since(steady))
}

// checkSpared compares the spared prefill rank's RSS (never killed nor
// paused: its memory is the one a long-lived rank keeps) after the quiet
// phase with its steady start.
func (c *cluster) checkSpared(quiet time.Duration) {
	p := c.spared()
	if p == nil {
		return
	}
	c.mu.Lock()
	base := c.rssBase[p]
	c.mu.Unlock()
	end := rss(p)
	if c.sparedHeap != "" {
		c.sparedHeap += " → " + heapProfile(p, "end")
	}
	maps := shmMaps(p)
	c.sparedMem = fmt.Sprintf("%s (never faulted) %.0f→%.0f MiB, %d→%d shared-memory mappings, after %.0f s without faults (heap profiles: %s)",
		p.name, base, end, c.sparedMaps, maps, quiet.Seconds(), c.sparedHeap)
	if maps > c.sparedMaps+chaosMapSlack {
		c.problem("%s (pid %d, never faulted): %d mappings of UCX shared-memory segments %.0f s after the faults stopped, %d at its steady start: dead peers' segments are still mapped",
			p.name, p.cmd.Process.Pid, maps, quiet.Seconds(), c.sparedMaps)
	}
	if end > base*(1+chaosRSSSlackFrac)+chaosRSSSlackMiB {
		c.problem("%s (pid %d, never faulted): RSS %.0f MiB %.0f s after the faults stopped, %.0f MiB at its steady start (slack %s)",
			p.name, p.cmd.Process.Pid, end, quiet.Seconds(), base, chaosSlackText)
	}
}

// chaosMapSlack: the spared rank's shared-memory mappings may exceed their
// steady-start count by this (a peer's endpoint and segments being set up
// at the moment of the count); a dead peer's stayed mapped, two each.
const chaosMapSlack = 2

// shmMaps counts a process's mappings of UCX shared-memory segments (-1:
// unreadable).
func shmMaps(p *proc) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", p.cmd.Process.Pid))
	if err != nil {
		return -1
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "ucx_shm") || strings.Contains(l, "SYSV") {
			n++
		}
	}
	return n
}

// heapProfile saves a rank's heap profile (GET /debug/pprof/heap, after a
// GC) in the temporary directory and returns its path ("" on failure).
func heapProfile(p *proc, when string) string {
	req, err := http.NewRequest(http.MethodGet, p.http+"/debug/pprof/heap?gc=1", nil)
	if err != nil {
		return ""
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := httpClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	f, err := os.CreateTemp("", fmt.Sprintf("kvbridge-chaos-heap-%d-%s-*.pb.gz", p.cmd.Process.Pid, when))
	if err != nil {
		return ""
	}
	defer f.Close()
	io.Copy(f, resp.Body)
	return f.Name()
}

var httpClient = http.DefaultClient

func (c *cluster) succeeded() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.okN
}

// runRoom runs one room on the current processes: every decode rank, then
// every prefill rank (DP group 0), as the demo does.
func (c *cluster) runRoom(r *croom) {
	r.id = c.nextRoom.Add(1)
	c.mu.Lock()
	r.ranks = append(append([]*proc{}, c.decode.ranks...), c.prefill.group(0)...)
	r.ndec = len(c.decode.ranks)
	r.start = time.Now()
	c.inflight[r.id] = r
	c.mu.Unlock()
	r.res, r.errs = make([]rankcmd.RoomResult, len(r.ranks)), make([]error, len(r.ranks))
	dreq := rankcmd.RoomRequest{Room: r.id, Tokens: r.tokens, Prefill: c.prefill.boot, PrefillInstance: c.prefill.name,
		TimeoutMS: int(chaosPostTimeout.Milliseconds())}
	preq := rankcmd.RoomRequest{Room: r.id, Tokens: r.tokens, TimeoutMS: dreq.TimeoutMS, Chunk: chaosChunk}
	switch r.abort {
	case "before", "mid", "after":
		dreq.AbortAt = r.abort
	case "prefill":
		preq.AbortAfterChunks = 1
	}
	var wg sync.WaitGroup
	for i, p := range r.ranks {
		if i == r.ndec && r.abort == "before" {
			time.Sleep(5 * time.Millisecond) // let the abort land before the senders exist
		}
		body := dreq
		if i >= r.ndec {
			body = preq
		}
		wg.Add(1)
		go func() { defer wg.Done(); r.res[i], r.errs[i] = post(p.http, body) }()
	}
	wg.Wait()
	c.mu.Lock()
	r.end = time.Now()
	delete(c.inflight, r.id)
	c.rooms = append(c.rooms, r)
	switch outcomeOf(r) {
	case "succeeded":
		c.okN++
	case "failed":
		c.failN++
	}
	line := ""
	if time.Since(c.shown) > 250*time.Millisecond {
		c.shown = time.Now()
		line = fmt.Sprintf("\rrooms %d  succeeded %d  failed %d  faults %d ", len(c.rooms), c.okN, c.failN, len(c.faults))
	}
	c.mu.Unlock()
	fmt.Fprint(os.Stderr, line)
}

// outcomeOf is succeeded, aborted or failed.
func outcomeOf(r *croom) string {
	dec, pre := r.res[:r.ndec], r.res[r.ndec:]
	if errors.Join(r.errs...) == nil && allSucceeded(dec) && allSucceeded(pre) {
		return "succeeded"
	}
	if r.abort != "" && errors.Join(r.errs...) == nil {
		clean := true
		for _, x := range r.res {
			clean = clean && x.Error == "" && (x.Status == "Success" || x.Status == "Failed")
		}
		if clean {
			return "aborted"
		}
	}
	return "failed"
}

var (
	digits   = regexp.MustCompile(`[0-9]+`)
	urlsLike = regexp.MustCompile(`(tcp|http)://[^ ,;)"]+`)
)

// reasonOf is why a room failed, with numbers and addresses blanked so
// reasons group.
func reasonOf(r *croom) string {
	norm := func(s string) string {
		s = urlsLike.ReplaceAllString(s, "ADDR")
		s = digits.ReplaceAllString(s, "N")
		if len(s) > 200 {
			s = s[:200] + "…"
		}
		return s
	}
	role := func(i int) string {
		if i < r.ndec {
			return "decode"
		}
		return "prefill"
	}
	for i, err := range r.errs {
		if err != nil {
			msg := err.Error()
			for _, k := range []string{"connection refused", "EOF", "connection reset", "Client.Timeout"} {
				if strings.Contains(msg, k) {
					msg = k
				}
			}
			return fmt.Sprintf("%s POST: %s", role(i), norm(msg))
		}
	}
	for i, x := range r.res {
		if x.Error != "" {
			return fmt.Sprintf("%s: %s", role(i), norm(x.Error))
		}
	}
	for i, x := range r.res {
		if x.Status != "Success" {
			return fmt.Sprintf("%s %s: %s", role(i), x.Status, norm(x.Reason))
		}
	}
	return "?"
}

// inject runs one fault and waits until the survivors serve a room again.
// victim picks the rank of an instance a fault hits: any but the spared
// one (the prefill instance's first rank, when it has others), whose
// memory is checked after the quiet phase.
func (c *cluster) victim(in *instance, rng *rand.Rand) int {
	if in == c.prefill && len(in.ranks) > 1 {
		return 1 + rng.IntN(len(in.ranks)-1)
	}
	return rng.IntN(len(in.ranks))
}

// spared is the prefill rank no fault hits (nil with one prefill rank).
func (c *cluster) spared() *proc {
	if len(c.prefill.ranks) > 1 {
		return c.prefill.ranks[0]
	}
	return nil
}

func (c *cluster) inject(kind string, rng *rand.Rand) error {
	f := &fault{kind: kind, start: time.Now()}
	if role, ok := strings.CutPrefix(kind, "kill "); ok {
		f.kind, f.role = "kill", role
	} else if role, ok := strings.CutPrefix(kind, "pause "); ok {
		f.kind, f.role = "pause", role
	}
	c.mu.Lock()
	f.n = len(c.faults) + 1
	c.faults = append(c.faults, f)
	in := c.prefill
	if f.role == "decode" {
		in = c.decode
	}
	var p *proc
	if f.role != "" {
		f.rank = c.victim(in, rng)
		p = in.ranks[f.rank]
		f.victims = []*proc{p}
	}
	var pair *proc // kill prefill+decode: the decode rank killed with the prefill rank
	if f.role == "prefill+decode" {
		in = c.prefill
		f.rank = c.victim(in, rng)
		p, pair = in.ranks[f.rank], c.decode.ranks[0]
		f.victims = []*proc{p, pair}
	}
	c.mu.Unlock()
	down := time.Duration(rng.IntN(int(chaosDownMax/time.Millisecond))) * time.Millisecond
	switch f.kind {
	case "kill":
		c.mu.Lock()
		for _, v := range f.victims {
			c.killed[v] = true
		}
		c.mu.Unlock()
		for _, v := range f.victims {
			v.cmd.Process.Signal(syscall.SIGKILL)
		}
		for _, v := range f.victims {
			v.cmd.Wait()
		}
		time.Sleep(down)
		if pair != nil {
			// The decode rank first: its first rooms look the prefill rank
			// up while its record still names the dead process (a pod
			// restarted on a new port), until the prefill rank's new process takes the record
			// once the lease lapsed.
			np, err := c.restart(c.decode, 0, pair)
			if err != nil {
				return err
			}
			f.note = fmt.Sprintf("decode pid %d %s → pid %d %s, then ", pair.cmd.Process.Pid, pair.endpoint, np.cmd.Process.Pid, np.endpoint)
		}
		np, err := c.restart(in, f.rank, p)
		if err != nil {
			return err
		}
		f.recovered = time.Now()
		f.note += fmt.Sprintf("pid %d %s → pid %d %s (down %v)", p.cmd.Process.Pid, p.endpoint, np.cmd.Process.Pid, np.endpoint, down)
	case "pause":
		pause := chaosPauseMin + time.Duration(rng.Int64N(int64(chaosPauseMax-chaosPauseMin)))
		c.mu.Lock()
		c.paused[p] = true
		c.mu.Unlock()
		p.cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(pause)
		p.cmd.Process.Signal(syscall.SIGCONT)
		c.mu.Lock()
		delete(c.paused, p)
		c.mu.Unlock()
		f.recovered = time.Now()
		f.note = fmt.Sprintf("pid %d stopped %v (heartbeat bound %v)", p.cmd.Process.Pid, pause.Round(time.Millisecond), chaosHeartbeatBound)
	case "restart-bootstrap":
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c.boot.Close(ctx)
		cancel()
		time.Sleep(down)
		if err := c.startBoot(c.bootAddr); err != nil {
			return fmt.Errorf("restarting the bootstrap server on %s: %w", c.bootAddr, err)
		}
		f.recovered = time.Now()
		f.note = fmt.Sprintf("%s down %v", c.bootURL, down)
	case "restart-etcd":
		old := c.etcd
		old.cmd.Process.Signal(syscall.SIGKILL)
		old.cmd.Wait()
		time.Sleep(down)
		t := time.Now()
		np, err := start(c.o.bin, "demo", old.args...)
		if err != nil {
			return fmt.Errorf("restarting etcd: %w", err)
		}
		c.etcd = np
		f.recovered = time.Now()
		f.note = fmt.Sprintf("pid %d → pid %d on %s, down %v, ready in %v", old.cmd.Process.Pid, np.cmd.Process.Pid, np.endpoint, down,
			f.recovered.Sub(t).Round(time.Millisecond))
	}
	if f.kind == "restart-bootstrap" || f.kind == "restart-etcd" {
		if took, err := c.recordsBack(); err != nil {
			c.problem("fault %d (%s): %v", f.n, f.label(), err)
		} else {
			f.note += fmt.Sprintf(", records back in %v", took.Round(time.Millisecond))
		}
	}
	// The survivors (and the restarted rank) serve a new room.
	for attempt := 1; ; attempt++ {
		r := &croom{tokens: c.o.minTok, probe: true}
		c.runRoom(r)
		if outcomeOf(r) == "succeeded" {
			f.served = r.end
			break
		}
		if time.Since(f.recovered) > chaosRecoveryBound {
			c.problem("fault %d (%s %s): no room succeeded within %v of the recovery (%d probes; last: %s)",
				f.n, f.label(), f.note, chaosRecoveryBound, attempt, reasonOf(r))
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	rec := "none"
	if !f.served.IsZero() {
		rec = f.served.Sub(f.recovered).Round(time.Millisecond).String()
	}
	who := ""
	if f.role != "" {
		who = fmt.Sprintf(" rank %d", f.rank)
	}
	fmt.Fprintf(os.Stderr, "\n")
	fmt.Printf("fault %d at +%.1fs: %s%s (%s); a new room succeeded %s after\n", f.n, f.start.Sub(c.t0).Seconds(), f.label(), who, f.note, rec)
	return nil
}

// restart starts a killed rank's process again (new ports: the control
// endpoint and HTTP address are bound afresh) and puts it in its place.
func (c *cluster) restart(in *instance, rank int, old *proc) (*proc, error) {
	np, err := start(c.o.bin, old.name, old.args...)
	if err != nil {
		return nil, fmt.Errorf("restarting %s rank %d: %w", old.name, rank, err)
	}
	c.mu.Lock()
	in.ranks[rank] = np
	c.born[np] = time.Now()
	c.mu.Unlock()
	if np.endpoint == old.endpoint {
		return nil, fmt.Errorf("%s rank %d came back on its old endpoint %s", old.name, rank, old.endpoint)
	}
	return np, nil
}

// recordsBack waits until discovery names every prefill rank's live
// endpoint again.
func (c *cluster) recordsBack() (time.Duration, error) {
	t0 := time.Now()
	d, err := discovery.Dial(c.prefill.boot, discovery.DialOptions{Token: token})
	if err != nil {
		return 0, err
	}
	defer d.Close()
	c.mu.Lock()
	ranks := append([]*proc{}, c.prefill.ranks...)
	par := append([]transfer.Parallel{}, c.prefill.par...)
	c.mu.Unlock()
	for i, p := range ranks {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			info, err := d.Rank(ctx, par[i].DPRank, par[i].TPRank, par[i].PPRank)
			cancel()
			if err == nil && info.Endpoint == p.endpoint {
				break
			}
			if time.Since(t0) > chaosRecordBound {
				return 0, fmt.Errorf("prefill rank %d's record does not name %s within %v (got %q, %v)", i, p.endpoint, chaosRecordBound, info.Endpoint, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return time.Since(t0), nil
}

// sampler reads every live rank's metrics and in-flight rooms until ctx
// ends.
func (c *cluster) sampler(ctx context.Context) {
	get := &http.Client{Timeout: time.Second}
	for ctx.Err() == nil {
		c.mu.Lock()
		ranks := append(append([]*proc{}, c.prefill.ranks...), c.decode.ranks...)
		paused := map[*proc]bool{}
		for p := range c.paused {
			paused[p] = true
		}
		var old []*croom
		for _, r := range c.inflight {
			if time.Since(r.start) > chaosRoomBound {
				old = append(old, r)
			}
		}
		c.samples++
		c.mu.Unlock()
		for _, p := range ranks {
			if paused[p] {
				continue
			}
			c.mu.Lock()
			_, based := c.rssBase[p]
			settle := !based && time.Since(c.born[p]) > chaosRSSSettle
			c.mu.Unlock()
			if settle {
				v := rss(p)
				c.mu.Lock()
				c.rssBase[p] = v
				c.mu.Unlock()
			}
			_, over, err := pinnedWith(get, p.http)
			if err == nil && over > 0 {
				c.problemOnce(fmt.Sprint("overdue ", p.cmd.Process.Pid), "%s (pid %d): kvbridge_rooms_past_deadline %v at +%.1fs", p.name, p.cmd.Process.Pid, over, time.Since(c.t0).Seconds())
			}
		}
		for _, r := range old {
			for _, p := range r.ranks {
				if paused[p] {
					continue
				}
				st, ok := roomStatus(get, p.http, r.id)
				if ok && st != "Success" && st != "Failed" {
					c.problemOnce(fmt.Sprint("late ", r.id, p.cmd.Process.Pid), "room %d is %s on %s (pid %d) %v after its POST (bound %v: deadlines %v + %v + %v, a pause %v, slack %v)",
						r.id, st, p.name, p.cmd.Process.Pid, time.Since(r.start).Round(time.Millisecond), chaosRoomBound,
						chaosBootTimeout, chaosWaitTimeout, chaosStallTimeout, chaosPauseMax, chaosDeadlineSlack)
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// roomStatus is GET /v1/room?room=N on one rank (ok false: not known or
// not answered).
func roomStatus(cl *http.Client, base string, room uint64) (string, bool) {
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/v1/room?room=%d", base, room), nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := cl.Do(req)
	if err != nil {
		return "", false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", false
	}
	var st rankcmd.RoomState
	if err := jsonDecode(resp, &st); err != nil {
		return "", false
	}
	return st.Status, true
}

// finalChecks: every rank alive, no live room, no room known.
func (c *cluster) finalChecks() {
	get := &http.Client{Timeout: 2 * time.Second}
	c.mu.Lock()
	rooms := append([]*croom{}, c.rooms...)
	c.mu.Unlock()
	var urls []string
	for _, p := range c.ranks() {
		if p.cmd.ProcessState == nil {
			urls = append(urls, p.http)
		}
	}
	// Pulled pages: released by a drained READ_DONE, or by the
	// quarantine past the lease after the room settled (its stall).
	for _, pr := range leasesReleased(urls, chaosStallTimeout+chaosStallTimeout/2+chaosQuarantine+chaosDeadlineSlack, nil) {
		c.problem("%s", pr)
	}
	for _, p := range c.ranks() {
		if p.cmd.ProcessState != nil {
			c.problem("%s exited: %s", p.name, p.cmd.ProcessState)
			continue
		}
		live, over, err := pinnedWith(get, p.http)
		switch {
		case err != nil:
			c.problem("%s: metrics: %v", p.name, err)
		case live+over > 0:
			c.problem("%s (pid %d): %v rooms live, %v past their deadline at the end", p.name, p.cmd.Process.Pid, live, over)
		}
		if m, err := scrape(p.http); err == nil {
			c.counters = append(c.counters, fmt.Sprintf("%s pid %d: peers dead %.0f, restarted %.0f, re-lookups %.0f, register retries %.0f, "+
				"failed by deadline %.0f, quarantine expired %.0f, owed aborts %.0f, tombstones %.0f, pending %.0f",
				p.name, p.cmd.Process.Pid, sum(m["kvbridge_peers_dead_total"]), sum(m["kvbridge_peers_restarted_total"]),
				sum(m["kvbridge_relookups_total"]), sum(m["kvbridge_register_retries_total"]), sum(m["kvbridge_rooms_failed_by_deadline_total"]),
				sum(m["kvbridge_quarantine_expired_total"]), sum(m["kvbridge_owed_aborts"]), sumLabel(m["kvbridge_core_entries"], "tombstones"),
				sumLabel(m["kvbridge_core_entries"], "pending")))
		}
		known := 0
		for _, r := range rooms {
			if _, ok := roomStatus(get, p.http, r.id); ok {
				known++
			}
		}
		if known > 0 {
			c.problem("%s (pid %d) still knows %d rooms after every POST returned", p.name, p.cmd.Process.Pid, known)
		}
	}
}

func (c *cluster) report(elapsed, steadyFor time.Duration) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var okN, abN, failN, probes, probesOK, verified, corrupt int
	var moved uint64
	reasons := map[string]int{}
	now := time.Now()
	for _, r := range c.rooms {
		for i, x := range r.res[:r.ndec] {
			verified += x.PagesVerified
			corrupt += x.Corrupt
			if x.Corrupt > 0 {
				c.problems = append(c.problems, fmt.Sprintf("room %d: decode rank %d: %d pages corrupt", r.id, i, x.Corrupt))
			}
		}
		for i, x := range r.res {
			if r.errs[i] == nil && x.Error == "" && x.Status != "Success" && x.Status != "Failed" {
				c.problems = append(c.problems, fmt.Sprintf("room %d: %s ended %q at its POST's timeout (%v): hung", r.id, r.ranks[i].name, x.Status, chaosPostTimeout))
			}
			if r.errs[i] != nil && !c.killed[r.ranks[i]] {
				c.problems = append(c.problems, fmt.Sprintf("room %d: the POST to %s (pid %d), never killed, failed: %v", r.id, r.ranks[i].name, r.ranks[i].cmd.Process.Pid, r.errs[i]))
			}
			if strings.Contains(x.Error, "deadline") || (r.errs[i] != nil && strings.Contains(r.errs[i].Error(), "Timeout")) {
				c.problems = append(c.problems, fmt.Sprintf("room %d: %s: hung: %v%s", r.id, r.ranks[i].name, r.errs[i], x.Error))
			}
		}
		out := outcomeOf(r)
		if r.probe {
			probes++
			if out == "succeeded" {
				probesOK++
			}
		}
		switch out {
		case "succeeded":
			if !r.probe {
				okN++
			}
			for _, x := range r.res[:r.ndec] {
				moved += x.Bytes
			}
			continue
		case "aborted":
			abN++
			continue
		}
		if !r.probe {
			failN++
		}
		// The fault that explains it: the kill of a rank whose POST broke,
		// else the last fault whose window overlaps the room.
		var cause *fault
		for _, f := range c.faults {
			for i, err := range r.errs {
				if cause == nil && err != nil && f.kind == "kill" && slices.Contains(f.victims, r.ranks[i]) {
					cause = f
				}
			}
		}
		if cause == nil {
			for _, f := range c.faults {
				if from, to := f.window(now); r.start.Before(to) && r.end.After(from) {
					cause = f
				}
			}
		}
		why, during := reasonOf(r), "NO FAULT"
		if cause == nil {
			c.problems = append(c.problems, fmt.Sprintf("room %d (%d tokens, abort %q) failed outside any fault's window (+%.1fs–+%.1fs): %s",
				r.id, r.tokens, r.abort, r.start.Sub(c.t0).Seconds(), r.end.Sub(c.t0).Seconds(), why))
		} else {
			during = cause.label()
		}
		reasons[fmt.Sprintf("[%s] %s", during, why)]++
	}
	kinds := map[string]int{}
	var recov []float64
	for _, f := range c.faults {
		kinds[f.label()]++
		if !f.served.IsZero() {
			recov = append(recov, f.served.Sub(f.recovered).Seconds()*1e3)
		}
	}
	sort.Float64s(recov)
	fmt.Printf("\n%-26s prefill 1 × (TP %d) → decode 1 × (TP %d), %s, %s pages, %s discovery, seed %d\n", "topology", c.o.pShape.TPSize, c.o.dShape.TPSize, c.o.modelName, c.o.pageTokens, c.o.discovery, c.o.seed)
	fmt.Printf("%-26s %d over %.1f s (%d probe rooms, %d succeeded)\n", "rooms", len(c.rooms)-probes, elapsed.Seconds(), probes, probesOK)
	fmt.Printf("%-26s %d\n", "succeeded", okN)
	fmt.Printf("%-26s %d\n", "aborted", abN)
	fmt.Printf("%-26s %d\n", "failed", failN)
	var keys []string
	for k := range reasons {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return reasons[keys[i]] > reasons[keys[j]] || reasons[keys[i]] == reasons[keys[j]] && keys[i] < keys[j]
	})
	for _, k := range keys {
		fmt.Printf("  %5d  %s\n", reasons[k], k)
	}
	var fk []string
	for k, n := range kinds {
		fk = append(fk, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(fk)
	fmt.Printf("%-26s %d: %s\n", "faults", len(c.faults), strings.Join(fk, ", "))
	fmt.Printf("%-26s p50 %.0f ms, max %.0f ms (bound %v)\n", "recovery (a new room)", pct(recov, 0.5), pct(recov, 1), chaosRecoveryBound)
	fmt.Printf("%-26s %.2f GB\n", "bytes moved", float64(moved)/1e9)
	// Memory: each process alive at the end against its steady-state start.
	var mem []string
	for _, p := range append(append([]*proc{}, c.prefill.ranks...), c.decode.ranks...) {
		base, ok := c.rssBase[p]
		end := rss(p)
		switch {
		case !ok || time.Since(c.born[p]) < 2*chaosRSSSettle:
			mem = append(mem, fmt.Sprintf("%s pid %d too young (%.0f MiB)", p.name, p.cmd.Process.Pid, end))
		default:
			mem = append(mem, fmt.Sprintf("%s %.0f→%.0f MiB", p.name, base, end))
			if end > base*(1+chaosRSSSlackFrac)+chaosRSSSlackMiB {
				c.problems = append(c.problems, fmt.Sprintf("%s (pid %d): RSS %.0f MiB at the end, %.0f MiB at its steady start (slack %s)", p.name, p.cmd.Process.Pid, end, base, chaosSlackText))
			}
		}
	}
	fmt.Printf("%-26s %s (slack %s, steady state %.1f s)\n", "memory (RSS)", strings.Join(mem, ", "), chaosSlackText, steadyFor.Seconds())
	if c.sparedMem != "" {
		fmt.Printf("%-26s %s\n", "memory (spared rank)", c.sparedMem)
	}
	fmt.Printf("%-26s %d samples of every live rank's metrics and late rooms (past-deadline bound %v after a POST)\n", "rooms past deadline", c.samples, chaosRoomBound)
	fmt.Printf("%-26s %d (corrupt %d)\n", "pages verified", verified, corrupt)
	fmt.Printf("%-26s (the processes alive at the end)\n", "rank counters")
	for _, l := range c.counters {
		fmt.Println("  " + l)
	}
	return verdict(c.problems, 50, fmt.Sprintf("replay: demo -chaos -seed %d -discovery %s (fault timing is seeded; the machine's scheduling is not)\n", c.o.seed, c.o.discovery), logs,
		"OK: no page corrupt, no room past its deadline on any rank, every failure inside a fault's window, survivors served within the bound after every fault, memory flat.")
}
