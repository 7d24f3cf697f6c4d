package cpustat_test

import (
	"fmt"

	"github.com/kvbridge/kvbridge/internal/cpustat"
)

// Example measures this process's CPU over some work and reports it per
// GB moved.
func Example() {
	m, err := cpustat.Start(0) // 0: this process
	if err != nil {
		panic(err)
	}
	buf := make([]byte, 64<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	r, _ := m.Read()
	perGB := cpustat.PerGB(r.Total(), float64(len(buf)))
	fmt.Println("CPU per GB measured:", perGB >= 0)
	// Output: CPU per GB measured: true
}
