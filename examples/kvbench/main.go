// Command kvbench measures kvbridge and prints every figure next to its
// reference from the same run, as a ratio:
//
//	engine   bulk write bandwidth, 4 KiB to 256 MiB    vs memcpy and ucx_perftest
//	paged    one request's pages with a model layout,  vs the engine's bulk write
//	topology heterogeneous TP with head slices (NHD, HND), vs TP 1 → 1 moving the same bytes
//	discovery 64 instances × 8 ranks in etcd: resolving an instance, a restart seen by the watch; vs the HTTP server
//	         scattered contiguous, fragmented or random
//	rooms    many concurrent rooms                     vs the engine's bulk write
//	control  control-plane round trip                  vs bare ZeroMQ PUSH/PULL
//	nixl     the libnixl engine on a real NIXL (KVBRIDGE_NIXL_LIB): 64 MiB and
//	         1,024 × 32 KiB writes with notification, an idle agent's CPU and a
//	         model request end to end, vs a C program on NIXL's C API doing the
//	         same and vs the ucx engine (not in "all")
//	idle     an idle rank's CPU: real prefill and decode rank processes
//	         (built from the module in the current directory, or -bin),
//	         registered with each other by one room, then -idle-for of
//	         nothing; each process's % of a core, vs the goal of 0.1 %
//	         (ucx; libnixl with KVBRIDGE_NIXL_LIB; loopback in-process;
//	         not in "all")
//	layerwise time to first token behind a prefill that computes layer by
//	         layer (a CPU kernel, and a device stand-in that leaves the host
//	         CPU free; -layer-compute), each layer sent as its compute ends,
//	         vs the whole chunk after the last layer, at 1K/4K/8K tokens;
//	         the tail after the last layer vs one layer's transfer (not in
//	         "all")
//
// Every figure comes with its CPU (user + system, every process involved)
// per GB moved, per room or per operation, next to its references' CPU in
// the same run. Results go to stdout, to -json as JSON rows and to -png as
// a chart of bandwidth against size (engine rows; no chart without them).
// The ranks' KV memory is host DRAM, or with -mem VRAM device memory
// allocated through the gpu package, against cuMemcpyDtoD on the same
// device (engine, paged and rooms modes, on every engine; vram.go).
package main

import (
	"context"
	crand "crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/kvbridge/kvbridge/examples/internal/cli"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/control"
	"github.com/kvbridge/kvbridge/internal/cpustat"
	"github.com/kvbridge/kvbridge/internal/cuda"
	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/rawagent"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/kvbridge/kvbridge/transfer"
	zmq "github.com/pebbe/zmq4"
)

// Row is one measurement with its references.
type Row struct {
	Mode       string             `json:"mode"`
	Name       string             `json:"name"`
	Bytes      uint64             `json:"bytes,omitempty"`
	Value      float64            `json:"value"`
	Unit       string             `json:"unit"`
	References map[string]float64 `json:"references"`
	Ratios     map[string]float64 `json:"ratios"`
	// CPU is what the figure cost: CPU time (user + system, every process
	// involved) per unit of work in CPUUnit ("s/GB": CPU seconds per 10⁹
	// bytes moved); RefCPU is each reference's in the same unit and run,
	// CPURatios kvbridge's over it (the goal: ≤ 1.2 against
	// ucx_perftest on the same transport and memory).
	CPU       float64            `json:"cpu,omitempty"`
	CPUUnit   string             `json:"cpu_unit,omitempty"`
	RefCPU    map[string]float64 `json:"ref_cpu,omitempty"`
	CPURatios map[string]float64 `json:"cpu_ratios,omitempty"`
	// CPURoom is kvbridge's CPU µs per room, for rows that move rooms.
	CPURoom float64 `json:"cpu_us_per_room,omitempty"`
	// Rounds: for rows measured in interleaved rounds, ratios taken in
	// each round (in round order), by what they compare: kvbridge's figure
	// over the fastest of several references in that round, and the same
	// for a reference against the others (what picking the fastest of
	// several noisy runs gives a program that is no slower).
	Rounds map[string][]float64 `json:"rounds,omitempty"`
}

