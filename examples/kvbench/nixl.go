package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvbridge/kvbridge/internal/cpustat"
	"github.com/kvbridge/kvbridge/internal/nixl"
)

// nixlrefSource is the NIXL C program the nixl mode compares with.
//
//go:embed nixlref.c.in
var nixlrefSource []byte

// buildNIXLRef compiles nixlref against the NIXL that lib belongs to.
func buildNIXLRef(lib, dir string) (string, error) {
	src, bin := filepath.Join(dir, "nixlref.c"), filepath.Join(dir, "nixlref")
	if err := os.WriteFile(src, nixlrefSource, 0o644); err != nil {
		return "", err
	}
	libdir := filepath.Dir(lib)
	// libnixl's own dependencies (abseil, UCX) resolve at run time, as
	// they do for kvbridge: from the run path NIXL was installed with, or
	// LD_LIBRARY_PATH.
	out, err := exec.Command("gcc", "-O2", "-Wall", "-o", bin, src, "-L"+libdir, "-lnixl_capi", "-lnixl",
		"-Wl,-rpath,"+libdir, "-Wl,--allow-shlib-undefined").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building the NIXL C reference against %s: %v: %s", libdir, err, out)
	}
	return bin, nil
}

// The NIXL C program's progress modes (nixlref.c.in): both agents on
// NIXL's progress thread; neither, one loop progressing both (NIXL's
// fastest mode); the initiator self-driven and the target on the thread,
// as kvbridge's ranks make their agents.
const (
	refThread = "thread"
	refSelf   = "self"
	refRanks  = "ranks"
)

// refWrite runs nixlref's write in a progress mode, its pieces spread at
// random over spread times their count of slots (1: end to end): the
// median seconds per write and the mean CPU seconds per timed write (its
// own getrusage over them).
func refWrite(bin string, count int, piece uint64, iters int, delay time.Duration, mode string, spread int) (float64, float64, error) {
	out, err := exec.Command(bin, "write", strconv.Itoa(count), strconv.FormatUint(piece, 10), strconv.Itoa(iters),
		strconv.FormatInt(delay.Microseconds(), 10), mode, strconv.Itoa(spread)).CombinedOutput()
	if err != nil {
		return 0, 0, fmt.Errorf("nixlref: %v: %s", err, out)
	}
	var cpu float64
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "cpu "); ok {
			cpu, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	sec, err := strconv.ParseFloat(strings.TrimSpace(lastLine(string(out))), 64)
	return sec, cpu, err
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// bindingWrite does nixlref's write through kvbridge: two agents of engine
// in this process, lists prepared once, one transfer posted per iteration
// with a notification, Wait on the initiator, the target polling Notifs.
// On libnixl the initiator and the target get the progress modes given
// (a rank's: NIXLProgressCaller, NIXLProgressThread). It returns the
// median seconds per write and the mean CPU seconds per timed write (this
// process).
func bindingWrite(engine, lib string, count int, piece uint64, iters int, delay time.Duration, ini, tgt nixl.NIXLProgress) (float64, float64, error) {
	open := func(role string, mode nixl.NIXLProgress) (*nixl.Agent, error) {
		return nixl.Open(nixl.Config{Name: fmt.Sprintf("kvbench-nixl-%s-%d", role, time.Now().UnixNano()), Engine: engine,
			NIXLLib: lib, NIXLProgressDelay: delay, NIXLProgress: mode, UCX: map[string]string{"TLS": "posix,cma,self"}})
	}
	a, err := open("ini", ini)
	if err != nil {
		return 0, 0, err
	}
	defer a.Close()
	t, err := open("tgt", tgt)
	if err != nil {
		return 0, 0, err
	}
	defer t.Close()
	size := uint64(count) * piece
	_, src, err := a.Alloc(size)
	if err != nil {
		return 0, 0, err
	}
	_, dst, err := t.Alloc(size)
	if err != nil {
		return 0, 0, err
	}
	for i := range src {
		src[i] = 7
	}
	md, err := t.Metadata()
	if err != nil {
		return 0, 0, err
	}
	remote, err := a.LoadRemote(md)
	if err != nil {
		return 0, 0, err
	}
	ls, rs, idx := make([]nixl.Desc, count), make([]nixl.Desc, count), make([]int, count)
	for i := range ls {
		ls[i] = nixl.BytesDesc(src[uint64(i)*piece : uint64(i+1)*piece])
		rs[i] = nixl.BytesDesc(dst[uint64(i)*piece : uint64(i+1)*piece])
		idx[i] = i
	}
	l, err := a.PrepLocal(nixl.DRAM, ls)
	if err != nil {
		return 0, 0, err
	}
	r, err := a.PrepRemote(remote, nixl.DRAM, rs)
	if err != nil {
		return 0, 0, err
	}
	x, err := a.NewXfer(nixl.Write, l, idx, r, idx, []byte("n"))
	if err != nil {
		return 0, 0, err
	}
	defer a.Release(x)
	times := make([]float64, 0, iters)
	var meter *cpustat.Meter
	for i := 0; i <= iters; i++ { // i = 0 warms up
		if i == 1 {
			if meter, err = cpustat.Start(0); err != nil {
				return 0, 0, err
			}
		}
		t0 := time.Now()
		if err := a.Post(x); err != nil {
			return 0, 0, err
		}
		if st, err := a.Wait(context.Background(), x); st != nixl.Done {
			return 0, 0, fmt.Errorf("write: %v %v", st, err)
		}
		for got := 0; got == 0; {
			ns, err := t.Notifs()
			if err != nil {
				return 0, 0, err
			}
			got = len(ns)
		}
		if i > 0 {
			times = append(times, time.Since(t0).Seconds())
		}
	}
	used, err := meter.Read()
	if err != nil {
		return 0, 0, err
	}
	if src[0] != dst[0] || src[size-1] != dst[size-1] {
		return 0, 0, errors.New("data did not arrive")
	}
	slices.Sort(times)
	return times[len(times)/2], used.Total().Seconds() / float64(iters), nil
}

// idleCPU is the CPU time this process used over d with one libnixl agent
// of the progress mode given open and nothing to do.
func idleCPU(lib string, d time.Duration, mode nixl.NIXLProgress) (float64, error) {
	a, err := nixl.Open(nixl.Config{Name: fmt.Sprintf("kvbench-idle-%d", time.Now().UnixNano()), Engine: nixl.EngineLibNIXL, NIXLLib: lib,
		NIXLProgress: mode})
	if err != nil {
		return 0, err
	}
	defer a.Close()
	m, err := cpustat.Start(0)
	if err != nil {
		return 0, err
	}
	time.Sleep(d)
	r, err := m.Read()
	return r.Total().Seconds(), err
}

// rotated is the order of n programs in round r: 0..n-1 started at r mod n.
func rotated(n, r int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = (r + i) % n
	}
	return order
}

