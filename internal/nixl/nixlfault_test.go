package nixl

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/nixldouble"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 22: a peer that dies mid-transfer, and bad metadata, on the libnixl
// engine (NIXL 1.4.0's failures, modelled by the NIXL double).

// issue22Blobs are item 3's two blobs made from a genuine NIXL blob: its
// last byte dropped, and its last 64 bytes set to 0xff.
func issue22Blobs(genuine []byte) map[string][]byte {
	ff := bytes.Clone(genuine)
	for i := max(len(ff)-64, 0); i < len(ff); i++ {
		ff[i] = 0xff
	}
	return map[string][]byte{"last byte dropped": bytes.Clone(genuine[:len(genuine)-1]), "last 64 bytes 0xff": ff}
}

// TestNIXLBlobWalk: the blob check walks NIXL 1.x's memory section to the
// blob's end: item 3's blobs, every truncation, trailing bytes and a
// descriptor shorter than nixlBasicDesc are refused; the genuine blob
// parses.
func TestNIXLBlobWalk(t *testing.T) {
	genuine := nixlBlob("peer", [2][]byte{[]byte("UCX"), []byte("address")})
	md, err := parseNIXLMD(genuine)
	require.NoError(t, err, "genuine: %+v", md)
	require.Equal(t, "peer", md.agent, "genuine: %+v", md)
	require.Equal(t, "address", string(md.conns["UCX"]), "genuine: %+v", md)
	for name, b := range issue22Blobs(genuine) {
		_, err := parseNIXLMD(b)
		assert.Error(t, err, "%s: parsed", name)
	}
	for n := len(nixlSerDesMagic); n < len(genuine); n++ {
		_, err := parseNIXLMD(genuine[:n])
		require.Error(t, err, "truncated to %d of %d bytes: parsed", n, len(genuine))
	}
	_, err = parseNIXLMD(append(bytes.Clone(genuine), 0xff))
	assert.ErrorContains(t, err, "after the memory section", "a trailing byte")
	short := bytes.Clone(genuine)
	i := bytes.LastIndex(short, []byte("rkeyrkey"))
	// The last descriptor's length field (8 bytes before its 32 bytes),
	// made 23: what follows no longer frames.
	short[i-24-8] = 23
	_, err = parseNIXLMD(short)
	assert.Error(t, err, "a 23-byte descriptor: parsed")
}

// envelopeWith is md with its NIXL blob replaced.
func envelopeWith(t *testing.T, a *Agent, md, payload []byte) []byte {
	t.Helper()
	m, err := DecodeMetadata(md, EngineLibNIXL, a.b.(*libnixl).library)
	require.NoError(t, err)
	m.Payload = payload
	return m.Encode()
}

// TestLibNIXLBadThenGenuineMetadata (issue 22 item 3): NIXL 1.4.0 keeps
// the connection info of a blob whose memory section it refuses and then
// refuses that agent's genuine blob too (the double does the same). Item
// 3's blobs are refused before NIXL sees them, and the genuine blob then
// loads and is written to byte-exact, whether or not a good load came
// first. On the NIXL double, or on a real NIXL (make test-nixl: NIXL 1.4.0
// refuses the genuine blob after either of them, nixlfault md).
func TestLibNIXLBadThenGenuineMetadata(t *testing.T) {
	onNIXL(t, func(t *testing.T, lib string) {
		for _, goodFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("good-first=%v", goodFirst), func(t *testing.T) {
				mk := func(role string) *Agent {
					a, err := Open(Config{Name: fmt.Sprintf("nx-md-%s-%v", role, goodFirst), Engine: EngineLibNIXL, NIXLLib: lib,
						NIXLProgress: rankProgress(role)})
					require.NoError(t, err)
					t.Cleanup(func() { a.Close() })
					return a
				}
				ini, tgt := mk("ini"), mk("tgt")
				_, src, _ := ini.Alloc(1 << 16)
				_, dst, _ := tgt.Alloc(1 << 16)
				md, err := tgt.Metadata()
				require.NoError(t, err)
				m, err := DecodeMetadata(md, EngineLibNIXL, ini.b.(*libnixl).library)
				require.NoError(t, err)
				if goodFirst {
					_, err := ini.LoadRemote(md)
					require.NoError(t, err)
				}
				for name, b := range issue22Blobs(m.Payload) {
					_, err := ini.LoadRemote(envelopeWith(t, ini, md, b))
					require.ErrorIs(t, err, ErrBadMetadata, "%s", name)
				}
				assert.EqualValues(t, 2, ini.MetadataRefused(), "blobs refused")
				name, err := ini.LoadRemote(md)
				require.NoError(t, err, "the genuine blob after item 3's")
				for i := range src {
					src[i] = byte(i*7 + 3)
				}
				l, _ := ini.PrepLocal(DRAM, []Desc{BytesDesc(src)})
				r, err := ini.PrepRemote(name, DRAM, []Desc{BytesDesc(dst)})
				require.NoError(t, err)
				x, err := ini.NewXfer(Write, l, []int{0}, r, []int{0}, nil)
				if err == nil {
					err = ini.Post(x)
				}
				require.NoError(t, err)
				st, err := wait(t, ini, x, time.Minute)
				require.NoError(t, err, "write: %v", st)
				require.Equal(t, Done, st, "write")
				require.True(t, bytes.Equal(src, dst), "write not byte-exact")
				ini.Release(x)
			})
		}
	})
}

