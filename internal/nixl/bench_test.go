package nixl

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/cpustat"
	"github.com/stretchr/testify/require"
)

// Engine write bandwidth. scripts/bench-engine.sh runs these next to
// ucx_perftest at the same sizes and transports and prints the ratios.
// Every benchmark also reports its CPU (user + system) per GB moved, of
// every process involved: cpu-s/GB (issue 24: ≤ 1.2 × ucx_perftest's on
// the same transport and memory); the cross-process ones also say the
// target process's share (tgt-cpu-s/GB).

// benchCPU measures the CPU of this process and of a target child (nil:
// none) over a benchmark's timed loop.
type benchCPU struct {
	m     *cpustat.Meter
	child *child
	c0    time.Duration
}

func startCPU(b *testing.B, c *child) *benchCPU {
	m, err := cpustat.Start(0)
	require.NoError(b, err)
	cpu := &benchCPU{m: m, child: c}
	if c != nil {
		cpu.c0 = childCPU(b, c)
	}
	return cpu
}

// childCPU asks a bench child for its CPU time so far: its own getrusage,
// to the microsecond (/proc counts 10 ms ticks, too coarse for a short
// benchmark). Call it outside the timed region.
func childCPU(b *testing.B, c *child) time.Duration {
	_, err := fmt.Fprintln(c.stdin, "cpu")
	require.NoError(b, err)
	ns, err := strconv.ParseInt(strings.Fields(c.line(b, "CPU"))[1], 10, 64)
	require.NoError(b, err)
	return time.Duration(ns)
}

// report reports cpu-s/GB over bytes moved, both processes, and
// tgt-cpu-s/GB, the child's share. Call it after StopTimer.
func (c *benchCPU) report(b *testing.B, bytes float64) {
	r, err := c.m.Read()
	require.NoError(b, err)
	total := r.Total()
	if c.child != nil {
		tgt := childCPU(b, c.child) - c.c0
		total += tgt
		b.ReportMetric(cpustat.PerGB(tgt, bytes), "tgt-cpu-s/GB")
	}
	b.ReportMetric(cpustat.PerGB(total, bytes), "cpu-s/GB")
}

var benchEngines = []engineCase{
	{"ucx-shm", func(n, _ string) Config { return Config{Name: n, Engine: EngineUCX, UCX: shmUCX} }, ""},
	{"ucx-tcp", func(n, _ string) Config { return Config{Name: n, Engine: EngineUCX, UCX: tcpUCX} }, ""},
	{"loopback", func(n, _ string) Config { return Config{Name: n, Engine: EngineLoopback} }, ""},
}

var benchSizes = []int{4 << 10, 64 << 10, 1 << 20, 64 << 20}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	default:
		return fmt.Sprintf("%dKiB", n>>10)
	}
}

// spin waits for a transfer to complete.
func spin(b *testing.B, a *Agent, x *Xfer) {
	if st, err := a.Wait(context.Background(), x); st != Done {
		b.Fatal(st, err)
	}
}

func benchWrite(b *testing.B, ec engineCase, pieces, piece int) {
	p := pair{ini: open(b, ec, "bini"), tgt: open(b, ec, "btgt")}
	_, src, err := p.ini.Alloc(uint64(pieces * piece))
	require.NoError(b, err)
	_, dst, err := p.tgt.Alloc(uint64(pieces * piece))
	require.NoError(b, err)
	p.remote = exchange(b, p.ini, p.tgt)
	var s, d []Desc
	for i := 0; i < pieces; i++ {
		s = append(s, BytesDesc(src[i*piece:(i+1)*piece]))
		d = append(d, BytesDesc(dst[i*piece:(i+1)*piece]))
	}
	l, _ := p.ini.PrepLocal(DRAM, s)
	r, _ := p.ini.PrepRemote(p.remote, DRAM, d)
	idx := make([]int, pieces)
	for i := range idx {
		idx[i] = i
	}
	x, err := p.ini.NewXfer(Write, l, idx, r, idx, nil)
	require.NoError(b, err)
	b.SetBytes(int64(pieces * piece))
	b.ResetTimer()
	cpu := startCPU(b, nil)
	for i := 0; i < b.N; i++ {
		if err := p.ini.Post(x); err != nil {
			b.Fatal(err)
		}
		spin(b, p.ini, x)
	}
	b.StopTimer()
	cpu.report(b, float64(pieces*piece)*float64(b.N))
	p.ini.Release(x)
}

func BenchmarkWrite(b *testing.B) {
	for _, ec := range benchEngines {
		for _, n := range benchSizes {
			b.Run(ec.name+"/"+sizeName(n), func(b *testing.B) { benchWrite(b, ec, 1, n) })
		}
	}
}

