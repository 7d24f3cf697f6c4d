package cpustat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Times is CPU time spent in user and in kernel mode.
type Times struct {
	User, System time.Duration
}

// Total is user + system.
func (t Times) Total() time.Duration { return t.User + t.System }

// Sub is t − u.
func (t Times) Sub(u Times) Times { return Times{t.User - u.User, t.System - u.System} }

// Add is t + u.
func (t Times) Add(u Times) Times { return Times{t.User + u.User, t.System + u.System} }

func (t Times) String() string {
	return fmt.Sprintf("%.3fs (user %.3fs, system %.3fs)", t.Total().Seconds(), t.User.Seconds(), t.System.Seconds())
}

// FromRusage converts a getrusage record.
func FromRusage(ru *syscall.Rusage) Times {
	return Times{time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())}
}

// Self is this process's CPU time so far, every thread included.
func Self() Times {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru) // cannot fail with a valid who and pointer
	return FromRusage(&ru)
}

// Children is the CPU time of this process's children that have ended and
// been waited for (their own waited-for descendants included).
func Children() Times {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	return FromRusage(&ru)
}

// Of is the CPU time of a process that has ended, from its ProcessState
// (zero for nil).
func Of(ps *os.ProcessState) Times {
	if ps == nil {
		return Times{}
	}
	return Times{ps.UserTime(), ps.SystemTime()}
}

// ErrNoProcess: the process has ended (and been reaped) or never was.
var ErrNoProcess = errors.New("cpustat: no such process")

// Process is a running process's CPU time so far (every thread, ended
// ones included), from /proc/<pid>/stat; its resolution is the clock tick
// (10 ms on most kernels).
func Process(pid int) (Times, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return Times{}, fmt.Errorf("%w: pid %d", ErrNoProcess, pid)
	}
	if err != nil {
		return Times{}, fmt.Errorf("cpustat: %w", err)
	}
	return parseStat(string(data), ClockTick())
}

// parseStat reads utime and stime (fields 14 and 15) of a /proc/<pid>/stat
// line. The command name (field 2) is in parentheses and may itself hold
// spaces and parentheses, so fields are counted from the last ')'.
func parseStat(line string, hz int64) (Times, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return Times{}, fmt.Errorf("cpustat: malformed stat line %q", line)
	}
	f := strings.Fields(line[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return Times{}, fmt.Errorf("cpustat: short stat line %q", line)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return Times{}, fmt.Errorf("cpustat: stat line %q: %w", line, err)
	}
	tick := time.Second / time.Duration(hz)
	return Times{time.Duration(u) * tick, time.Duration(s) * tick}, nil
}

var tick struct {
	once sync.Once
	hz   int64
}

// ClockTick is the kernel's USER_HZ, the unit of /proc's CPU times: the
// AT_CLKTCK entry of this process's auxiliary vector (sysconf(_SC_CLK_TCK)
// without cgo), 100 if it cannot be read.
func ClockTick() int64 {
	tick.once.Do(func() {
		tick.hz = 100
		if data, err := os.ReadFile("/proc/self/auxv"); err == nil {
			if hz := auxClockTick(data); hz > 0 {
				tick.hz = hz
			}
		}
	})
	return tick.hz
}

// auxClockTick finds AT_CLKTCK (17) in an auxiliary vector of native
// 64-bit (type, value) pairs; 0 if absent.
func auxClockTick(auxv []byte) int64 {
	const atNull, atClkTck = 0, 17
	for i := 0; i+16 <= len(auxv); i += 16 {
		typ := binary.NativeEndian.Uint64(auxv[i:])
		val := binary.NativeEndian.Uint64(auxv[i+8:])
		switch typ {
		case atNull:
			return 0
		case atClkTck:
			return int64(val)
		}
	}
	return 0
}

// A Meter measures the CPU time of a set of processes from Start on; pid 0
// is this process (read with getrusage, to the microsecond).
type Meter struct {
	pids  []int
	start []Times
	wall  time.Time
}

// Start reads every process's CPU time now.
func Start(pids ...int) (*Meter, error) {
	m := &Meter{pids: pids, start: make([]Times, len(pids))}
	for i, pid := range pids {
		t, err := read(pid)
		if err != nil {
			return nil, err
		}
		m.start[i] = t
	}
	m.wall = time.Now()
	return m, nil
}

func read(pid int) (Times, error) {
	if pid == 0 {
		return Self(), nil
	}
	return Process(pid)
}

// Reading is what a Meter measured: the wall time since Start and each
// process's CPU time over it, in the order given to Start.
type Reading struct {
	Wall time.Duration
	Each []Times
}

// Read measures every process's CPU time since Start.
func (m *Meter) Read() (Reading, error) {
	r := Reading{Wall: time.Since(m.wall), Each: make([]Times, len(m.pids))}
	for i, pid := range m.pids {
		t, err := read(pid)
		if err != nil {
			return Reading{}, err
		}
		r.Each[i] = t.Sub(m.start[i])
	}
	return r, nil
}

// Total is the CPU time of every process together.
func (r Reading) Total() time.Duration {
	var d time.Duration
	for _, t := range r.Each {
		d += t.Total()
	}
	return d
}

// Cores is the share of one core process i used: 0.01 is 1 % of a core.
func (r Reading) Cores(i int) float64 {
	if r.Wall <= 0 {
		return 0
	}
	return r.Each[i].Total().Seconds() / r.Wall.Seconds()
}

// PerGB is CPU seconds per 10⁹ bytes moved (0 for no bytes).
func PerGB(cpu time.Duration, bytes float64) float64 {
	if bytes <= 0 {
		return 0
	}
	return cpu.Seconds() / (bytes / 1e9)
}
