package nixl

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/cuda"
	"github.com/kvbridge/kvbridge/internal/cudadouble"
	"github.com/kvbridge/kvbridge/internal/leakcheck"
	"github.com/kvbridge/kvbridge/internal/nixldouble"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// doubleDir holds the NIXL C API test double built for this test binary.
var doubleDir string

// noGPU says why the VRAM cases run on the CUDA double ("" on a GPU).
var noGPU string

func TestMain(m *testing.M) {
	if os.Getenv("KVBRIDGE_NIXL_BENCH_CHILD") != "" {
		os.Exit(benchChild())
	}
	if os.Getenv("KVBRIDGE_NIXL_CHILD") != "" {
		os.Exit(runChild())
	}
	os.Exit(testMain(m))
}

// testMain builds the doubles into a temporary directory it removes before
// the process exits (goleak.VerifyTestMain would exit first and leave it).
func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "kvbridge-nixl-double")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if doubleLibPath, err = nixldouble.Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	doubleDir = dir
	// VRAM cases run on a GPU where the CUDA driver loads, else on the CUDA
	// driver test double (and the GPU variants report why they skip).
	if _, err := cuda.LoadDriver("libcuda.so.1"); err != nil {
		noGPU = err.Error()
		lib, err := cudadouble.Build(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		// The process's driver is the double (agents name no
		// Config.CUDALib), and the children's: their cfg.FromEnv reads it.
		if _, err := cuda.OpenDriver(lib); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		os.Setenv("KVBRIDGE_CUDA_LIB", lib)
	}
	return leakcheck.Run(m)
}

var doubleLibPath string

func doubleLib() string { return doubleLibPath }

// engineCase is one engine configuration the contract runs over.
type engineCase struct {
	name string
	cfg  func(name, role string) Config
	skip string // why this case does not run here ("" when it does)
}

var shmUCX = map[string]string{"TLS": "posix,cma,self"}
var tcpUCX = map[string]string{"TLS": "tcp", "NET_DEVICES": "lo", "TCP_TX_SEG_SIZE": "1M", "TCP_RX_SEG_SIZE": "1M"}

// allUCX: UCX's default transports (here self, tcp, posix, sysv, cma), tcp
// on loopback only.
var allUCX = map[string]string{"NET_DEVICES": "lo"}

// realNIXL is the real NIXL C API library the libnixl cases run against
// (KVBRIDGE_NIXL_LIB, as make test-nixl sets it), or "".
func realNIXL() string { return os.Getenv("KVBRIDGE_NIXL_LIB") }

// skipReal and skipDouble say why the real-NIXL or the double's libnixl
// cases do not run: one process loads one NIXL.
func skipReal() string {
	if realNIXL() == "" {
		return "KVBRIDGE_NIXL_LIB is not set: no real NIXL to run against (make test-nixl; see DEVELOPERS.md)"
	}
	return ""
}

func skipDouble() string {
	if realNIXL() != "" {
		return "KVBRIDGE_NIXL_LIB is set: this process runs the real NIXL, and one process loads one NIXL"
	}
	return ""
}

func engines() []engineCase {
	return []engineCase{
		{"loopback", func(n, _ string) Config { return Config{Name: n, Engine: EngineLoopback} }, ""},
		{"ucx-shm", func(n, _ string) Config { return Config{Name: n, Engine: EngineUCX, UCX: shmUCX} }, ""},
		{"ucx-tcp", func(n, _ string) Config { return Config{Name: n, Engine: EngineUCX, UCX: tcpUCX} }, ""},
		{"libnixl-double", func(n, role string) Config {
			return Config{Name: n, Engine: EngineLibNIXL, NIXLLib: doubleLib(), NIXLProgress: rankProgress(role)}
		}, skipDouble()},
		{"libnixl-real", func(n, role string) Config {
			return Config{Name: n, Engine: EngineLibNIXL, NIXLLib: realNIXL(), NIXLProgress: rankProgress(role)}
		}, skipReal()},
	}
}

