package nixl

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// child is a peer process (this test binary re-executed, see runChild).
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	md    []byte
	addr  uintptr
}

func startChild(t testing.TB, transport string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "KVBRIDGE_NIXL_CHILD="+transport), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &child{cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	f := strings.Fields(c.line(t, "MD"))
	c.md, err = hex.DecodeString(f[1])
	require.NoError(t, err)
	a, _ := strconv.ParseUint(f[2], 16, 64)
	c.addr = uintptr(a)
	return c
}

func (c *child) line(t testing.TB, prefix string) string {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		require.True(t, ok, "child said %q, want %s ...", l, prefix)
		require.True(t, strings.HasPrefix(l, prefix+" "), "child said %q, want %s ...", l, prefix)
		return l
	case <-time.After(time.Minute):
		t.Fatalf("child silent, waiting for %s", prefix)
		return ""
	}
}

func TestCrossProcess(t *testing.T) {
	for _, tc := range []struct {
		transport string
		ucx       map[string]string
	}{{"shm", shmUCX}, {"tcp", tcpUCX}} {
		t.Run(tc.transport, func(t *testing.T) {
			c := startChild(t, tc.transport)
			a, err := Open(Config{Name: "parent-" + tc.transport, Engine: EngineUCX, UCX: tc.ucx, XferTimeout: 20 * time.Second})
			require.NoError(t, err)
			defer a.Close()
			remote, err := a.LoadRemote(c.md)
			require.NoError(t, err)
			const size = 256 << 20
			_, src, err := a.Alloc(size)
			require.NoError(t, err)
			fill(src, 9)
			p := pair{ini: a, remote: remote}
			dst := Desc{Addr: c.addr, Len: size}
			x := write(t, p, []Desc{BytesDesc(src)}, []Desc{dst}, []byte(fmt.Sprintf("verify:%d", size)))
			st, err := wait(t, a, x, time.Minute)
			require.Equal(t, Done, st, "state: %v", err)
			require.Equal(t, fmt.Sprintf("CRC %08x", crc32.ChecksumIEEE(src)), c.line(t, "CRC"), "the child's buffer")
			a.Release(x)

			// The peer is killed with a write in flight: the transfer ends
			// (done or failed) within the agent's deadline, never hangs.
			x = write(t, p, []Desc{BytesDesc(src)}, []Desc{dst}, []byte("late"))
			c.cmd.Process.Signal(syscall.SIGKILL)
			st, err = wait(t, a, x, time.Minute)
			t.Logf("write to a killed peer over %s: %v %v", tc.transport, st, err)
			a.Release(x)
			// A new write to the dead peer also ends.
			x = write(t, p, []Desc{BytesDesc(src[:4096])}, []Desc{{Addr: c.addr, Len: 4096}}, nil)
			st, err = wait(t, a, x, time.Minute)
			t.Logf("next write to the dead peer: %v %v", st, err)
			a.Release(x)
		})
	}
}

// TestCrossProcessInitiatorKilled: a process writing into this one is
// killed (kill -9) mid-transfer, five times; this process (the target, as
// a decode rank is) survives each and then takes a new writer's data
// byte-exact.
//
// Over tcp UCX has no put of its own: it emulates one with active
// messages, and the target sends each completion from ucp_put_handler
// through ucp_request_send, which calls ucs_fatal when the send fails — as
// it does once the writer's socket is gone ("unexpected error: Endpoint
// timeout", every run of the tcp case before the engine sent its writes as
// its own acknowledged messages). A writer killed right after connecting
// also aborted the target in UCX 1.13's wire-up (an assertion purging a
// pending wire-up reply), until the connection's PING round trip.
func TestCrossProcessInitiatorKilled(t *testing.T) {
	for _, tc := range []struct {
		transport string
		ucx       map[string]string
	}{{"shm", shmUCX}, {"tcp", tcpUCX}} {
		t.Run(tc.transport, func(t *testing.T) {
			initiatorKilled(t, tc.transport, tc.ucx)
		})
	}
}

func initiatorKilled(t *testing.T, transport string, cfg map[string]string) {
	a, err := Open(Config{Name: "parent-target-" + transport, Engine: EngineUCX, UCX: cfg, XferTimeout: 20 * time.Second})
	require.NoError(t, err)
	defer a.Close()
	const size = 64 << 20
	_, dst, err := a.Alloc(size)
	require.NoError(t, err)
	md, err := a.Metadata()
	require.NoError(t, err)
	env := []string{"KVBRIDGE_NIXL_WRITER_MD=" + hex.EncodeToString(md), "KVBRIDGE_NIXL_WRITER_TLS=" + transport,
		fmt.Sprintf("KVBRIDGE_NIXL_WRITER_DST=%x", BytesDesc(dst).Addr), fmt.Sprintf("KVBRIDGE_NIXL_CHILD_SIZE=%d", size)}
	for round := 0; round < 5; round++ {
		c := startChild(t, "writer", env...)
		c.line(t, "WRITING") // three writes posted
		c.cmd.Process.Signal(syscall.SIGKILL)
	}
	// A writer that lives: its data lands byte-exact.
	c := startChild(t, "writer", append(env, "KVBRIDGE_NIXL_WRITER_ONCE=1")...)
	want := c.line(t, "DONE")
	require.Equal(t, want, fmt.Sprintf("DONE %08x", crc32.ChecksumIEEE(dst)), "after the killed writers, this process's buffer (got) is not what the writer wrote (want)")
}