// The kill test's child: KVBRIDGE_NIXL_KILL_CHILD names the posting
// agent's mode ("strict": NIXLProgressCaller, as a prefill rank's;
// "progress": NIXLProgressThread). The agents written to always have the
// progress thread, as a decode rank's.
const killChildEnv = "KVBRIDGE_NIXL_KILL_CHILD"

// TestLibNIXLKilledPeer (issue 22 items 1 and 2): a prefill agent writing
// from 8 goroutines (1,024 descriptors a write, with a notification) to two
// decode agents has one killed mid-transfer (the double's kill -9: its
// endpoints fail, detected as NIXL detects them), 5 times in a re-executed
// child process. The child must survive each kill, fail exactly the killed
// decode's writes, and serve a new decode agent of the same name
// byte-exact. With the progress thread on the posting agent (NIXL's
// read-write lock) the double aborts as NIXL 1.4.0 crashed.
func TestLibNIXLKilledPeer(t *testing.T) {
	if os.Getenv(killChildEnv) != "" {
		killChild(t, os.Getenv(killChildEnv) == "progress")
		return
	}
	needDouble(t)
	run := func(mode string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLibNIXLKilledPeer$", "-test.count=1")
		cmd.Env = append(os.Environ(), killChildEnv+"="+mode, "KVB_NIXL_DOUBLE_PUT_US=20")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("strict")
	require.NoError(t, err, "a posting agent in NIXLProgressCaller mode did not survive its peers' deaths:\n%s", out)
	require.Contains(t, out, "killed-peer rounds: 5", "a posting agent in NIXLProgressCaller mode did not survive its peers' deaths")
	out, err = run("progress")
	require.Error(t, err, "with NIXL's progress thread the double did not crash as NIXL 1.4.0 did:\n%s", out)
	require.Contains(t, out, "NIXL 1.4.0 crashes here", "with NIXL's progress thread the double did not crash as NIXL 1.4.0 did")
}

func killChild(t *testing.T, prog bool) {
	const (
		descs  = 1024
		piece  = 1024
		rounds = 5
	)
	lib := doubleLib()
	open := func(name string) *Agent {
		mode := NIXLProgressThread // written to
		if name == "kill-prefill" && !prog {
			mode = NIXLProgressCaller
		}
		a, err := Open(Config{Name: name, Engine: EngineLibNIXL, NIXLLib: lib, NIXLProgress: mode, XferTimeout: time.Minute})
		require.NoError(t, err)
		return a
	}
	pre := open("kill-prefill")
	defer pre.Close()
	other := open("kill-other")
	defer other.Close()
	_, src, err := pre.Alloc(descs * piece)
	require.NoError(t, err)
	for i := range src {
		src[i] = byte(i*13 + 1)
	}
	_, odst, _ := other.Alloc(descs * piece)
	_, err = pre.LoadRemote(mustMD(t, other))
	require.NoError(t, err)
	pieces := func(b []byte) []Desc {
		d := make([]Desc, descs)
		for i := range d {
			d[i] = BytesDesc(b[i*piece : (i+1)*piece])
		}
		return d
	}
	idx := make([]int, descs)
	for i := range idx {
		idx[i] = i
	}
	local, err := pre.PrepLocal(DRAM, pieces(src))
	require.NoError(t, err)
	write := func(remote *Prepped) (*Xfer, error) {
		x, err := pre.NewXfer(Write, local, idx, remote, idx, []byte("n"))
		if err != nil {
			return nil, err
		}
		if err := pre.Post(x); err != nil {
			return x, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		st, err := pre.Wait(ctx, x)
		if err == nil && st != Done {
			err = fmt.Errorf("state %v", st)
		}
		return x, err
	}
	oprep, err := pre.PrepRemote(other.Name(), DRAM, pieces(odst))
	require.NoError(t, err)
	for round := 0; round < rounds; round++ {
		dec := open("kill-decode")
		_, ddst, _ := dec.Alloc(descs * piece)
		name, err := pre.LoadRemote(mustMD(t, dec))
		require.NoError(t, err, "round %d: loading the (new) decode", round)
		dprep, err := pre.PrepRemote(name, DRAM, pieces(ddst))
		require.NoError(t, err)
		var decDone, decFailed, otherFailed atomic.Int64
		var otherErr atomic.Value
		stopOther := make(chan struct{})
		decStopped := make(chan struct{})
		enough := make(chan struct{})
		var once sync.Once
		var decWG, wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			toDec := g < 6
			wg.Add(1)
			if toDec {
				decWG.Add(1)
			}
			go func() {
				defer wg.Done()
				if toDec {
					defer decWG.Done()
				}
				for {
					if toDec {
						x, err := write(dprep)
						if x != nil {
							pre.Release(x)
						}
						if err != nil {
							decFailed.Add(1)
							return // this decode is dead: its writes fail
						}
						if decDone.Add(1) >= 4 {
							once.Do(func() { close(enough) })
						}
						continue
					}
					select {
					case <-stopOther:
						return
					default:
					}
					x, err := write(oprep)
					if x != nil {
						pre.Release(x)
					}
					if err != nil {
						otherFailed.Add(1)
						otherErr.Store(err)
						return
					}
				}
			}()
		}
		<-enough
		require.NoError(t, nixldouble.Kill(lib, name)) // kill -9, mid-transfer
		go func() { decWG.Wait(); close(decStopped) }()
		<-decStopped
		close(stopOther)
		wg.Wait()
		require.EqualValues(t, 6, decFailed.Load(), "round %d: of the killed decode's 6 writers failed (%d of the other decode's 2: %v)",
			round, otherFailed.Load(), otherErr.Load())
		require.Zero(t, otherFailed.Load(), "round %d: of the other decode's 2 writers failed (%v)", round, otherErr.Load())
		dprep.Release()
		dec.Close()
		// A new decode process, same agent name: served byte-exact.
		dec = open("kill-decode")
		_, ddst, _ = dec.Alloc(descs * piece)
		_, err = pre.LoadRemote(mustMD(t, dec))
		require.NoError(t, err, "round %d: loading the restarted decode", round)
		dprep, err = pre.PrepRemote(name, DRAM, pieces(ddst))
		require.NoError(t, err)
		x, err := write(dprep)
		require.NoError(t, err, "round %d: writing to the restarted decode", round)
		pre.Release(x)
		require.True(t, bytes.Equal(ddst, src), "round %d: the restarted decode's write is not byte-exact", round)
		x, err = write(oprep)
		require.NoError(t, err, "round %d: the other decode after", round)
		pre.Release(x)
		dprep.Release()
		dec.Close()
	}
	fmt.Printf("killed-peer rounds: %d (posts fenced: %d)\n", rounds, pre.PostsFenced())
}

func mustMD(t *testing.T, a *Agent) []byte {
	t.Helper()
	md, err := a.Metadata()
	require.NoError(t, err)
	return md
}

//go:embed nixlfault.c.in
var nixlfaultSource []byte

// buildNIXLFault compiles nixlfault.c.in against the NIXL C API library
// lib (and the libnixl.so beside it), as kvbench builds its C reference.
func buildNIXLFault(t *testing.T, lib string) string {
	t.Helper()
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "nixlfault.c"), filepath.Join(dir, "nixlfault")
	require.NoError(t, os.WriteFile(src, nixlfaultSource, 0o644))
	libdir := filepath.Dir(lib)
	out, err := exec.Command("gcc", "-O2", "-Wall", "-Werror", "-o", bin, src, "-L"+libdir, "-lnixl_capi", "-lnixl",
		"-Wl,-rpath,"+libdir, "-Wl,--allow-shlib-undefined", "-lpthread").CombinedOutput()
	require.NoError(t, err, "building nixlfault against %s: %s", libdir, out)
	return bin
}