// BenchmarkWriteDescs: one request of 1,024 descriptors of 32 KiB (the
// shape of a paged KV chunk), against the 64 MiB single write.
// BenchmarkWriteDescs: one write of many contiguous descriptors, prepared
// one by one (a chunk of pages in a row), on every engine: coalesced into
// one operation per run (coalesce.go), it moves at the rate of one
// descriptor of the same bytes.
func BenchmarkWriteDescs(b *testing.B) {
	for _, ec := range benchEngines {
		b.Run(ec.name+"/1024x32KiB", func(b *testing.B) { benchWrite(b, ec, 1024, 32<<10) })
		b.Run(ec.name+"/16384x4KiB", func(b *testing.B) { benchWrite(b, ec, 16384, 4<<10) })
	}
}

// BenchmarkMemcpy is the physical reference: copy() between two UCX-mapped
// buffers of one process.
func BenchmarkMemcpy(b *testing.B) {
	a := open(b, benchEngines[0], "memcpy")
	for _, n := range benchSizes {
		b.Run(sizeName(n), func(b *testing.B) {
			_, src, _ := a.Alloc(uint64(n))
			_, dst, _ := a.Alloc(uint64(n))
			b.SetBytes(int64(n))
			cpu := startCPU(b, nil)
			for i := 0; i < b.N; i++ {
				copy(dst, src)
			}
			cpu.report(b, float64(n)*float64(b.N))
		})
	}
}