type bench struct {
	engine string
	tls    string
	mem    nixl.MemKind
	// callerMem: the ranks' DRAM KV regions are kvbench's own (mapped
	// with transparent huge pages and registered), not the engine's Alloc:
	// both engines then move the same kind of memory (nixl mode's e2e).
	callerMem bool
	gpu       *cuda.Context    // -mem VRAM: device 0
	vram      []cuda.DevicePtr // device memory to free once its agents are closed
	quick     bool
	rows      []Row
	// idle mode
	idleFor time.Duration
	bin     string
	notes   []string // lines printed after the table (goals)
	model   kvmodel.Model
	// layerwise mode
	layerCompute string
	layerRooms   int
}

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := flag.NewFlagSet("kvbench", flag.ContinueOnError)
	mode := fs.String("mode", "all", "engine, paged, rooms, topology, discovery, control, nixl, idle, layerwise, pages, pull, digest, or all (all but nixl, idle, layerwise, pages, pull and digest)")
	idleFor := fs.Duration("idle-for", 30*time.Second, "idle mode: how long the ranks sit idle while their CPU is measured")
	bin := fs.String("bin", "", "idle mode: directory holding the prefill and decode binaries (default: bin/ beside kvbench, else built into a temporary directory)")
	engine := fs.String("engine", "ucx", "nixl engine")
	tls := fs.String("ucx-tls", "posix,cma,self", "UCX transports (ucx engine and ucx_perftest)")
	mem := fs.String("mem", "DRAM", "the ranks' KV memory: DRAM, or VRAM (device 0's memory through the gpu package, against cuMemcpyDtoD on the device; modes engine, paged, rooms and digest, any engine; needs a GPU, or the CUDA driver double in KVBRIDGE_CUDA_LIB)")
	model := fs.String("model", "llama3-8b", "model layout for paged and rooms: "+kvmodel.PresetNames())
	jsonOut := fs.String("json", "kvbench.json", "write results as JSON here (\"\" for none)")
	pngOut := fs.String("png", "kvbench.png", "write a chart here (\"\" for none)")
	quick := fs.Bool("quick", false, "small sizes and few iterations (tests)")
	layerCompute := fs.String("layer-compute", "both", "layerwise mode: the layers' compute: cpu (a float32 kernel on the host), device (a wait that leaves the host CPU free, as a GPU does) or both")
	layerRooms := fs.Int("layer-rooms", 9, "layerwise mode: rooms of each way per size (medians)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `kvbench: measures kvbridge and prints every figure next to its reference from
the same run, as a ratio (engine, paged, rooms, topology, discovery and
control modes; nixl on a real NIXL, idle, an idle rank process's CPU,
and layerwise, TTFT with layer-by-layer sends, not in "all"). Each
figure comes with its CPU (per GB or per room) next to the reference's.
Results go to stdout, to -json and to -png (a chart of the engine rows,
when there are any).

usage: kvbench [flags]

flags:
`)
		fs.PrintDefaults()
	}
	if code, ok := cli.Parse(fs, args); !ok {
		return code
	}
	b := &bench{engine: *engine, tls: *tls, quick: *quick, model: kvmodel.Presets[*model], idleFor: *idleFor, bin: *bin,
		layerCompute: *layerCompute, layerRooms: max(*layerRooms, 1)}
	if b.model.Name == "" {
		fmt.Fprintf(os.Stderr, "kvbench: -model %q: want one of %s\n", *model, kvmodel.PresetNames())
		return 2
	}
	modes := map[string]func() error{"engine": b.engineMode, "paged": b.pagedMode, "rooms": b.roomsMode, "control": b.controlMode,
		"topology": b.topologyMode, "discovery": b.discoveryMode, "nixl": b.nixlMode, "idle": b.idleMode, "layerwise": b.layerwiseMode, "pages": b.pagesMode, "pull": b.pullMode, "digest": b.digestMode}
	order := []string{"engine", "paged", "rooms", "topology", "discovery", "control"}
	if *mode != "all" {
		if modes[*mode] == nil {
			fmt.Fprintf(os.Stderr, "kvbench: unknown mode %q\n", *mode)
			return 2
		}
		order = []string{*mode}
	}
	if code, err := b.setMem(*mem, *mode); err != nil {
		fmt.Fprintln(os.Stderr, "kvbench:", err)
		return code
	}
	if b.mem == nixl.VRAM {
		order = slices.DeleteFunc(order, func(m string) bool { return !slices.Contains(vramModes, m) })
	}
	for _, m := range order {
		if err := modes[m](); err != nil {
			fmt.Fprintf(os.Stderr, "\nkvbench: %s: %v\n", m, err)
			return 1
		}
	}
	fmt.Fprintln(os.Stderr)
	b.print()
	if *jsonOut != "" {
		data, _ := json.MarshalIndent(b.rows, "", "  ")
		if err := os.WriteFile(*jsonOut, data, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "kvbench:", err)
			return 1
		}
	}
	// Only the engine rows are charted: a run without them (-mode control
	// alone) has no chart, and that is no failure.
	if *pngOut != "" && hasEngineRows(b.rows) {
		if err := chart(b.rows, *pngOut); err != nil {
			fmt.Fprintln(os.Stderr, "kvbench: chart:", err)
			return 1
		}
	}
	return 0
}

func (b *bench) add(r Row) {
	r.Ratios = map[string]float64{}
	for k, v := range r.References {
		if v > 0 {
			r.Ratios[k] = r.Value / v
		}
	}
	if r.CPU > 0 && len(r.RefCPU) > 0 {
		r.CPURatios = map[string]float64{}
		for k, v := range r.RefCPU {
			if v > 0 {
				r.CPURatios[k] = r.CPU / v
			}
		}
	}
	b.rows = append(b.rows, r)
}

func hasEngineRows(rows []Row) bool {
	for _, r := range rows {
		if r.Mode == "engine" {
			return true
		}
	}
	return false
}

// cpuOver runs f and returns its wall time and this process's CPU time
// (every thread) over it.
func cpuOver(f func() error) (time.Duration, time.Duration, error) {
	m, err := cpustat.Start(0)
	if err != nil {
		return 0, 0, err
	}
	if err := f(); err != nil {
		return 0, 0, err
	}
	r, err := m.Read()
	return r.Wall, r.Total(), err
}

var progressMu sync.Mutex

func progress(label string, done, total int) {
	progressMu.Lock()
	defer progressMu.Unlock()
	const w = 24
	n := done * w / max(total, 1)
	fmt.Fprintf(os.Stderr, "\r%-8s [%s%s] %d/%d ", label, strings.Repeat("#", n), strings.Repeat(".", w-n), done, total)
}

func (b *bench) print() {
	fmt.Printf("%-8s %-28s %12s  %s\n", "mode", "case", "kvbridge", "references (ratio)")
	for _, r := range b.rows {
		var refs []string
		for _, k := range sortedKeys(r.References) {
			refs = append(refs, fmt.Sprintf("%s %.3g %s (%.2f)", k, r.References[k], r.Unit, r.Ratios[k]))
		}
		fmt.Printf("%-8s %-28s %9.3g %s  %s\n", r.Mode, r.Name, r.Value, r.Unit, strings.Join(refs, ", "))
		if r.CPU > 0 {
			var crefs []string
			for _, k := range sortedKeys(r.RefCPU) {
				crefs = append(crefs, fmt.Sprintf("%s %.3g (%.2f)", k, r.RefCPU[k], r.CPURatios[k]))
			}
			room := ""
			if r.CPURoom > 0 {
				room = fmt.Sprintf(", %.0f µs/room", r.CPURoom)
			}
			fmt.Printf("%-8s %-28s %9.3g %s%s  %s\n", "", "  CPU", r.CPU, r.CPUUnit, room, strings.Join(crefs, ", "))
		}
		for _, k := range slices.Sorted(maps.Keys(r.Rounds)) {
			v := r.Rounds[k]
			rs := make([]string, len(v))
			for i, x := range v {
				rs[i] = fmt.Sprintf("%.2f", x)
			}
			med, lo, hi := spread(v)
			fmt.Printf("%-8s %-28s %s: %s (median %.2f, %.2f–%.2f)\n", "", "  per round", k, strings.Join(rs, " "), med, lo, hi)
		}
	}
	for _, n := range b.notes {
		fmt.Println(n)
	}
}

// ---- engine ------------------------------------------------------------

func (b *bench) agents() (*nixl.Agent, *nixl.Agent, string, error) {
	// On libnixl, the modes a prefill and a decode rank give their agents.
	open := func(n string, mode nixl.NIXLProgress) (*nixl.Agent, error) {
		c := nixl.Config{Name: fmt.Sprintf("kvbench-%s-%d", n, time.Now().UnixNano()), Engine: b.engine,
			UCX: map[string]string{"TLS": b.tls}, NIXLProgress: mode}
		c.FromEnv()
		return nixl.Open(c)
	}
	a, err := open("ini", nixl.NIXLProgressCaller)
	if err != nil {
		return nil, nil, "", err
	}
	t, err := open("tgt", nixl.NIXLProgressThread)
	if err != nil {
		a.Close()
		return nil, nil, "", err
	}
	return a, t, "", nil
}

func sortedKeys(m map[string]float64) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// writeGBps writes size bytes of the run's memory kind iters times
// between two agents: GB/s and this process's CPU s/GB over the timed
// writes. The target's buffer is checked against the source's afterwards.
func (b *bench) writeGBps(a, t *nixl.Agent, size uint64, iters int) (float64, float64, error) {
	src, err := b.allocKV(a, size)
	if err != nil {
		return 0, 0, err
	}
	dst, err := b.allocKV(t, size)
	if err != nil {
		return 0, 0, err
	}
	data := make([]byte, size)
	rand.NewChaCha8([32]byte{byte(size), byte(size >> 8), byte(size >> 16), byte(size >> 24)}).Read(data)
	if err := b.put(src, data); err != nil {
		return 0, 0, err
	}
	md, _ := t.Metadata()
	remote, err := a.LoadRemote(md)
	if err != nil {
		return 0, 0, err
	}
	l, err := a.PrepLocal(b.mem, []nixl.Desc{src.Desc})
	if err != nil {
		return 0, 0, err
	}
	r, err := a.PrepRemote(remote, b.mem, []nixl.Desc{dst.Desc})
	if err != nil {
		return 0, 0, err
	}
	x, err := a.NewXfer(nixl.Write, l, []int{0}, r, []int{0}, nil)
	if err != nil {
		return 0, 0, err
	}
	defer a.Release(x)
	once := func(n int) error {
		for i := 0; i < n; i++ {
			if err := a.Post(x); err != nil {
				return err
			}
			if st, err := a.Wait(context.Background(), x); st != nixl.Done {
				return fmt.Errorf("write: %v %v", st, err)
			}
		}
		return nil
	}
	if err := once(1); err != nil { // warms up: connection, first touch of the pages
		return 0, 0, err
	}
	wall, cpu, err := cpuOver(func() error { return once(iters) })
	if err != nil {
		return 0, 0, err
	}
	if err := b.check(dst, data); err != nil {
		return 0, 0, err
	}
	bytes := float64(size) * float64(iters)
	return bytes / wall.Seconds() / 1e9, cpustat.PerGB(cpu, bytes), nil
}

// memcpyGBps: GB/s and CPU s/GB of copy() between two buffers.
func memcpyGBps(size uint64, iters int) (float64, float64) {
	src, dst := make([]byte, size), make([]byte, size)
	copy(dst, src)
	wall, cpu, _ := cpuOver(func() error {
		for i := 0; i < iters; i++ {
			copy(dst, src)
		}
		return nil
	})
	bytes := float64(size) * float64(iters)
	return bytes / wall.Seconds() / 1e9, cpustat.PerGB(cpu, bytes)
}

var finalLine = regexp.MustCompile(`^Final:\s+\d+\s+\S+\s+\S+\s+\S+\s+(\S+)`)

// perftestGBps runs ucx_perftest -t ucp_put_bw (server and client) at one
// size: its GB/s, and the CPU s/GB of its two processes together (0, 0 if
// it is not installed or fails). Each process's CPU comes from its
// rusage after it ends, which includes UCX's start-up and perftest's
// warm-up; so it runs twice, with n and 2n iterations, and the CPU
// figure is the difference over the extra n iterations' bytes: the
// steady state, as kvbridge's figures are.
func (b *bench) perftestGBps(size uint64, iters int) (float64, float64) {
	if _, err := exec.LookPath("ucx_perftest"); err != nil {
		return 0, 0
	}
	n := max(iters, 200, int(min(500000, (2<<30)/size))) // its own warm-up needs a few hundred
	_, cpu1, ok1 := b.perftestRun(size, n)
	gbps, cpu2, ok2 := b.perftestRun(size, 2*n)
	if !ok1 || !ok2 {
		return 0, 0
	}
	var perGB float64
	if d := cpu2 - cpu1; d > 0 {
		perGB = cpustat.PerGB(d, float64(size)*float64(n))
	}
	return gbps, perGB
}

// perftestRun is one ucx_perftest run of iters puts: GB/s and both
// processes' CPU time.
func (b *bench) perftestRun(size uint64, iters int) (float64, time.Duration, bool) {
	port := strconv.Itoa(20000 + rand.IntN(20000))
	env := append(os.Environ(), "UCX_TLS="+b.tls)
	args := []string{"-t", "ucp_put_bw", "-s", strconv.FormatUint(size, 10), "-n", strconv.Itoa(iters), "-p", port}
	srv := exec.Command("ucx_perftest", args...)
	srv.Env = env
	if srv.Start() != nil {
		return 0, 0, false
	}
	srvDone := make(chan struct{})
	go func() { srv.Wait(); close(srvDone) }()
	defer func() {
		select {
		case <-srvDone:
		default:
			srv.Process.Kill()
			<-srvDone
		}
	}()
	for try := 0; try < 20; try++ {
		time.Sleep(200 * time.Millisecond)
		cli := exec.Command("ucx_perftest", append([]string{"127.0.0.1"}, args...)...)
		cli.Env = env
		out, err := cli.Output()
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(out), "\n") {
			if m := finalLine.FindStringSubmatch(l); m != nil {
				// Columns: iterations, 50%ile, avg, overall, bw avg (MiB/s), ...
				f := strings.Fields(l)
				if len(f) >= 6 {
					v, err := strconv.ParseFloat(f[5], 64)
					if err != nil || math.IsInf(v, 0) || math.IsNaN(v) || v <= 0 {
						return 0, 0, false
					}
					// The server ends once its client is done.
					select {
					case <-srvDone:
					case <-time.After(10 * time.Second):
						return 0, 0, false
					}
					cpu := cpustat.Of(srv.ProcessState).Add(cpustat.Of(cli.ProcessState))
					return v * 1048576 / 1e9, cpu.Total(), true
				}
			}
		}
	}
	return 0, 0, false
}

func (b *bench) engineMode() error {
	sizes := []uint64{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20}
	if b.quick {
		sizes = []uint64{4 << 10, 64 << 10, 1 << 20}
	}
	for i, size := range sizes {
		progress("engine", i, len(sizes))
		iters := int(max(4, min(2000, (1<<30)/size)))
		if b.quick {
			iters = 5
		}
		a, t, _, err := b.agents()
		if err != nil {
			return err
		}
		v, cpu, err := b.writeGBps(a, t, size, iters)
		a.Close()
		t.Close()
		if err != nil {
			b.freeVRAM()
			return err
		}
		row := Row{Mode: "engine", Name: fmt.Sprintf("write %s", human(size)), Bytes: size, Value: v, Unit: "GB/s",
			References: map[string]float64{}, CPU: cpu, CPUUnit: "s/GB", RefCPU: map[string]float64{}}
		if b.mem == nixl.VRAM {
			row.Name += b.memSuffix()
			err = b.addDtoD(&row, size, iters)
			b.freeVRAM()
			if err != nil {
				return err
			}
		} else {
			row.References["memcpy"], row.RefCPU["memcpy"] = memcpyGBps(size, iters)
			if p, pcpu := b.perftestGBps(size, iters); p > 0 {
				row.References["ucx_perftest"] = p
				if pcpu > 0 {
					row.RefCPU["ucx_perftest"] = pcpu
				}
			}
		}
		b.add(row)
	}
	progress("engine", len(sizes), len(sizes))
	return nil
}

func human(n uint64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	default:
		return fmt.Sprintf("%d KiB", n>>10)
	}
}

// ---- paged and rooms ---------------------------------------------------

type cluster struct {
	srv     *bootstrap.Server
	prefill *kvmanager.Prefill
	decode  *kvmanager.Decode
	pp, dp  *kvmodel.Pages
	next    uint64
	mu      sync.Mutex
	free    func() // after the ranks are closed: their device memory (-mem VRAM)
}

// benchAuth is a fresh shared secret for the in-process ranks (the
// product's default path: every control message authenticated).
func benchAuth() *bootstrap.Auth {
	var b [32]byte
	if _, err := crand.Read(b[:]); err != nil {
		panic(err)
	}
	a, err := bootstrap.NewAuth(b[:])
	if err != nil {
		panic(err)
	}
	return a
}

func (b *bench) cluster(pages int) (*cluster, error) {
	auth := benchAuth()
	srv, err := bootstrap.NewServer(bootstrap.ServerConfig{Token: auth.BootstrapToken()})
	if err != nil {
		return nil, err
	}
	c := &cluster{srv: srv, pp: kvmodel.NewPages(pages, 1), dp: kvmodel.NewPages(pages, 2), free: func() {}}
	if err := c.srv.Start("127.0.0.1:0"); err != nil {
		return nil, err
	}
	if b.mem == nixl.VRAM {
		c.free = b.freeVRAM
	}
	mk := func(role kvmanager.Role) (kvmanager.Config, error) {
		cfg := kvmanager.DefaultConfig(role)
		cfg.Auth = auth
		cfg.Instance = fmt.Sprintf("kvbench-%d", time.Now().UnixNano())
		cfg.Compat, cfg.BootstrapURL = b.model.Compat(), c.srv.URL()
		cfg.Engine = nixl.Config{Engine: b.engine, UCX: map[string]string{"TLS": b.tls}}
		cfg.Engine.FromEnv()
		cfg.Layout = b.model.Layout(b.mem, pages, 4096)
		if b.mem == nixl.VRAM {
			return cfg, b.vramRegions(cfg.Layout.Regions)
		}
		if b.callerMem {
			free, err := callerRegions(cfg.Layout.Regions)
			if err != nil {
				return cfg, err
			}
			prev := c.free
			c.free = func() { prev(); free() }
		}
		return cfg, nil
	}
	cfg, err := mk(kvmanager.RolePrefill)
	if err == nil {
		c.prefill, err = kvmanager.NewPrefill(cfg)
	}
	if err != nil {
		c.srv.Close(context.Background())
		c.free()
		return nil, err
	}
	if cfg, err = mk(kvmanager.RoleDecode); err == nil {
		c.decode, err = kvmanager.NewDecode(cfg)
	}
	if err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// callerRegions maps the regions' memory in one anonymous mapping on a
// 2 MiB boundary with transparent huge pages asked for (as the libnixl
// engine's Alloc does) and sets their addresses, each region followed by
// its ownership proof slot; free unmaps it once the ranks are closed.
func callerRegions(regions []nixl.Desc) (free func(), err error) {
	const huge = 2 << 20
	span := func(r nixl.Desc) uint64 { return (r.Len + transfer.ProofBytes + huge - 1) / huge * huge }
	var total int
	for _, r := range regions {
		total += int(span(r))
	}
	m, err := syscall.Mmap(-1, 0, total+huge, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("mapping %d bytes of KV memory: %w", total, err)
	}
	base := (uintptr(unsafe.Pointer(&m[0])) + huge - 1) / huge * huge
	skip := int(base - uintptr(unsafe.Pointer(&m[0])))
	_ = syscall.Madvise(m[skip:skip+total], syscall.MADV_HUGEPAGE)
	off := base
	for i := range regions {
		regions[i].Addr = off
		off += uintptr(span(regions[i]))
	}
	return func() { syscall.Munmap(m) }, nil
}

func (c *cluster) close() {
	if c.decode != nil {
		c.decode.Close()
	}
	c.prefill.Close()
	c.srv.Close(context.Background())
	c.free()
}

// room moves one request with the given page lists.
func (c *cluster) room(src, dst []uint32) error {
	c.mu.Lock()
	c.next++
	id := c.next
	c.mu.Unlock()
	ctx := context.Background()
	r, err := receiver.New(c.decode, id)
	if err != nil {
		return err
	}
	defer r.Clear()
	s, err := sender.New(c.prefill, id)
	if err != nil {
		return err
	}
	defer s.Clear()
	s.Init()
	if err := r.Init(ctx, kvmanager.RequestSpec{DstPages: dst, AuxIndex: int(id % 4096)}); err != nil {
		return err
	}
	if st, err := s.WaitReady(ctx); st != kvmanager.WaitingForInput {
		return fmt.Errorf("room %d: %v %v", id, st, err)
	}
	for i := 0; i < len(src); i += 128 {
		end := min(i+128, len(src))
		if err := s.Send(src[i:end], end == len(src), int(id%4096)); err != nil {
			return err
		}
	}
	if st, _ := r.Wait(ctx); st != kvmanager.Success {
		return fmt.Errorf("room %d: %v: %s", id, st, r.Failure())
	}
	s.Wait(ctx)
	return nil
}

// bulk is the engine's single-descriptor write between the cluster's
// agents, by streams writers at once (the concurrency of the case it is
// the reference of), each size bytes at its own offset: GB/s and CPU s/GB.
func (c *cluster) bulk(size uint64, iters, streams int) (float64, float64, error) {
	a, t := rawagent.Of(c.prefill), rawagent.Of(c.decode)
	md, _ := t.Metadata()
	remote, err := a.LoadRemote(md)
	if err != nil {
		return 0, 0, err
	}
	src, dst := c.prefill.Config().Layout.Regions, c.decode.Config().Layout.Regions
	kind := c.prefill.Config().Layout.Kind
	size = min(size, src[0].Len)
	var xs []*nixl.Xfer
	for s := 0; s < streams; s++ {
		r := s % len(src)
		l, _ := a.PrepLocal(kind, []nixl.Desc{{Addr: src[r].Addr, Len: size, Dev: src[r].Dev}})
		rp, _ := a.PrepRemote(remote, kind, []nixl.Desc{{Addr: dst[r].Addr, Len: size, Dev: dst[r].Dev}})
		x, err := a.NewXfer(nixl.Write, l, []int{0}, rp, []int{0}, nil)
		if err != nil {
			return 0, 0, err
		}
		defer a.Release(x)
		xs = append(xs, x)
	}
	once := func(n int) error {
		var wg sync.WaitGroup
		errs := make(chan error, len(xs))
		for _, x := range xs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < n; i++ {
					a.Post(x)
					if st, err := a.Wait(context.Background(), x); st != nixl.Done {
						errs <- fmt.Errorf("bulk write: %v %v", st, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		return <-errs
	}
	if err := once(1); err != nil { // warm up
		return 0, 0, err
	}
	wall, cpu, err := cpuOver(func() error { return once(iters) })
	if err != nil {
		return 0, 0, err
	}
	bytes := float64(size) * float64(iters) * float64(streams)
	return bytes / wall.Seconds() / 1e9, cpustat.PerGB(cpu, bytes), nil
}

func scatter(kind string, n, pages int, rng *rand.Rand) []uint32 {
	out := make([]uint32, n)
	switch kind {
	case "contiguous":
		base := rng.IntN(pages - n + 1)
		for i := range out {
			out[i] = uint32(base + i)
		}
	case "fragmented": // runs of 8 pages at random places
		perm := rng.Perm(pages / 8)
		for i := range out {
			out[i] = uint32(perm[i/8]*8 + i%8)
		}
	default: // random
		perm := rng.Perm(pages)
		for i := range out {
			out[i] = uint32(perm[i])
		}
	}
	return out
}

func (b *bench) pagedMode() error {
	pages, tokens, iters := 1024, 4096, 10
	if b.quick {
		pages, tokens, iters = 256, 512, 3
	}
	c, err := b.cluster(pages)
	if err != nil {
		return err
	}
	defer c.close()
	n := tokens / b.model.PageTokens
	if err := c.room(scatter("contiguous", 1, pages, rand.New(rand.NewPCG(0, 0))), []uint32{0}); err != nil {
		return err
	}
	bulk, bulkCPU, err := c.bulk(uint64(n)*b.model.PageBytes(), iters, 1)
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	// Warm up: touch every page of both sides once.
	all := scatter("contiguous", pages, pages, rng)
	if err := c.room(all, all); err != nil {
		return err
	}
	kinds := []string{"contiguous", "fragmented", "random"}
	for k, kind := range kinds {
		progress("paged", k, len(kinds))
		bytes := float64(n) * float64(b.model.PageBytes()) * float64(2*b.model.Layers)
		wall, cpu, err := cpuOver(func() error {
			for i := 0; i < iters; i++ {
				if err := c.room(scatter(kind, n, pages, rng), scatter(kind, n, pages, rng)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		row := Row{Mode: "paged", Name: fmt.Sprintf("%s %d tok %s", b.model.Name, tokens, kind) + b.memSuffix(), Bytes: uint64(bytes),
			Value: bytes * float64(iters) / wall.Seconds() / 1e9, Unit: "GB/s", References: map[string]float64{"bulk write": bulk},
			CPU: cpustat.PerGB(cpu, bytes*float64(iters)), CPUUnit: "s/GB", RefCPU: map[string]float64{"bulk write": bulkCPU},
			CPURoom: float64(cpu.Microseconds()) / float64(iters)}
		// The same bytes as one room's, in one copy on the device.
		if err := b.addDtoD(&row, uint64(bytes), iters); err != nil {
			return err
		}
		b.add(row)
	}
	progress("paged", len(kinds), len(kinds))
	return nil
}

func (b *bench) roomsMode() error {
	pages, tokens, rooms, streams := 1024, 1024, 64, 8
	if b.quick {
		pages, tokens, rooms, streams = 512, 256, 16, 4
	}
	c, err := b.cluster(pages)
	if err != nil {
		return err
	}
	defer c.close()
	n := tokens / b.model.PageTokens
	bulk, bulkCPU, err := c.bulk(32<<20, 10, streams) // the same concurrency as the rooms
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	var done int
	var mu sync.Mutex
	errs := make(chan error, streams)
	meter, err := cpustat.Start(0)
	if err != nil {
		return err
	}
	for s := 0; s < streams; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := s; i < rooms; i += streams {
				var src, dst []uint32
				for src == nil || dst == nil {
					if src == nil {
						src = c.pp.Get(n)
					}
					if dst == nil {
						dst = c.dp.Get(n)
					}
					if src == nil || dst == nil {
						time.Sleep(100 * time.Microsecond)
					}
				}
				err := c.room(src, dst)
				c.pp.Put(src)
				c.dp.Put(dst)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				done++
				progress("rooms", done, rooms)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	used, err := meter.Read()
	if err != nil {
		return err
	}
	bytes := float64(rooms) * float64(n) * float64(b.model.PageBytes()) * float64(2*b.model.Layers)
	row := Row{Mode: "rooms", Name: fmt.Sprintf("%d rooms × %d tok, %d streams", rooms, tokens, streams) + b.memSuffix(), Bytes: uint64(bytes),
		Value: bytes / used.Wall.Seconds() / 1e9, Unit: "GB/s", References: map[string]float64{"bulk write": bulk},
		CPU: cpustat.PerGB(used.Total(), bytes), CPUUnit: "s/GB", RefCPU: map[string]float64{"bulk write": bulkCPU},
		CPURoom: float64(used.Total().Microseconds()) / float64(rooms)}
	// One room's bytes per copy on the device, as many copies as rooms.
	if err := b.addDtoD(&row, uint64(bytes)/uint64(rooms), rooms); err != nil {
		return err
	}
	b.add(row)
	return nil
}

// ---- control -----------------------------------------------------------

func (b *bench) controlMode() error {
	n := 2000
	if b.quick {
		n = 200
	}
	progress("control", 0, 2)
	auth := benchAuth()
	got := make(chan struct{}, 1)
	var echo *control.Loop
	var back wire.Peer
	echo, err := control.NewLoop(control.LoopConfig{Identity: wire.From{Role: wire.RolePrefill, Instance: "bench-echo"},
		Bind: "tcp://127.0.0.1:*", Auth: auth, Handler: func(m wire.Message) { echo.Send(back, m) }})
	if err != nil {
		return err
	}
	defer echo.Close()
	a, err := control.NewLoop(control.LoopConfig{Identity: wire.From{Role: wire.RoleDecode, Instance: "bench-a"},
		Bind: "tcp://127.0.0.1:*", Auth: auth, Handler: func(wire.Message) { got <- struct{}{} }})
	if err != nil {
		return err
	}
	defer a.Close()
	back = wire.Peer{Endpoint: a.Endpoint()}
	to := wire.Peer{Endpoint: echo.Endpoint(), Epoch: echo.Identity().Epoch}
	// rtt: wall and CPU time (both loops are in this process) per round trip.
	rtt := func() (time.Duration, time.Duration) {
		wall, cpu, _ := cpuOver(func() error {
			for i := 0; i < n; i++ {
				a.Send(to, &wire.Abort{Room: uint64(i), Reason: "bench"})
				<-got
			}
			return nil
		})
		return wall / time.Duration(n), cpu / time.Duration(n)
	}
	rtt() // warm up
	kvb, kvbCPU := rtt()
	progress("control", 1, 2)
	bare, bareCPU, err := bareRTT(n)
	if err != nil {
		return err
	}
	progress("control", 2, 2)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	// Ratio as speed: reference time / kvbridge time; the CPU ratio is
	// kvbridge's CPU over the reference's.
	b.rows = append(b.rows, Row{Mode: "control", Name: "round trip (µs)", Value: us(kvb), Unit: "µs",
		References: map[string]float64{"bare zmq": us(bare)},
		Ratios:     map[string]float64{"bare zmq": float64(bare) / float64(kvb)},
		CPU:        us(kvbCPU), CPUUnit: "µs/round trip", RefCPU: map[string]float64{"bare zmq": us(bareCPU)},
		CPURatios: map[string]float64{"bare zmq": float64(kvbCPU) / float64(max(bareCPU, 1))}})
	return nil
}

// bareRTT is the reference: PUSH/PULL echo with pebbe/zmq4, same frames;
// wall and CPU time per round trip. One context per end, as two ranks
// have (and as kvbridge's loops do: each its own context and I/O thread);
// with one shared context the round trip measured about half as fast
// (issue 40).
func bareRTT(n int) (time.Duration, time.Duration, error) {
	ctxEcho, err := zmq.NewContext()
	if err != nil {
		return 0, 0, err
	}
	defer ctxEcho.Term()
	ctxSend, err := zmq.NewContext()
	if err != nil {
		return 0, 0, err
	}
	defer ctxSend.Term()
	mk := func(ctx *zmq.Context, t zmq.Type) *zmq.Socket { s, _ := ctx.NewSocket(t); s.SetLinger(0); return s }
	pull, backPush := mk(ctxEcho, zmq.PULL), mk(ctxEcho, zmq.PUSH)
	push, backPull := mk(ctxSend, zmq.PUSH), mk(ctxSend, zmq.PULL)
	defer func() {
		for _, s := range []*zmq.Socket{pull, backPull, push, backPush} {
			s.Close()
		}
	}()
	pull.Bind("tcp://127.0.0.1:*")
	backPull.Bind("tcp://127.0.0.1:*")
	e1, _ := pull.GetLastEndpoint()
	e2, _ := backPull.GetLastEndpoint()
	push.Connect(e1)
	backPush.Connect(e2)
	frames, _ := wire.Encode(&wire.Abort{From: wire.From{Role: "decode", Instance: "x", Endpoint: e2}, Room: 1, Reason: "bench"})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 2*n; i++ {
			m, err := pull.RecvMessageBytes(0)
			if err != nil {
				return
			}
			backPush.SendMessage(m)
		}
	}()
	round := func() (time.Duration, time.Duration) {
		wall, cpu, _ := cpuOver(func() error {
			for i := 0; i < n; i++ {
				push.SendMessage(frames)
				backPull.RecvMessageBytes(0)
			}
			return nil
		})
		return wall / time.Duration(n), cpu / time.Duration(n)
	}
	round()
	d, cpu := round()
	<-done
	return d, cpu, nil
}