// vsFastest: per round, the fastest reference's seconds over ours (ours'
// speed as a fraction of the fastest reference's in that round).
func vsFastest(ours []float64, refs ...[]float64) []float64 {
	out := make([]float64, len(ours))
	for r, v := range ours {
		best := 0.0
		for _, ref := range refs {
			if r < len(ref) && (best == 0 || ref[r] < best) {
				best = ref[r]
			}
		}
		if v > 0 {
			out[r] = best / v
		}
	}
	return out
}

// spread is v's median, minimum and maximum.
func spread(v []float64) (float64, float64, float64) {
	return median(v), slices.Min(v), slices.Max(v)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// nixlMode puts kvbridge's libnixl engine next to the same work done by a
// C program on NIXL's C API and by kvbridge's ucx engine, in interleaved
// rounds; then an idle agent's CPU and one end-to-end request on both
// engines.
func (b *bench) nixlMode() error {
	lib := os.Getenv("KVBRIDGE_NIXL_LIB")
	if lib == "" {
		return errors.New("the nixl mode needs a real NIXL: set KVBRIDGE_NIXL_LIB to its libnixl_capi.so")
	}
	dir, err := os.MkdirTemp("", "kvbench-nixlref")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ref, err := buildNIXLRef(lib, dir)
	if err != nil {
		return err
	}
	delay := nixl.DefaultNIXLProgressDelay
	rounds, iters := 7, 20
	if b.quick {
		rounds, iters = 1, 3
	}
	cases := []struct {
		count int
		piece uint64
	}{{1, 64 << 20}, {1024, 32 << 10}}
	step, steps := 0, len(cases)*rounds+2
	for _, c := range cases {
		// Per round, interleaved: the NIXL C program in its three progress
		// modes, kvbridge's libnixl agents in the ranks' modes and with
		// NIXL's thread on both, and the ucx engine, each round starting
		// one program later (rotated), so none always runs right after the
		// same other. Seconds and CPU seconds per write.
		sec, cpu := map[string][]float64{}, map[string][]float64{}
		add := func(name string, v, p float64) { sec[name], cpu[name] = append(sec[name], v), append(cpu[name], p) }
		runs := []struct {
			name string
			run  func() (float64, float64, error)
		}{}
		for _, mode := range []string{refThread, refSelf, refRanks} {
			runs = append(runs, struct {
				name string
				run  func() (float64, float64, error)
			}{"NIXL C, " + mode, func() (float64, float64, error) { return refWrite(ref, c.count, c.piece, iters, delay, mode, 1) }})
		}
		runs = append(runs, []struct {
			name string
			run  func() (float64, float64, error)
		}{
			{"libnixl", func() (float64, float64, error) {
				return bindingWrite(nixl.EngineLibNIXL, lib, c.count, c.piece, iters, delay, nixl.NIXLProgressCaller, nixl.NIXLProgressThread)
			}},
			{"libnixl, both agents on NIXL's thread", func() (float64, float64, error) {
				return bindingWrite(nixl.EngineLibNIXL, lib, c.count, c.piece, iters, delay, nixl.NIXLProgressThread, nixl.NIXLProgressThread)
			}},
			{"ucx engine", func() (float64, float64, error) {
				return bindingWrite(nixl.EngineUCX, "", c.count, c.piece, iters, delay, 0, 0)
			}},
		}...)
		for r := 0; r < rounds; r++ {
			progress("nixl", step, steps)
			step++
			for _, k := range rotated(len(runs), r) {
				v, p, err := runs[k].run()
				if err != nil {
					return fmt.Errorf("%s: %w", runs[k].name, err)
				}
				add(runs[k].name, v, p)
			}
		}
		bytes := float64(uint64(c.count) * c.piece)
		gb := func(s []float64) float64 { return bytes / median(s) / 1e9 }
		perGB := func(c []float64) float64 { return median(c) / (bytes / 1e9) }
		refs, refCPU := map[string]float64{}, map[string]float64{}
		for name := range sec {
			if name != "libnixl" {
				refs[name], refCPU[name] = gb(sec[name]), perGB(cpu[name])
			}
		}
		b.add(Row{Mode: "nixl", Name: fmt.Sprintf("write %d × %s + notif", c.count, human(c.piece)), Bytes: uint64(bytes),
			Value: gb(sec["libnixl"]), Unit: "GB/s", References: refs,
			CPU: perGB(cpu["libnixl"]), CPUUnit: "s/GB", RefCPU: refCPU,
			Rounds: map[string][]float64{
				"libnixl / the fastest NIXL C mode":       vsFastest(sec["libnixl"], sec["NIXL C, "+refThread], sec["NIXL C, "+refSelf], sec["NIXL C, "+refRanks]),
				"NIXL C, ranks / the faster other C mode": vsFastest(sec["NIXL C, "+refRanks], sec["NIXL C, "+refThread], sec["NIXL C, "+refSelf]),
			}})
	}
	progress("nixl", step, steps)
	step++
	idleFor := 3 * time.Second
	if b.quick {
		idleFor = 500 * time.Millisecond
	}
	out, err := exec.Command(ref, "idle", strconv.Itoa(int(max(1, idleFor.Seconds()))), "0").CombinedOutput()
	if err != nil {
		return fmt.Errorf("nixlref idle: %v: %s", err, out)
	}
	spin, _ := strconv.ParseFloat(strings.TrimSpace(lastLine(string(out))), 64)
	for _, m := range []struct {
		mode nixl.NIXLProgress
		role string
	}{{nixl.NIXLProgressThread, "a decode rank's"}, {nixl.NIXLProgressCaller, "a prefill rank's"}} {
		ours, err := idleCPU(lib, idleFor, m.mode)
		if err != nil {
			return err
		}
		b.add(Row{Mode: "nixl", Name: fmt.Sprintf("idle agent (%v: %s), CPU", m.mode, m.role), Value: 100 * ours / idleFor.Seconds(), Unit: "% of a core",
			References: map[string]float64{"NIXL default agent (progress delay 0)": 100 * spin / max(1, idleFor.Seconds())}})
	}
	progress("nixl", step, steps)
	return b.nixlEndToEnd(ref, delay)
}

// nixlEndToEnd moves one model request (random pages) through a prefill
// and a decode rank: on libnixl, and on the ucx engine over the same kind
// of memory (the ranks' KV regions kvbench's own, mapped with huge pages,
// which NIXL's UCX and the ucx engine both move with cma) and over its own
// (UCX-allocated shared memory, which the peer maps and writes with
// memcpy); next to the NIXL C program writing the same number of pages to
// the same spread of random places (self-driven, NIXL's fastest mode, and
// in the ranks' progress modes). The
// three clusters live side by side and every round moves the same pages
// on each, then runs the C program, so drift lands on all alike.
func (b *bench) nixlEndToEnd(ref string, delay time.Duration) error {
	pages, tokens, rounds := 1024, 4096, 7
	if b.quick {
		pages, tokens, rounds = 256, 512, 2
	}
	n := tokens / b.model.PageTokens
	descs := n * 2 * b.model.Layers
	runs := []struct {
		name, engine string
		caller       bool
	}{{"libnixl", nixl.EngineLibNIXL, true}, {"ucx engine, same memory", nixl.EngineUCX, true}, {"ucx engine, its own memory", nixl.EngineUCX, false}}
	clusters := make([]*cluster, len(runs))
	defer func() {
		for _, c := range clusters {
			if c != nil {
				c.close()
			}
		}
	}()
	for i, run := range runs {
		saved, savedMem := b.engine, b.callerMem
		b.engine, b.callerMem = run.engine, run.caller
		c, err := b.cluster(pages)
		b.engine, b.callerMem = saved, savedMem
		if err != nil {
			return fmt.Errorf("%s cluster: %w", run.name, err)
		}
		clusters[i] = c
		all := scatter("contiguous", pages, pages, rand.New(rand.NewPCG(1, 2)))
		if err := c.room(all, all); err != nil { // warm up: every page once
			return fmt.Errorf("%s: %w", run.name, err)
		}
	}
	crefs := map[string]string{refSelf: "NIXL C program (self-driven), same pages", refRanks: "NIXL C program (the ranks' modes), same pages"}
	secs, cpus := map[string][]float64{}, map[string][]float64{}
	rng := rand.New(rand.NewPCG(1, 2))
	for r := 0; r < rounds; r++ {
		src, dst := scatter("random", n, pages, rng), scatter("random", n, pages, rng)
		for i, run := range runs {
			meter, err := cpustat.Start(0)
			if err != nil {
				return err
			}
			t0 := time.Now()
			if err := clusters[i].room(src, dst); err != nil {
				return fmt.Errorf("%s: %w", run.name, err)
			}
			sec := time.Since(t0).Seconds()
			used, err := meter.Read()
			if err != nil {
				return err
			}
			secs[run.name], cpus[run.name] = append(secs[run.name], sec), append(cpus[run.name], used.Total().Seconds())
		}
		for _, mode := range []string{refSelf, refRanks} {
			v, c, err := refWrite(ref, descs, b.model.PageBytes(), 3, delay, mode, pages/n)
			if err != nil {
				return err
			}
			name := crefs[mode]
			secs[name], cpus[name] = append(secs[name], v), append(cpus[name], c)
		}
	}
	gb := float64(descs) * float64(b.model.PageBytes()) / 1e9
	refs, refCPUs := map[string]float64{}, map[string]float64{}
	for name := range secs {
		if name != "libnixl" {
			refs[name], refCPUs[name] = gb/median(secs[name]), median(cpus[name])/gb
		}
	}
	cpuRoom := median(cpus["libnixl"])
	b.add(Row{Mode: "nixl", Name: fmt.Sprintf("e2e %s %d tok random, libnixl", b.model.Name, tokens),
		Bytes: uint64(descs) * b.model.PageBytes(), Value: gb / median(secs["libnixl"]), Unit: "GB/s", References: refs,
		CPU: cpuRoom / gb, CPUUnit: "s/GB", CPURoom: cpuRoom * 1e6, RefCPU: refCPUs})
	return nil
}