// The target process of the cross-process benchmarks: this test binary
// re-executed with KVBRIDGE_NIXL_BENCH_CHILD (by startChild, so it speaks
// the same protocol as runChild: "MD <metadata> <address>", then it
// lives until stdin closes; a line "cpu" on stdin is answered "CPU <its
// CPU time so far, ns>"). Unlike runChild, which polls for its test's
// "verify" notifications every 100 µs, it waits on NotifyC and drains,
// as a decode rank's notifier does, so the CPU it reports is the
// engine's and not a test's polling loop. TestMain runs it first, once
// every package's init has run (the ucx engine registers itself in its
// package's).
func benchChild() int {
	cfg := Config{Name: fmt.Sprintf("bench-child-%d", os.Getpid()), Engine: EngineUCX, UCX: shmUCX}
	if os.Getenv("KVBRIDGE_NIXL_CHILD") == "tcp" {
		cfg.UCX = tcpUCX
	}
	a, err := Open(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer a.Close()
	size, err := strconv.Atoi(os.Getenv("KVBRIDGE_NIXL_CHILD_SIZE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "KVBRIDGE_NIXL_CHILD_SIZE:", err)
		return 1
	}
	var buf []byte
	if os.Getenv("KVBRIDGE_NIXL_CHILD_MEM") == "caller" {
		if buf, err = syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON); err == nil {
			_, err = a.Register(DRAM, []Desc{BytesDesc(buf)})
		}
	} else {
		_, buf, err = a.Alloc(uint64(size))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fill(buf, 1) // first touch before the benchmark, as a serving engine's KV cache
	md, err := a.Metadata()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("MD %x %x\n", md, BytesDesc(buf).Addr)
	eof := make(chan struct{})
	go func() {
		defer close(eof)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			switch sc.Text() {
			case "cpu":
				fmt.Printf("CPU %d\n", cpustat.Self().Total().Nanoseconds())
			case "missed":
				// The wake-ups its event fd did not give (ucx engine).
				fmt.Printf("MISSED %d\n", a.Backend().(ucxDiagnostics).MissedWakes())
			}
		}
	}()
	wake := a.NotifyC()
	for {
		select {
		case <-eof:
			return 0
		case <-wake:
			a.Notifs()
		}
	}
}

// crossCase is one cross-process benchmark's set-up: this process's agent
// with the source registered as mem says, the target child, the source
// list, and the remote list of slots destinations of n bytes each, one
// after another in the child's buffer.
type crossCase struct {
	a     *Agent
	c     *child
	src   []byte // the local buffer (fill(src, 3) at the start)
	local *Prepped
	dests *Prepped
}

func newCrossCase(b testing.TB, transport string, ucx map[string]string, mem string, n, slots int) *crossCase {
	c := startChild(b, transport, "KVBRIDGE_NIXL_BENCH_CHILD=1", "KVBRIDGE_NIXL_CHILD_MEM="+mem,
		"KVBRIDGE_NIXL_CHILD_SIZE="+strconv.Itoa(n*slots))
	a, err := Open(Config{Name: fmt.Sprintf("bench-parent-%d", agentSeq.Add(1)), Engine: EngineUCX, UCX: ucx})
	require.NoError(b, err)
	b.Cleanup(func() { a.Close() })
	remote, err := a.LoadRemote(c.md)
	require.NoError(b, err)
	var src []byte
	if mem == "caller" {
		src, err = syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
		require.NoError(b, err)
		b.Cleanup(func() { syscall.Munmap(src) })
		_, err := a.Register(DRAM, []Desc{BytesDesc(src)})
		require.NoError(b, err)
	} else {
		_, src, err = a.Alloc(uint64(n))
		require.NoError(b, err)
	}
	fill(src, 3)
	l, err := a.PrepLocal(DRAM, []Desc{BytesDesc(src)})
	require.NoError(b, err)
	var ds []Desc
	for k := 0; k < slots; k++ {
		ds = append(ds, Desc{Addr: c.addr + uintptr(k*n), Len: uint64(n)})
	}
	r, err := a.PrepRemote(remote, DRAM, ds)
	require.NoError(b, err)
	return &crossCase{a: a, c: c, src: src, local: l, dests: r}
}

// xfer is a write of the source to destination slot k, with notif (nil:
// none).
func (cc *crossCase) xfer(b testing.TB, k int, notif []byte) *Xfer {
	return cc.xferOp(b, Write, k, notif)
}

// xferOp is xfer for either direction (a read fills the source from slot
// k).
func (cc *crossCase) xferOp(b testing.TB, op Op, k int, notif []byte) *Xfer {
	x, err := cc.a.NewXfer(op, cc.local, []int{0}, cc.dests, []int{k}, notif)
	require.NoError(b, err)
	b.Cleanup(func() { cc.a.Release(x) })
	return x
}

// stream makes streamDepth writes to successive slots (of slots), the
// last carrying notif.
func (cc *crossCase) stream(b testing.TB, slots int, notif string) []*Xfer {
	xs := make([]*Xfer, streamDepth)
	for k := range xs {
		var n []byte
		if k == len(xs)-1 {
			n = []byte(notif)
		}
		xs[k] = cc.xfer(b, k%slots, n)
	}
	return xs
}

func (cc *crossCase) wait(b testing.TB, x *Xfer) {
	if st, err := cc.a.Wait(context.Background(), x); st != Done {
		b.Fatal(st, err)
	}
}

var crossTransports = []struct {
	transport string
	ucx       map[string]string
}{{"shm", shmUCX}, {"tcp", tcpUCX}}

// BenchmarkWriteCrossProcess: the ucx engine between two processes, as
// ucx_perftest runs, on memory UCX allocated ("engine": a shared-memory
// peer maps it and the write is a copy) and on memory the caller allocated
// and registered ("caller", as a serving engine's KV cache: puts), every
// write with its notification and waited for. CPU: both processes.
func BenchmarkWriteCrossProcess(b *testing.B) {
	for _, tc := range crossTransports {
		for _, mem := range []string{"engine", "caller"} {
			for _, n := range []int{64 << 10, 1 << 20, 64 << 20} {
				b.Run(fmt.Sprintf("%s/%s/%s", tc.transport, mem, sizeName(n)), func(b *testing.B) {
					cc := newCrossCase(b, tc.transport, tc.ucx, mem, n, 1)
					cc.waited(b, cc.xfer(b, 0, []byte("bench")), n)
				})
			}
		}
	}
}

// BenchmarkReadCrossProcess: what a decode rank pulling a room would move
// — the ucx engine's reads (gets) of a peer process's memory — next to
// writes of the same bytes between the same two processes, interleaved in
// one run: engine and caller memory, shared memory and tcp, each op waited
// for, neither carrying a notification. CPU: both processes.
func BenchmarkReadCrossProcess(b *testing.B) {
	for _, tc := range crossTransports {
		for _, mem := range []string{"engine", "caller"} {
			for _, n := range []int{64 << 10, 1 << 20, 64 << 20} {
				for _, op := range []Op{Write, Read} {
					b.Run(fmt.Sprintf("%s/%s/%s/%v", tc.transport, mem, sizeName(n), op), func(b *testing.B) {
						cc := newCrossCase(b, tc.transport, tc.ucx, mem, n, 1)
						cc.waited(b, cc.xferOp(b, op, 0, nil), n)
					})
				}
			}
		}
	}
}

// waited runs x (n bytes) b.N times, each waited for, after one that warms
// up (connection, first touch), and reports the CPU of both processes.
func (cc *crossCase) waited(b *testing.B, x *Xfer, n int) {
	b.SetBytes(int64(n))
	once := func() {
		if err := cc.a.Post(x); err != nil {
			b.Fatal(err)
		}
		cc.wait(b, x)
	}
	once()
	cpu := startCPU(b, cc.c)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		once()
	}
	b.StopTimer()
	cpu.report(b, float64(n)*float64(b.N))
}

// streamDepth is how many writes to the peer a streamed benchmark keeps
// in flight: a chunk's writes, or the window.
const streamDepth = 8