// TestNIXLFaultRepro (make test-nixl): issue 22's faults on NIXL's C API
// alone. The strict configuration (no progress thread, strict lock) must
// survive 20 kills of a decode mid-transfer and serve each new decode
// byte-exact; the progress-thread configuration (kvbridge's before issue
// 22) and the bad-then-genuine metadata case are reported, not required:
// they pass once NIXL is fixed (see nixlfault.c.in).
func TestNIXLFaultRepro(t *testing.T) {
	if s := skipReal(); s != "" {
		t.Skip(s)
	}
	bin := buildNIXLFault(t, realNIXL())
	// Each run is bounded: NIXL's bug can hang a process as well as crash it.
	run := func(d time.Duration, args ...string) ([]byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		// The repro and the decode it started, as one group: a hung run
		// is killed whole, and a child still holding the output cannot
		// keep the test waiting.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = 10 * time.Second
		return cmd.CombinedOutput()
	}
	out, err := run(5*time.Minute, "kill", "0", "1", "8", "20")
	if assert.NoError(t, err, "no progress thread, strict lock:\n%s", out) {
		assert.Contains(t, string(out), "survived 20 of 20", "no progress thread, strict lock")
	}
	out, err = run(time.Minute, "kill", "1", "2", "4", "3")
	if err != nil {
		t.Logf("progress thread, RW lock: NIXL bug reproduced (fixed upstream in 3e3e083c9): %v\n%s", err, tail(string(out), 2000))
	} else {
		t.Logf("progress thread, RW lock: not reproduced\n%s", out)
	}
	out, err = run(time.Minute, "md")
	require.NoError(t, err, "md:\n%s", out)
	t.Logf("metadata:\n%s", out)
}