// rankProgress is the progress mode kvbridge's ranks give a libnixl agent
// of this role (issue 22): the initiator ("ini", "bini") posts, as a
// prefill rank's agent (no progress thread); the target is written to, as
// a decode rank's.
func rankProgress(role string) NIXLProgress {
	if strings.HasSuffix(role, "ini") {
		return NIXLProgressCaller
	}
	return NIXLProgressThread
}

var agentSeq atomic.Int64

// pair opens an initiator and a target agent and loads the target's
// metadata into the initiator (and back, for notifications both ways).
type pair struct {
	ini, tgt *Agent
	remote   string
}

func open(t testing.TB, ec engineCase, role string) *Agent {
	t.Helper()
	a, err := Open(ec.cfg(fmt.Sprintf("%s-%s-%d", ec.name, role, agentSeq.Add(1)), role))
	require.NoError(t, err, "%s: open", ec.name)
	t.Cleanup(func() { a.Close() })
	return a
}

func exchange(t testing.TB, ini, tgt *Agent) string {
	t.Helper()
	md, err := tgt.Metadata()
	require.NoError(t, err)
	name, err := ini.LoadRemote(md)
	require.NoError(t, err)
	require.Equal(t, tgt.Name(), name, "LoadRemote returned")
	back, err := ini.Metadata()
	require.NoError(t, err)
	_, err = tgt.LoadRemote(back)
	require.NoError(t, err)
	return name
}

// wait waits for a transfer to reach a final state, bounded by a deadline.
func wait(t testing.TB, a *Agent, x *Xfer, d time.Duration) (XferState, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	st, err := a.Wait(ctx, x)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("transfer still in progress after %v", d)
	}
	return st, err
}