// writerChild is the peer process of TestCrossProcessInitiatorKilled: it
// writes its buffer into the parent's (over shm or tcp), again and again until
// killed, or once (KVBRIDGE_NIXL_WRITER_ONCE) and prints its CRC.
func writerChild() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "writer:", err); return 1 }
	cfg := Config{Name: fmt.Sprintf("child-writer-%d", os.Getpid()), Engine: EngineUCX, UCX: shmUCX}
	if os.Getenv("KVBRIDGE_NIXL_WRITER_TLS") == "tcp" {
		cfg.UCX = tcpUCX
	}
	a, err := Open(cfg)
	if err != nil {
		return fail(err)
	}
	defer a.Close()
	size, _ := strconv.ParseUint(os.Getenv("KVBRIDGE_NIXL_CHILD_SIZE"), 10, 64)
	dst, _ := strconv.ParseUint(os.Getenv("KVBRIDGE_NIXL_WRITER_DST"), 16, 64)
	pmd, err := hex.DecodeString(os.Getenv("KVBRIDGE_NIXL_WRITER_MD"))
	if err != nil {
		return fail(err)
	}
	_, src, err := a.Alloc(size)
	if err != nil {
		return fail(err)
	}
	fill(src, uint64(os.Getpid()))
	md, err := a.Metadata()
	if err != nil {
		return fail(err)
	}
	fmt.Printf("MD %x %x\n", md, BytesDesc(src).Addr)
	remote, err := a.LoadRemote(pmd)
	if err != nil {
		return fail(err)
	}
	l, err := a.PrepLocal(DRAM, []Desc{BytesDesc(src)})
	if err != nil {
		return fail(err)
	}
	r, err := a.PrepRemote(remote, DRAM, []Desc{{Addr: uintptr(dst), Len: size}})
	if err != nil {
		return fail(err)
	}
	for i := 0; ; i++ {
		x, err := a.NewXfer(Write, l, []int{0}, r, []int{0}, nil)
		if err == nil {
			err = a.Post(x)
		}
		if err != nil {
			return fail(err)
		}
		if os.Getenv("KVBRIDGE_NIXL_WRITER_ONCE") == "" {
			if i == 2 {
				fmt.Println("WRITING 3") // three writes out
			}
			a.Release(x) // cancelled: the next one goes out at once
			continue
		}
		if st, err := a.Wait(context.Background(), x); st != Done {
			return fail(fmt.Errorf("write: %v %v", st, err))
		}
		fmt.Printf("DONE %08x\n", crc32.ChecksumIEEE(src))
		return 0
	}
}

// TestReplacedPeerReleasesItsMemory: a peer process killed and replaced
// by a new one of the same agent name (a decode rank restarted) five
// times; the new blob replaces the old remote and closes its endpoint.
// That endpoint held the dead peer's shared-memory segments (its FIFO and
// receive buffers) mapped here, and kept them: the wire-up PING's reply
// endpoint had made the peer connect back, and UCX 1.13 destroys such an
// endpoint only once the peer closes its side (a dead one never does; a
// forced close needs peer error handling, which its shared-memory
// transports lack). A never-killed prefill rank grew by two mappings at
// every decode restart (76 → 223 MB in a chaos run). Endpoints with a put
// lane of their own are no longer pinged.
func TestReplacedPeerReleasesItsMemory(t *testing.T) {
	a, err := Open(Config{Name: "parent-replaced", Engine: EngineUCX, UCX: shmUCX, XferTimeout: 20 * time.Second})
	require.NoError(t, err)
	defer a.Close()
	_, src, err := a.Alloc(1 << 20)
	require.NoError(t, err)
	fill(src, 3)
	var counts []int
	for round := 0; round < 5; round++ {
		c := startChild(t, "shm", fmt.Sprintf("KVBRIDGE_NIXL_CHILD_SIZE=%d", 4<<20))
		remote, err := a.LoadRemote(c.md) // replaces the previous round's peer
		require.NoError(t, err)
		p := pair{ini: a, remote: remote}
		x := write(t, p, []Desc{BytesDesc(src)}, []Desc{{Addr: c.addr, Len: uint64(len(src))}}, nil)
		st, err := wait(t, a, x, time.Minute)
		require.Equal(t, Done, st, "round %d: %v", round, err)
		a.Release(x)
		c.cmd.Process.Signal(syscall.SIGKILL)
		c.cmd.Wait()
		counts = append(counts, shmMappings(t))
	}
	// Each round's peer is gone once the next replaced it: the mappings
	// stay flat from the second round on (the last peer's are still held).
	require.LessOrEqual(t, counts[len(counts)-1], counts[1], "shared-memory mappings of this process after each round: %v (the replaced dead peers' segments are still mapped)", counts)
	t.Logf("shared-memory mappings after each round: %v", counts)
}

// shmMappings counts this process's mappings of UCX shared-memory segments.
func shmMappings(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skipf("no /proc/self/maps: %v", err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "ucx_shm") || strings.Contains(l, "SYSV") {
			n++
		}
	}
	return n
}
