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
	"github.com/kvbridge/kvbridge/nixl"
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

// refWrite runs nixlref's write: the median seconds per write and the
// mean CPU seconds per timed write (its own getrusage over them).
func refWrite(bin string, count int, piece uint64, iters int, delay time.Duration) (float64, float64, error) {
	out, err := exec.Command(bin, "write", strconv.Itoa(count), strconv.FormatUint(piece, 10), strconv.Itoa(iters),
		strconv.FormatInt(delay.Microseconds(), 10)).CombinedOutput()
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
// It returns the median seconds per write and the mean CPU seconds per
// timed write (this process).
func bindingWrite(engine, lib string, count int, piece uint64, iters int, delay time.Duration) (float64, float64, error) {
	open := func(role string) (*nixl.Agent, error) {
		return nixl.Open(nixl.Config{Name: fmt.Sprintf("kvbench-nixl-%s-%d", role, time.Now().UnixNano()), Engine: engine,
			NIXLLib: lib, NIXLProgressDelay: delay, UCX: map[string]string{"TLS": "posix,cma,self"}})
	}
	a, err := open("ini")
	if err != nil {
		return 0, 0, err
	}
	defer a.Close()
	t, err := open("tgt")
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
// open and nothing to do.
func idleCPU(lib string, d time.Duration) (float64, error) {
	a, err := nixl.Open(nixl.Config{Name: fmt.Sprintf("kvbench-idle-%d", time.Now().UnixNano()), Engine: nixl.EngineLibNIXL, NIXLLib: lib})
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
		var cref, clib, cucx []float64
		var pref, plib, pucx []float64 // CPU seconds per write
		for r := 0; r < rounds; r++ {
			progress("nixl", step, steps)
			step++
			v, p, err := refWrite(ref, c.count, c.piece, iters, delay)
			if err != nil {
				return err
			}
			cref, pref = append(cref, v), append(pref, p)
			if v, p, err = bindingWrite(nixl.EngineLibNIXL, lib, c.count, c.piece, iters, delay); err != nil {
				return fmt.Errorf("libnixl: %w", err)
			}
			clib, plib = append(clib, v), append(plib, p)
			if v, p, err = bindingWrite(nixl.EngineUCX, "", c.count, c.piece, iters, delay); err != nil {
				return fmt.Errorf("ucx: %w", err)
			}
			cucx, pucx = append(cucx, v), append(pucx, p)
		}
		bytes := float64(uint64(c.count) * c.piece)
		gb := func(sec []float64) float64 { return bytes / median(sec) / 1e9 }
		perGB := func(cpu []float64) float64 { return median(cpu) / (bytes / 1e9) }
		b.add(Row{Mode: "nixl", Name: fmt.Sprintf("write %d × %s + notif", c.count, human(c.piece)), Bytes: uint64(bytes),
			Value: gb(clib), Unit: "GB/s", References: map[string]float64{"NIXL C program": gb(cref), "ucx engine": gb(cucx)},
			CPU: perGB(plib), CPUUnit: "s/GB", RefCPU: map[string]float64{"NIXL C program": perGB(pref), "ucx engine": perGB(pucx)}})
	}
	progress("nixl", step, steps)
	step++
	idleFor := 3 * time.Second
	if b.quick {
		idleFor = 500 * time.Millisecond
	}
	ours, err := idleCPU(lib, idleFor)
	if err != nil {
		return err
	}
	out, err := exec.Command(ref, "idle", strconv.Itoa(int(max(1, idleFor.Seconds()))), "0").CombinedOutput()
	if err != nil {
		return fmt.Errorf("nixlref idle: %v: %s", err, out)
	}
	spin, _ := strconv.ParseFloat(strings.TrimSpace(lastLine(string(out))), 64)
	b.add(Row{Mode: "nixl", Name: "idle agent, CPU", Value: 100 * ours / idleFor.Seconds(), Unit: "% of a core",
		References: map[string]float64{"NIXL default agent (progress delay 0)": 100 * spin / max(1, idleFor.Seconds())}})
	progress("nixl", step, steps)
	return b.nixlEndToEnd(ref, delay)
}

// nixlEndToEnd moves one model request (random pages) through a prefill
// and a decode rank on libnixl and on ucx, next to the NIXL C program
// writing the same descriptors.
func (b *bench) nixlEndToEnd(ref string, delay time.Duration) error {
	pages, tokens, iters := 1024, 4096, 5
	if b.quick {
		pages, tokens, iters = 256, 512, 2
	}
	n := tokens / b.model.PageTokens
	descs := n * 2 * b.model.Layers
	gbps, cpuRoom := map[string]float64{}, map[string]float64{}
	for _, engine := range []string{nixl.EngineLibNIXL, nixl.EngineUCX} {
		saved := b.engine
		b.engine = engine
		c, err := b.cluster(pages)
		b.engine = saved
		if err != nil {
			return fmt.Errorf("%s cluster: %w", engine, err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		all := scatter("contiguous", pages, pages, rng)
		if err := c.room(all, all); err != nil { // warm up: every page once
			c.close()
			return err
		}
		var secs []float64
		meter, err := cpustat.Start(0)
		if err != nil {
			c.close()
			return err
		}
		for i := 0; i < iters; i++ {
			src, dst := scatter("random", n, pages, rng), scatter("random", n, pages, rng)
			t0 := time.Now()
			if err := c.room(src, dst); err != nil {
				c.close()
				return err
			}
			secs = append(secs, time.Since(t0).Seconds())
		}
		used, err := meter.Read()
		c.close()
		if err != nil {
			return err
		}
		gbps[engine] = float64(descs) * float64(b.model.PageBytes()) / median(secs) / 1e9
		cpuRoom[engine] = used.Total().Seconds() / float64(iters)
	}
	v, refCPU, err := refWrite(ref, descs, b.model.PageBytes(), iters, delay)
	if err != nil {
		return err
	}
	gb := float64(descs) * float64(b.model.PageBytes()) / 1e9
	b.add(Row{Mode: "nixl", Name: fmt.Sprintf("e2e %s %d tok random, libnixl", b.model.Name, tokens),
		Bytes: uint64(descs) * b.model.PageBytes(), Value: gbps[nixl.EngineLibNIXL], Unit: "GB/s",
		References: map[string]float64{"NIXL C program, same descriptors": gb / v, "ucx engine, same request": gbps[nixl.EngineUCX]},
		CPU:        cpuRoom[nixl.EngineLibNIXL] / gb, CPUUnit: "s/GB", CPURoom: cpuRoom[nixl.EngineLibNIXL] * 1e6,
		RefCPU: map[string]float64{"NIXL C program, same descriptors": refCPU / gb, "ucx engine, same request": cpuRoom[nixl.EngineUCX] / gb}})
	return nil
}