// waitNotif polls for one notification from remote.
func waitNotif(t testing.TB, a *Agent, d time.Duration) Notif {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ns, err := a.Notifs()
		require.NoError(t, err)
		require.LessOrEqual(t, len(ns), 1, "got notifications, want one: %q", ns)
		if len(ns) == 1 {
			return ns[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no notification within %v", d)
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// fill writes seed's pattern over b: a block of 1 MiB of pseudo-random
// bytes repeated, every 256 bytes stamped with its offset and the seed,
// so no two 256-byte pieces of a buffer (or of two seeds' buffers) are
// alike, and a piece moved anywhere but onto itself differs (one under
// 256 bytes only if moved by a multiple of 1 MiB). Copies of the block
// and a store per stamp, not a store per byte: under the race detector
// that took 3.3 s for 256 MiB, and the contract's buffers add up to GiBs.
func fill(b []byte, seed uint64) {
	const block, stamp = 1 << 20, 256
	base := make([]byte, min(len(b), block)+8)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(base); i += 8 {
		binary.LittleEndian.PutUint64(base[i:], r.Uint64())
	}
	for off := 0; off < len(b); off += block {
		copy(b[off:], base[:len(base)-8])
	}
	for off := 0; off+8 <= len(b); off += stamp {
		binary.LittleEndian.PutUint64(b[off:], uint64(off)*0x9e3779b97f4a7c15^seed)
	}
}

func write(t testing.TB, p pair, src, dst []Desc, notif []byte) *Xfer {
	t.Helper()
	l, err := p.ini.PrepLocal(DRAM, src)
	require.NoError(t, err)
	r, err := p.ini.PrepRemote(p.remote, DRAM, dst)
	require.NoError(t, err)
	idx := make([]int, len(src))
	for i := range idx {
		idx[i] = i
	}
	x, err := p.ini.NewXfer(Write, l, idx, r, idx, notif)
	require.NoError(t, err)
	require.NoError(t, p.ini.Post(x))
	return x
}

func TestContract(t *testing.T) {
	for _, ec := range engines() {
		t.Run(ec.name, func(t *testing.T) {
			if ec.skip != "" {
				t.Skip(ec.skip)
			}
			t.Run("metadata", func(t *testing.T) { contractMetadata(t, ec) })
			t.Run("256MiB", func(t *testing.T) { contractBulk(t, ec) })
			t.Run("4096x32KiB", func(t *testing.T) { contractScatter(t, ec) })
			t.Run("notifications", func(t *testing.T) { contractNotifs(t, ec) })
			t.Run("read", func(t *testing.T) { contractRead(t, ec) })
			t.Run("bad descriptors", func(t *testing.T) { contractBadDescs(t, ec) })
			t.Run("invalidate in flight", func(t *testing.T) { contractInvalidate(t, ec) })
			t.Run("concurrent posts", func(t *testing.T) { contractConcurrent(t, ec) })
			t.Run("close in flight", func(t *testing.T) { contractCloseInFlight(t, ec) })
			t.Run("release in flight", func(t *testing.T) { contractReleaseInFlight(t, ec) })
			t.Run("post after deregister", func(t *testing.T) { contractPostAfterDeregister(t, ec) })
			t.Run("post after reload", func(t *testing.T) { contractPostAfterReload(t, ec) })
		})
	}
}

func newPair(t *testing.T, ec engineCase) pair {
	ini, tgt := open(t, ec, "ini"), open(t, ec, "tgt")
	return pair{ini: ini, tgt: tgt}
}

func contractMetadata(t *testing.T, ec engineCase) {
	p := newPair(t, ec)
	_, _, err := p.tgt.Alloc(4096)
	require.NoError(t, err)
	exchange(t, p.ini, p.tgt)
	for name, md := range map[string][]byte{
		"empty":     nil,
		"garbage":   []byte("not metadata at all"),
		"truncated": func() []byte { m, _ := p.tgt.Metadata(); return m[:len(m)/2] }(),
	} {
		_, err := p.ini.LoadRemote(md)
		assert.ErrorIs(t, err, ErrBadMetadata, "%s metadata", name)
	}
	other := engines()[0]
	if ec.name == "loopback" {
		other = engines()[1]
	}
	o := open(t, other, "other")
	md, _ := o.Metadata()
	_, err = p.ini.LoadRemote(md)
	assert.ErrorIs(t, err, ErrBadMetadata, "another engine's metadata")
}

func contractBulk(t *testing.T, ec engineCase) {
	const size = 256 << 20
	p := newPair(t, ec)
	_, src, err := p.ini.Alloc(size)
	require.NoError(t, err)
	_, dst, err := p.tgt.Alloc(size)
	require.NoError(t, err)
	fill(src, 1)
	p.remote = exchange(t, p.ini, p.tgt)
	x := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, []byte("bulk"))
	st, err := wait(t, p.ini, x, time.Minute)
	require.Equal(t, Done, st, "state: %v", err)
	n := waitNotif(t, p.tgt, time.Minute)
	require.Equal(t, "bulk", string(n.Msg), "notif %+v", n)
	require.Equal(t, p.ini.Name(), n.Remote, "notif %+v", n)
	require.Equal(t, crc32.ChecksumIEEE(src), crc32.ChecksumIEEE(dst), "256 MiB arrived corrupted")
	p.ini.Release(x)
}

func contractScatter(t *testing.T, ec engineCase) {
	const n, piece = 4096, 32 << 10
	p := newPair(t, ec)
	_, src, err := p.ini.Alloc(n * piece)
	require.NoError(t, err)
	_, dst, err := p.tgt.Alloc(n * piece)
	require.NoError(t, err)
	fill(src, 2)
	p.remote = exchange(t, p.ini, p.tgt)
	// Scatter: source piece i goes to destination piece perm[i].
	perm := rand.New(rand.NewPCG(3, 3)).Perm(n)
	var s, d []Desc
	for i := 0; i < n; i++ {
		s = append(s, BytesDesc(src[i*piece:(i+1)*piece]))
		d = append(d, BytesDesc(dst[perm[i]*piece:(perm[i]+1)*piece]))
	}
	x := write(t, p, s, d, []byte("scatter"))
	st, err := wait(t, p.ini, x, time.Minute)
	require.Equal(t, Done, st, "state: %v", err)
	waitNotif(t, p.tgt, time.Minute)
	for i := 0; i < n; i++ {
		require.True(t, bytes.Equal(src[i*piece:(i+1)*piece], dst[perm[i]*piece:(perm[i]+1)*piece]), "piece %d corrupted", i)
	}
	p.ini.Release(x)
}

// Notifications arrive after the data and exactly once, also on repost.
func contractNotifs(t *testing.T, ec engineCase) {
	const size = 8 << 20
	p := newPair(t, ec)
	_, src, _ := p.ini.Alloc(size)
	_, dst, _ := p.tgt.Alloc(size)
	p.remote = exchange(t, p.ini, p.tgt)
	l, _ := p.ini.PrepLocal(DRAM, []Desc{BytesDesc(src)})
	r, _ := p.ini.PrepRemote(p.remote, DRAM, []Desc{BytesDesc(dst)})
	x, err := p.ini.NewXfer(Write, l, []int{0}, r, []int{0}, []byte("round"))
	require.NoError(t, err)
	for round := byte(1); round <= 3; round++ {
		for i := range src {
			src[i] = round
		}
		require.NoError(t, p.ini.Post(x))
		n := waitNotif(t, p.tgt, time.Minute)
		// The notification must not overtake the data.
		require.Equal(t, round, dst[0], "round %d: notification %q arrived before the data", round, n.Msg)
		require.Equal(t, round, dst[size-1], "round %d: notification %q arrived before the data", round, n.Msg)
		require.True(t, bytes.Equal(dst, src), "round %d: notification %q arrived before the data", round, n.Msg)
		st, err := wait(t, p.ini, x, time.Minute)
		require.Equal(t, Done, st, "state: %v", err)
	}
	require.NoError(t, p.ini.GenNotif(p.remote, []byte("plain")))
	n := waitNotif(t, p.tgt, time.Minute)
	require.Equal(t, "plain", string(n.Msg), "GenNotif delivered")
	// Exactly once: nothing more is pending.
	time.Sleep(10 * time.Millisecond)
	ns, _ := p.tgt.Notifs()
	require.Empty(t, ns, "duplicate notifications: %q", ns)
	require.ErrorIs(t, p.ini.GenNotif("nobody", nil), ErrRemoteUnknown, "notify unknown")
	p.ini.Release(x)
}

func contractRead(t *testing.T, ec engineCase) {
	const size = 4 << 20
	p := newPair(t, ec)
	_, local, _ := p.ini.Alloc(size)
	_, remote, _ := p.tgt.Alloc(size)
	fill(remote, 4)
	p.remote = exchange(t, p.ini, p.tgt)
	l, _ := p.ini.PrepLocal(DRAM, []Desc{BytesDesc(local)})
	r, _ := p.ini.PrepRemote(p.remote, DRAM, []Desc{BytesDesc(remote)})
	x, err := p.ini.NewXfer(Read, l, []int{0}, r, []int{0}, nil)
	require.NoError(t, err)
	require.NoError(t, p.ini.Post(x))
	st, err := wait(t, p.ini, x, time.Minute)
	require.Equal(t, Done, st, "state: %v", err)
	require.True(t, bytes.Equal(local, remote), "READ returned wrong bytes")
	p.ini.Release(x)
}

func contractBadDescs(t *testing.T, ec engineCase) {
	p := newPair(t, ec)
	_, src, _ := p.ini.Alloc(1 << 20)
	_, dst, _ := p.tgt.Alloc(1 << 20)
	p.remote = exchange(t, p.ini, p.tgt)
	outside := make([]byte, 4096) // never registered
	for name, err := range map[string]error{
		"local outside": func() error { _, err := p.ini.PrepLocal(DRAM, []Desc{BytesDesc(outside)}); return err }(),
		"local overruns": func() error {
			_, err := p.ini.PrepLocal(DRAM, []Desc{{Addr: BytesDesc(src).Addr, Len: 1<<20 + 1}})
			return err
		}(),
		"remote outside":    func() error { _, err := p.ini.PrepRemote(p.remote, DRAM, []Desc{BytesDesc(src)}); return err }(),
		"remote wrong kind": func() error { _, err := p.ini.PrepRemote(p.remote, VRAM, []Desc{BytesDesc(dst)}); return err }(),
		"zero length":       func() error { _, err := p.ini.PrepLocal(DRAM, []Desc{{Addr: BytesDesc(src).Addr}}); return err }(),
		"register nothing":  func() error { _, err := p.ini.Register(DRAM, nil); return err }(),
		"register null":     func() error { _, err := p.ini.Register(DRAM, []Desc{{Len: 10}}); return err }(),
		"register wraps":    func() error { _, err := p.ini.Register(DRAM, []Desc{{Addr: ^uintptr(0) - 4, Len: 10}}); return err }(),
	} {
		assert.ErrorIs(t, err, ErrInvalidDescriptor, name)
	}
	_, err := p.ini.PrepRemote("nobody", DRAM, []Desc{BytesDesc(dst)})
	assert.ErrorIs(t, err, ErrRemoteUnknown, "unknown remote")
	l, _ := p.ini.PrepLocal(DRAM, []Desc{BytesDesc(src[:4096]), BytesDesc(src[4096:8192])})
	r, _ := p.ini.PrepRemote(p.remote, DRAM, []Desc{BytesDesc(dst[:4096]), BytesDesc(dst[:100])})
	_, err = p.ini.NewXfer(Write, l, []int{0, 2}, r, []int{0, 1}, nil)
	assert.ErrorIs(t, err, ErrInvalidDescriptor, "index out of range")
	_, err = p.ini.NewXfer(Write, l, []int{1}, r, []int{1}, nil)
	assert.ErrorIs(t, err, ErrInvalidRequest, "length mismatch")
	_, err = p.ini.NewXfer(Write, l, []int{0}, l, []int{0}, nil)
	assert.ErrorIs(t, err, ErrInvalidRequest, "local as remote")
	_, err = p.ini.NewXfer(Write, l, nil, r, nil, nil)
	assert.ErrorIs(t, err, ErrInvalidRequest, "empty request")
}

// A remote invalidated with a write in flight ends in Done or Failed,
// never a hang.
func contractInvalidate(t *testing.T, ec engineCase) {
	const size = 64 << 20
	p := newPair(t, ec)
	_, src, _ := p.ini.Alloc(size)
	_, dst, _ := p.tgt.Alloc(size)
	p.remote = exchange(t, p.ini, p.tgt)
	x := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, []byte("x"))
	require.NoError(t, p.ini.InvalidateRemote(p.remote))
	st, err := wait(t, p.ini, x, time.Minute)
	t.Logf("after invalidate: %v %v", st, err)
	require.ErrorIs(t, p.ini.Post(x), ErrRemoteUnknown, "post after invalidate")
	require.ErrorIs(t, p.ini.InvalidateRemote(p.remote), ErrRemoteUnknown, "second invalidate")
	p.ini.Release(x)
}

func contractConcurrent(t *testing.T, ec engineCase) {
	const goroutines, each, piece = 8, 25, 64 << 10
	p := newPair(t, ec)
	_, src, _ := p.ini.Alloc(goroutines * each * piece)
	_, dst, _ := p.tgt.Alloc(goroutines * each * piece)
	fill(src, 5)
	p.remote = exchange(t, p.ini, p.tgt)
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				off := (g*each + i) * piece
				l, err := p.ini.PrepLocal(DRAM, []Desc{BytesDesc(src[off : off+piece])})
				if err != nil {
					errs <- err
					return
				}
				r, err := p.ini.PrepRemote(p.remote, DRAM, []Desc{BytesDesc(dst[off : off+piece])})
				if err != nil {
					errs <- err
					return
				}
				x, err := p.ini.NewXfer(Write, l, []int{0}, r, []int{0}, nil)
				if err == nil {
					err = p.ini.Post(x)
				}
				if err != nil {
					errs <- err
					return
				}
				if st, err := wait(t, p.ini, x, time.Minute); st != Done {
					errs <- fmt.Errorf("goroutine %d xfer %d: %v %v", g, i, st, err)
					return
				}
				p.ini.Release(x)
				l.Release()
				r.Release()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.True(t, bytes.Equal(src, dst), "concurrent writes corrupted data")
}

func contractCloseInFlight(t *testing.T, ec engineCase) {
	const size = 64 << 20
	p := newPair(t, ec)
	_, src, _ := p.ini.Alloc(size)
	_, dst, _ := p.tgt.Alloc(size)
	p.remote = exchange(t, p.ini, p.tgt)
	x := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, nil)
	done := make(chan error, 1)
	go func() { done <- p.ini.Close() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Close hung with a transfer in flight")
	}
	require.NoError(t, p.ini.Close(), "second Close")
	st, _ := p.ini.Status(x)
	require.NotEqual(t, InProgress, st, "a transfer still in progress after Close")
	require.ErrorIs(t, p.ini.Post(x), ErrClosed, "post after close")
}

