package kvmanager

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/cpustat"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/require"
)

// BenchmarkWriteCheck: the decode rank's write check (writecheck.go)
// against the same rooms unchecked, interleaved in rounds in one run: one
// prefill and one decode rank in this process on the ucx engine over
// shared memory (its own memory), 64 regions (Llama-3-8B's 32 layers × K/V),
// one room at a time of 64 MiB in chunks of 32 pages, at two page sizes
// (one canary per page and region). It reports the median GB/s and CPU
// s/GB (both ranks together) of each, their ratios, and the median
// InitReceiver (the canaries are planted before the REQUEST goes out).
func BenchmarkWriteCheck(b *testing.B) {
	for _, page := range []uint64{32 << 10, 4 << 10} {
		b.Run(fmt.Sprintf("page-%dKiB", page>>10), func(b *testing.B) { benchWriteCheck(b, page) })
	}
}

func benchWriteCheck(b *testing.B, page uint64) {
	const regions, roomBytes, rounds, perRound = 64, 64 << 20, 7, 3
	pagesPer := int(roomBytes / (page * regions)) // a room's pages
	srv := testauth.Server()
	require.NoError(b, srv.Start("127.0.0.1:0"))
	b.Cleanup(func() { srv.Close(context.Background()) })
	mk := func(role Role) Config {
		cfg := DefaultConfig(role)
		cfg.Auth, cfg.Instance, cfg.Compat, cfg.BootstrapURL = testauth.Auth(), fmt.Sprintf("wcheck-%d", page), "v1:wcheck", srv.URL()
		cfg.Engine = nixl.Config{Engine: nixl.EngineUCX, UCX: map[string]string{"TLS": "posix,cma,self"}}
		cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: page}
		for range regions {
			cfg.Layout.Regions = append(cfg.Layout.Regions, nixl.Desc{Len: uint64(pagesPer) * page})
		}
		cfg.WarmMemory = true
		return cfg
	}
	p, err := NewPrefill(mk(RolePrefill))
	require.NoError(b, err)
	b.Cleanup(func() { p.Close() })
	d, err := NewDecode(mk(RoleDecode))
	require.NoError(b, err)
	b.Cleanup(func() { d.Close() })
	pages := make([]uint32, pagesPer)
	for i := range pages {
		pages[i] = uint32(i)
	}
	room := uint64(0)
	var inits [2][]float64 // InitReceiver's µs, [checked, unchecked]
	one := func() time.Duration {
		room++
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		require.NoError(b, d.CreateReceiver(room))
		require.NoError(b, p.CreateSender(room))
		p.InitSender(room)
		at := time.Now()
		require.NoError(b, d.InitReceiver(ctx, room, RequestSpec{DstPages: pages, AuxIndex: -1}))
		k := 0
		if d.wcheck.skipped.Load() {
			k = 1
		}
		inits[k] = append(inits[k], float64(time.Since(at).Microseconds()))
		if st, err := p.WaitReady(ctx, room); st != WaitingForInput {
			b.Fatalf("room %d: %v %v", room, st, err)
		}
		for i := 0; i < len(pages); i += 32 {
			end := min(i+32, len(pages))
			require.NoError(b, p.SendChunk(room, pages[i:end], end == len(pages), -1, nil))
		}
		st, err := d.Wait(ctx, room)
		require.Equal(b, Success, st, "room %d: %v %s", room, err, d.Failure(room))
		el := time.Since(start)
		_, _ = p.Wait(ctx, room)
		d.Clear(room)
		p.Clear(room)
		return el
	}
	one()                    // connect
	var gb, cpu [2][]float64 // [checked, unchecked] per round
	b.ResetTimer()
	for range b.N {
		for r := range rounds {
			for _, skip := range []bool{r%2 == 1, r%2 == 0} { // alternate which goes first
				d.wcheck.skipped.Store(skip)
				m, err := cpustat.Start(0)
				require.NoError(b, err)
				var el time.Duration
				for range perRound {
					el += one()
				}
				rd, err := m.Read()
				require.NoError(b, err)
				i := 0
				if skip {
					i = 1
				}
				bytes := float64(perRound * roomBytes)
				gb[i] = append(gb[i], bytes/el.Seconds()/1e9)
				cpu[i] = append(cpu[i], cpustat.PerGB(rd.Total(), bytes))
			}
		}
	}
	d.wcheck.skipped.Store(false)
	med := func(x []float64) float64 { y := append([]float64(nil), x...); sort.Float64s(y); return y[len(y)/2] }
	ratios := func(a, c []float64) (lo, m, hi float64) {
		var r []float64
		for i := range a {
			r = append(r, a[i]/c[i])
		}
		sort.Float64s(r)
		return r[0], r[len(r)/2], r[len(r)-1]
	}
	for i := range gb[0] {
		b.Logf("round %d: checked %.2f GB/s %.3f cpu-s/GB, unchecked %.2f GB/s %.3f cpu-s/GB: ratio %.2f", i, gb[0][i], cpu[0][i], gb[1][i], cpu[1][i], gb[0][i]/gb[1][i])
	}
	b.ReportMetric(med(gb[0]), "checked-GB/s")
	b.ReportMetric(med(gb[1]), "unchecked-GB/s")
	lo, m, hi := ratios(gb[0], gb[1])
	b.ReportMetric(m, "ratio")
	b.ReportMetric(lo, "ratio-min")
	b.ReportMetric(hi, "ratio-max")
	b.ReportMetric(med(cpu[0]), "checked-cpu-s/GB")
	b.ReportMetric(med(cpu[1]), "unchecked-cpu-s/GB")
	_, cm, _ := ratios(cpu[0], cpu[1])
	b.ReportMetric(cm, "cpu-ratio")
	b.ReportMetric(med(inits[0]), "checked-init-µs")
	b.ReportMetric(med(inits[1]), "unchecked-init-µs")
}
