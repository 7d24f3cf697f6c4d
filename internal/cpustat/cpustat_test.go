package cpustat

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	if os.Getenv("CPUSTAT_TEST_CHILD") != "" {
		os.Exit(burnChild())
	}
	goleak.VerifyTestMain(m)
}

// burn spends at least d of this process's CPU time (a condition on
// getrusage, not a clock).
func burn(d time.Duration) {
	start := Self().Total()
	x := 1
	for Self().Total()-start < d {
		for i := 0; i < 100000; i++ {
			x = x*31 + i
		}
	}
	sink = x
}

var sink int

// burnChild burns 200 ms, says so, and waits for stdin to close.
func burnChild() int {
	burn(200 * time.Millisecond)
	fmt.Println("burned")
	bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		hz         int64
		want       Times
		bad        bool
	}{
		{name: "plain", hz: 100, want: Times{1230 * time.Millisecond, 40 * time.Millisecond},
			line: "4242 (prefill) S 1 4242 4242 0 -1 4194560 1000 0 0 0 123 4 0 0 20 0 12 0 100 0 0"},
		{name: "spaces and parens in the name", hz: 100, want: Times{70 * time.Millisecond, 20 * time.Millisecond},
			line: "7 (a b) (c)) R 1 7 7 0 -1 0 0 0 0 0 7 2 5 5 20 0 1 0 100 0 0"},
		{name: "another tick", hz: 1000, want: Times{123 * time.Millisecond, 4 * time.Millisecond},
			line: "4242 (x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 123 4 0 0 20 0 12 0 100 0 0"},
		{name: "no name", line: "4242 S 1 2 3", hz: 100, bad: true},
		{name: "short", line: "4242 (x) S 1 2 3", hz: 100, bad: true},
		{name: "not a number", line: "4242 (x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 1x3 4 0 0", hz: 100, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStat(tc.line, tc.hz)
			if tc.bad {
				require.Error(t, err, "parsed %v from a malformed line", got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestAuxClockTick(t *testing.T) {
	pair := func(typ, val uint64) []byte {
		b := make([]byte, 16)
		for i := 0; i < 8; i++ {
			b[i], b[8+i] = byte(typ>>(8*i)), byte(val>>(8*i))
		}
		return b
	}
	var auxv []byte
	auxv = append(auxv, pair(6, 4096)...) // AT_PAGESZ
	auxv = append(auxv, pair(17, 250)...)
	auxv = append(auxv, pair(0, 0)...)
	assert.EqualValues(t, 250, auxClockTick(auxv), "AT_CLKTCK 250")
	assert.EqualValues(t, 0, auxClockTick(append(pair(6, 4096), pair(0, 0)...)), "no AT_CLKTCK")
}

// TestProcessAgreesWithRusage: /proc's count of this process (ticks
// scaled by ClockTick) and getrusage's agree to a few ticks after 300 ms
// of CPU; a wrong tick would put them a factor apart.
func TestProcessAgreesWithRusage(t *testing.T) {
	burn(300 * time.Millisecond)
	self := Self().Total()
	proc, err := Process(os.Getpid())
	require.NoError(t, err)
	slack := 3 * time.Second / time.Duration(ClockTick())
	require.InDelta(t, self, proc.Total(), float64(slack), "/proc says %v, getrusage %v (tick %d Hz)", proc.Total(), self, ClockTick())
}

// TestChild: a child's CPU is seen through /proc while it runs, in its
// ProcessState and in Children once waited for, and a Meter over it
// counts what it burned after Start only.
func TestChild(t *testing.T) {
	before := Children()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "CPUSTAT_TEST_CHILD=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	burn(100 * time.Millisecond) // before the meter: not to be counted
	m0, err := Start(0)
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	m, err := Start(cmd.Process.Pid)
	require.NoError(t, err)
	l, _ := bufio.NewReader(stdout).ReadString('\n')
	require.Equal(t, "burned\n", l, "child said")
	r, err := m.Read()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, r.Total(), 150*time.Millisecond, "meter on the child (it burned 200ms)")
	stdin.Close()
	require.NoError(t, cmd.Wait())
	assert.GreaterOrEqual(t, Of(cmd.ProcessState).Total(), 200*time.Millisecond, "ProcessState")
	assert.GreaterOrEqual(t, Children().Sub(before).Total(), 200*time.Millisecond, "Children")
	_, err = Process(cmd.Process.Pid)
	assert.Error(t, err, "Process of a reaped child: no error")
	self, _ := m0.Read()
	assert.Less(t, self.Total(), 100*time.Millisecond, "this process's meter counted CPU from before its Start or the child's")
	assert.Equal(t, 0.5, PerGB(time.Second, 2e9), "PerGB")
	assert.Equal(t, 0.0, PerGB(time.Second, 0), "PerGB")
}