// Transfers released while in flight (a room aborted mid-write) are
// cancelled on every engine without harm to the agent: 8 writes of 32 MiB
// each released right after its post (on the ucx engine over shared
// memory, while its copy runs: the copy's end wrote into the freed
// transfer), then a write lands byte-exact.
func contractReleaseInFlight(t *testing.T, ec engineCase) {
	const size = 32 << 20
	p := newPair(t, ec)
	_, src, _ := p.ini.Alloc(size)
	_, dst, _ := p.tgt.Alloc(size)
	p.remote = exchange(t, p.ini, p.tgt)
	fill(src, 41)
	for i := range 8 {
		x := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, nil)
		require.NoError(t, p.ini.Release(x), "release %d in flight", i)
	}
	clear(dst)
	x := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, nil)
	st, err := wait(t, p.ini, x, time.Minute)
	require.Equal(t, Done, st, "a write after 8 released in flight: %v", err)
	require.True(t, bytes.Equal(src, dst), "a write after 8 released in flight: %v %v", st, err)
	p.ini.Release(x)
}

// A remote list prepared before the remote's metadata was loaded again is
// refused at post (the ucx engine wrote through the old mapping, unmapped
// by the reload, and crashed): prepared again, it works.
func contractPostAfterReload(t *testing.T, ec engineCase) {
	p := newPair(t, ec)
	_, src, _ := p.ini.Alloc(1 << 20)
	_, dst, _ := p.tgt.Alloc(1 << 20)
	p.remote = exchange(t, p.ini, p.tgt)
	fill(src, 31)
	l, _ := p.ini.PrepLocal(DRAM, []Desc{BytesDesc(src)})
	r, _ := p.ini.PrepRemote(p.remote, DRAM, []Desc{BytesDesc(dst)})
	md, _ := p.tgt.Metadata()
	_, err := p.ini.LoadRemote(md)
	require.NoError(t, err)
	x, err := p.ini.NewXfer(Write, l, []int{0}, r, []int{0}, nil)
	require.NoError(t, err)
	require.ErrorIs(t, p.ini.Post(x), ErrStalePrep, "post from a list prepared before the reload")
	p.ini.Release(x)
	r2, err := p.ini.PrepRemote(p.remote, DRAM, []Desc{BytesDesc(dst)})
	require.NoError(t, err)
	x = write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, nil)
	st, err := wait(t, p.ini, x, time.Minute)
	require.Equal(t, Done, st, "after preparing again: %v", err)
	require.True(t, bytes.Equal(src, dst), "after preparing again: %v %v", st, err)
	p.ini.Release(x)
	r.Release()
	r2.Release()
	l.Release()
}

