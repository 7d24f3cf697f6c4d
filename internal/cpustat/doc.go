// Package cpustat measures the CPU time (user + system) processes spend,
// so a benchmark can report CPU seconds per GB moved, or per room, next to
// its reference's in the same run:
//
//   - this process: Self (getrusage RUSAGE_SELF, microseconds),
//   - another running process: Process (/proc/<pid>/stat, clock ticks),
//   - children already waited for: Children (RUSAGE_CHILDREN) or Of an
//     exec.Cmd's ProcessState.
//
// A Meter reads several of these at once over an interval:
//
//	m, _ := cpustat.Start(0, child.Process.Pid) // 0 is this process
//	... the work ...
//	r, _ := m.Read()
//	fmt.Printf("%.3f CPU s/GB\n", cpustat.PerGB(r.Total(), bytes))
//
// Linux only (it reads /proc).
package cpustat