// TestNIXLFaultReproOnDouble builds nixlfault against the NIXL double and
// runs its metadata case there: the double refuses the genuine blob after
// a refused one, as NIXL 1.4.0 does (its kill case needs two processes on
// a real NIXL).
func TestNIXLFaultReproOnDouble(t *testing.T) {
	needDouble(t)
	bin := buildNIXLFault(t, doubleLib())
	out, err := exec.Command(bin, "md").CombinedOutput()
	require.NoError(t, err, "md:\n%s", out)
	for _, want := range []string{"last byte dropped: refused", "last 64 bytes 0xff: refused", "genuine after bad: refused"} {
		assert.Contains(t, string(out), want, "md on the double")
	}
}

// TestLibNIXLTargetProgressModel: as NIXL 1.4.0 (issue 22), the double
// completes a write with a notification to an agent without a progress
// thread only once that agent has progressed (here: one Notifs call), and
// at once to an agent with NIXL's progress thread.
func TestLibNIXLTargetProgressModel(t *testing.T) {
	t.Run("thread", func(t *testing.T) {
		p, src, dst := libnixlPair(t, time.Minute)
		x := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, []byte("tp"))
		defer p.ini.Release(x)
		st, err := wait(t, p.ini, x, time.Minute)
		require.NoError(t, err, "a write to a target with NIXL's progress thread: %v", st)
		require.Equal(t, Done, st, "a write to a target with NIXL's progress thread")
	})
	p, src, dst := libnixlPairModes(t, time.Minute, NIXLProgressCaller, NIXLProgressCaller)
	copy(src, bytes.Repeat([]byte("target progress "), len(src)/16))
	l, _ := p.ini.PrepLocal(DRAM, []Desc{BytesDesc(src)})
	r, _ := p.ini.PrepRemote(p.remote, DRAM, []Desc{BytesDesc(dst)})
	x, err := p.ini.NewXfer(Write, l, []int{0}, r, []int{0}, []byte("tp"))
	if err == nil {
		err = p.ini.Post(x)
	}
	require.NoError(t, err)
	defer p.ini.Release(x)
	// Not a synchronisation: the write must still be in progress after the
	// watcher's many polls in 50 ms, since the target made no call.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	st, err := p.ini.Wait(ctx, x)
	cancel()
	require.Equal(t, InProgress, st, "a write to a target that never progressed: %v, want still in progress", err)
	require.ErrorIs(t, err, context.DeadlineExceeded, "a write to a target that never progressed: %v, want still in progress", st)
	// The target progresses. The initiator's watcher may complete the
	// write and send its notification while this call runs, so this call
	// may already return it (seen once in make test: the notification
	// taken here, then waited for a minute).
	early, err := p.tgt.Notifs()
	require.NoError(t, err)
	st, err = wait(t, p.ini, x, time.Minute)
	require.NoError(t, err, "after the target progressed: %v", st)
	require.Equal(t, Done, st, "after the target progressed")
	var n Notif
	if len(early) > 0 {
		n = early[0]
	} else {
		n = waitNotif(t, p.tgt, time.Minute)
	}
	require.Equal(t, "tp", string(n.Msg), "notification, byte-exact %v", bytes.Equal(src, dst))
	require.True(t, bytes.Equal(src, dst), "notification %q, byte-exact", n.Msg)
}