func TestOpenErrors(t *testing.T) {
	_, err := Open(Config{Name: "x", Engine: "warp"})
	require.ErrorIs(t, err, ErrEngineUnavailable, "unknown engine")
	_, err = Open(Config{Engine: EngineLoopback})
	require.Error(t, err, "empty name accepted")
	_, err = openLibNIXL(Config{Name: "x", NIXLLib: "/nonexistent/libnixl_capi.so"})
	require.ErrorIs(t, err, ErrEngineUnavailable, "missing NIXL")
	require.ErrorContains(t, err, "NIXL is not installed", "missing NIXL")
	a, err := Open(Config{Name: "dup", Engine: EngineLoopback})
	require.NoError(t, err)
	defer a.Close()
	_, err = Open(Config{Name: "dup", Engine: EngineLoopback})
	require.Error(t, err, "duplicate loopback name accepted")
}

// runChild is the peer process for the cross-process tests: it opens a ucx
// agent, allocates a target buffer, prints its metadata, and on a
// notification "verify" prints the buffer's CRC. It exits on stdin EOF.
func runChild() int {
	if os.Getenv("KVBRIDGE_NIXL_CHILD") == "nixl-only" {
		return nixlOnlyChild()
	}
	if os.Getenv("KVBRIDGE_NIXL_CHILD") == "silent" {
		return silentChild()
	}
	if os.Getenv("KVBRIDGE_NIXL_CHILD") == "writer" {
		return writerChild()
	}
	if os.Getenv("KVBRIDGE_NIXL_CHILD") == "lone" {
		_, err := Open(Config{Name: "lone", Engine: EngineLibNIXL, NIXLLib: os.Getenv("KVBRIDGE_NIXL_LONE")})
		fmt.Printf("ERR %v\n", err)
		return 0
	}
	cfg := Config{Name: "child-" + os.Getenv("KVBRIDGE_NIXL_CHILD"), Engine: EngineUCX, UCX: shmUCX}
	switch os.Getenv("KVBRIDGE_NIXL_CHILD") {
	case "tcp":
		cfg.UCX = tcpUCX
	case "all":
		cfg.UCX = allUCX
	}
	cfg.FromEnv() // a binary of its own: the CUDA double's path
	a, err := Open(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer a.Close()
	var size uint64 = 256 << 20
	if v, err := strconv.ParseUint(os.Getenv("KVBRIDGE_NIXL_CHILD_SIZE"), 10, 64); err == nil {
		size = v
	}
	var buf []byte
	var addr uintptr
	// In "vram" mode the target is device memory; verify reads it back.
	var ctx *cuda.Context
	var dev cuda.DevicePtr
	if os.Getenv("KVBRIDGE_NIXL_CHILD") == "vram" {
		if ctx, err = cudaContext(cfg.CUDALib, 0); err == nil {
			dev, err = ctx.Alloc(size)
		}
		if err == nil {
			_, err = a.Register(VRAM, []Desc{{Addr: uintptr(dev), Len: size}})
		}
		buf, addr = make([]byte, size), uintptr(dev)
	} else if os.Getenv("KVBRIDGE_NIXL_CHILD_MEM") == "caller" {
		// Memory the caller allocated and registers, as a serving engine's
		// KV cache is (not UCX's own allocation).
		if buf, err = syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON); err == nil {
			_, err = a.Register(DRAM, []Desc{BytesDesc(buf)})
		}
		addr = BytesDesc(buf).Addr
	} else {
		_, buf, err = a.Alloc(size)
		addr = BytesDesc(buf).Addr
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	md, err := a.Metadata()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "child %s: pid %d\n", cfg.Name, os.Getpid())
	fmt.Printf("MD %x %x\n", md, addr)
	eof := make(chan struct{})
	go func() {
		b := make([]byte, 1)
		for {
			if _, err := os.Stdin.Read(b); err != nil {
				close(eof)
				return
			}
		}
	}()
	for {
		select {
		case <-eof:
			return 0
		default:
		}
		ns, _ := a.Notifs()
		for _, n := range ns {
			if strings.HasPrefix(string(n.Msg), "verify:") {
				var ln int
				fmt.Sscanf(string(n.Msg), "verify:%d", &ln)
				if ctx != nil {
					if err := ctx.CopyDtoH(buf[:ln], dev); err != nil {
						fmt.Fprintln(os.Stderr, err)
					}
				}
				fmt.Printf("CRC %08x\n", crc32.ChecksumIEEE(buf[:ln]))
			}
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// contractPostAfterDeregister: a transfer built from a list prepared before
// its memory was deregistered is refused at post (issue 14: the ucx engine
// copied from unmapped memory and died in memmove).
func contractPostAfterDeregister(t *testing.T, ec engineCase) {
	p := newPair(t, ec)
	reg, src, err := p.ini.Alloc(1 << 20)
	require.NoError(t, err)
	_, dst, _ := p.tgt.Alloc(1 << 20)
	p.remote = exchange(t, p.ini, p.tgt)
	l, err := p.ini.PrepLocal(DRAM, []Desc{BytesDesc(src)})
	require.NoError(t, err)
	r, err := p.ini.PrepRemote(p.remote, DRAM, []Desc{BytesDesc(dst)})
	require.NoError(t, err)
	x, err := p.ini.NewXfer(Write, l, []int{0}, r, []int{0}, nil)
	require.NoError(t, err)
	require.NoError(t, p.ini.Deregister(reg))
	require.ErrorIs(t, p.ini.Post(x), ErrInvalidDescriptor, "post after deregister")
	// Memory registered again is usable again.
	_, src2, _ := p.ini.Alloc(1 << 20)
	l2, _ := p.ini.PrepLocal(DRAM, []Desc{BytesDesc(src2)})
	x2, err := p.ini.NewXfer(Write, l2, []int{0}, r, []int{0}, nil)
	require.NoError(t, err)
	require.NoError(t, p.ini.Post(x2))
	st, err := wait(t, p.ini, x2, time.Minute)
	require.Equal(t, Done, st, err)
	p.ini.Release(x2)
}

// TestUCXRefusesHostileWorkerAddresses: a well-formed metadata blob whose
// UCX worker address is garbage is refused before UCX parses it (issue 14:
// UCX 1.13 asserts in ucp_ep_create and aborts the process).
func TestUCXRefusesHostileWorkerAddresses(t *testing.T) {
	a, err := Open(Config{Name: "hostile-md", Engine: EngineUCX, UCX: shmUCX})
	require.NoError(t, err)
	defer a.Close()
	random := make([]byte, 300)
	for i := range random {
		random[i] = byte(i*131 + 7)
	}
	random[0] = 0xf7 // a header no UCX writes (version 7)
	for name, payload := range map[string][]byte{
		"empty":          nil,
		"one byte":       {0x00},
		"random":         random,
		"64 KiB of 0xff": bytes.Repeat([]byte{0xff}, 64<<10),
		"too long":       make([]byte, MaxWorkerAddress+1),
	} {
		md := (&MetadataBlob{Engine: EngineUCX, Agent: "forger", Payload: payload}).Encode()
		_, err := a.LoadRemote(md)
		assert.ErrorIs(t, err, ErrBadMetadata, name)
	}
}

// TestUCXSettingsPerAgent: transport settings apply to the agent that was
// given them and never to the process (issue 14: os.Setenv made the first
// agent's settings everyone's and raced with UCX's threads).
func TestUCXSettingsPerAgent(t *testing.T) {
	if v, ok := os.LookupEnv("UCX_TCP_TX_SEG_SIZE"); ok {
		t.Skipf("UCX_TCP_TX_SEG_SIZE=%s is set in the environment", v)
	}
	// TX above RX is refused by UCX's tcp transport: proof the setting
	// reached this agent's transport.
	bad := map[string]string{"TLS": "tcp", "NET_DEVICES": "lo", "TCP_TX_SEG_SIZE": "1M"}
	if a, err := Open(Config{Name: "ucx-bad-seg", Engine: EngineUCX, UCX: bad}); err == nil {
		a.Close()
		t.Fatal("an agent with TCP_TX_SEG_SIZE above the RX size opened: the setting was not applied")
	}
	_, ok := os.LookupEnv("UCX_TCP_TX_SEG_SIZE")
	require.False(t, ok, "opening an agent wrote UCX_TCP_TX_SEG_SIZE into the process environment")
	// Another agent in the same process is unaffected.
	a, err := Open(Config{Name: "ucx-default-seg", Engine: EngineUCX, UCX: map[string]string{"TLS": "tcp", "NET_DEVICES": "lo"}})
	require.NoError(t, err)
	a.Close()
	_, err = Open(Config{Name: "ucx-conflict", Engine: EngineUCX, UCX: map[string]string{"TCP_TX_SEG_SIZE": "1M", "DC_TX_SEG_SIZE": "2M"}})
	require.ErrorIs(t, err, ErrInvalidRequest, "conflicting unprefixed settings")
}