// BenchmarkWriteStreamed: writes to one peer in flight together, the way
// ucx_perftest streams its puts and a transfer worker posts a chunk's
// writes (issue 24 part 4), cross-process as BenchmarkWriteCrossProcess:
//
//   - chunk8: one op is a chunk of 8 writes posted back to back, only the
//     last carrying the notification, then all 8 waited for (SetBytes is
//     the chunk's bytes);
//   - window8: one op is one write, 8 kept in flight at once (PostTo on
//     one completion channel, each finished write posted again at once);
//     one write of the 8 carries the notification, so one per 8 writes.
//
// The writes go to successive slots of the peer's buffer (at most 256
// MiB of it; 64 MiB writes share 4 slots). CPU: both processes.
func BenchmarkWriteStreamed(b *testing.B) {
	for _, tc := range crossTransports {
		for _, mem := range []string{"engine", "caller"} {
			for _, n := range []int{64 << 10, 1 << 20, 64 << 20} {
				slots := max(1, min(streamDepth, (256<<20)/n))
				b.Run(fmt.Sprintf("%s/%s/%s/chunk%d", tc.transport, mem, sizeName(n), streamDepth), func(b *testing.B) {
					cc := newCrossCase(b, tc.transport, tc.ucx, mem, n, slots)
					xs := cc.stream(b, slots, "chunk")
					chunk := func() {
						for _, x := range xs {
							if err := cc.a.Post(x); err != nil {
								b.Fatal(err)
							}
						}
						for _, x := range xs {
							cc.wait(b, x)
						}
					}
					chunk() // warm up (connection, first touch)
					b.SetBytes(int64(n * streamDepth))
					cpu := startCPU(b, cc.c)
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						chunk()
					}
					b.StopTimer()
					cpu.report(b, float64(n*streamDepth)*float64(b.N))
				})
				b.Run(fmt.Sprintf("%s/%s/%s/window%d", tc.transport, mem, sizeName(n), streamDepth), func(b *testing.B) {
					cc := newCrossCase(b, tc.transport, tc.ucx, mem, n, slots)
					xs := cc.stream(b, slots, "window")
					done := make(chan *Xfer, len(xs))
					// stream posts writes until total have been posted, at most
					// len(xs) in flight, and waits for all of them.
					stream := func(total int) {
						posted := 0
						for ; posted < min(total, len(xs)); posted++ {
							if err := cc.a.PostTo(xs[posted], done); err != nil {
								b.Fatal(err)
							}
						}
						for finished := 0; finished < total; finished++ {
							x := <-done
							if st, err := cc.a.Status(x); st != Done {
								b.Fatal(st, err)
							}
							if posted < total {
								if err := cc.a.PostTo(x, done); err != nil {
									b.Fatal(err)
								}
								posted++
							}
						}
					}
					stream(len(xs)) // warm up
					b.SetBytes(int64(n))
					cpu := startCPU(b, cc.c)
					b.ResetTimer()
					stream(b.N)
					b.StopTimer()
					cpu.report(b, float64(n)*float64(b.N))
				})
			}
		}
	}
}

// BenchmarkReadCanary: the cost of a READ's canaries (plantCanaries,
// undelivered: 8 bytes written and read back at the end of each
// destination descriptor) — cross-process reads of 32 MiB over shared
// memory into caller memory, as 1,024 descriptors of 32 KiB and as 8,192
// of 4 KiB, each waited for, with the canaries and without (canariesOff),
// the two interleaved under -count. CPU: both processes.
func BenchmarkReadCanary(b *testing.B) {
	const total = 32 << 20
	for _, piece := range []int{32 << 10, 4 << 10} {
		for _, mode := range []string{"canary", "unchecked"} {
			b.Run(fmt.Sprintf("%dx%s/%s", total/piece, sizeName(piece), mode), func(b *testing.B) {
				cc := newCrossCase(b, "shm", shmUCX, "caller", total, 1)
				var ld, rd []Desc
				idx := make([]int, total/piece)
				for i := range idx {
					ld = append(ld, BytesDesc(cc.src[i*piece:(i+1)*piece]))
					rd = append(rd, Desc{Addr: cc.c.addr + uintptr(i*piece), Len: uint64(piece)})
					idx[i] = i
				}
				l, err := cc.a.PrepLocal(DRAM, ld)
				require.NoError(b, err)
				r, err := cc.a.PrepRemote(cc.dests.Remote, DRAM, rd)
				require.NoError(b, err)
				x, err := cc.a.NewXfer(Read, l, idx, r, idx, nil)
				require.NoError(b, err)
				b.Cleanup(func() { cc.a.Release(x) })
				canariesOff.Store(mode == "unchecked")
				defer canariesOff.Store(false)
				cc.waited(b, x, total)
			})
		}
	}
}
