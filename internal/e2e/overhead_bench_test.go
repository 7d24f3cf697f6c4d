package e2e

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/stretchr/testify/require"
)

// bareLanded is BenchmarkControlOverhead's reference: the engine alone
// writing what a room's first write carries — one page of page bytes in
// each of 2·layers regions of pagesPer pages, pages pages a region, on
// random pages of each side, with a notification — between two agents of
// the benchmark cluster's engine configuration (ucx over shared memory),
// inflight writes at a time as the rooms are, from lists prepared once
// over every page as the transfer pool prepares them. It returns each of
// n writes' time from its post to its notification's arrival at the
// target, taken by a goroutine that waits on the target's NotifyC and
// drains, as a decode rank's notifier does. With gap > 0 (one write at a
// time) each write is posted gap after the last one ended, at the pace
// the rooms came: both agents have gone idle in between, as a lone
// room's find them, where back to back their progress loops still spin.
func bareLanded(b *testing.B, layers, pagesPer int, page uint64, pages, inflight, n int, gap time.Duration) []time.Duration {
	b.Helper()
	open := func(role string) *nixl.Agent {
		a, err := nixl.Open(nixl.Config{Name: fmt.Sprintf("bare-%s-%d", role, uniq()), Engine: nixl.EngineUCX, UCX: shm})
		require.NoError(b, err)
		b.Cleanup(func() { a.Close() })
		return a
	}
	ini, tgt := open("ini"), open("tgt")
	var srcDescs, dstDescs []nixl.Desc
	for range 2 * layers {
		_, s, err := ini.Alloc(uint64(pagesPer) * page)
		require.NoError(b, err)
		_, d, err := tgt.Alloc(uint64(pagesPer) * page)
		require.NoError(b, err)
		for p := range pagesPer {
			off := uint64(p) * page
			srcDescs = append(srcDescs, nixl.BytesDesc(s[off:off+page]))
			dstDescs = append(dstDescs, nixl.BytesDesc(d[off:off+page]))
		}
	}
	md, err := tgt.Metadata()
	require.NoError(b, err)
	remote, err := ini.LoadRemote(md)
	require.NoError(b, err)
	local, err := ini.PrepLocal(nixl.DRAM, srcDescs)
	require.NoError(b, err)
	defer local.Release()
	dests, err := ini.PrepRemote(remote, nixl.DRAM, dstDescs)
	require.NoError(b, err)
	defer dests.Release()

	// The target's notifier: each write's notification names it.
	arrived := make([]time.Time, n)
	var mu sync.Mutex
	got, all := 0, make(chan struct{})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-tgt.NotifyC():
			}
			ns, err := tgt.Notifs()
			if err != nil {
				b.Error(err)
				return
			}
			now := time.Now()
			mu.Lock()
			for _, nf := range ns {
				if i, err := strconv.Atoi(string(nf.Msg)); err == nil && i >= 0 && i < n && arrived[i].IsZero() {
					arrived[i] = now
					if got++; got == n {
						close(all)
					}
				}
			}
			mu.Unlock()
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	srcPages, dstPages := kvmodel.NewPages(pagesPer, rand.Uint64()), kvmodel.NewPages(pagesPer, rand.Uint64())
	type write struct {
		src, dst []uint32
	}
	posted := make([]time.Time, n)
	live := map[*nixl.Xfer]write{}
	done := make(chan *nixl.Xfer, inflight)
	for i := 0; i < n || len(live) > 0; {
		if i < n && len(live) < inflight {
			w := write{src: srcPages.Get(pages), dst: dstPages.Get(pages)}
			require.NotNil(b, w.src, "out of source pages")
			require.NotNil(b, w.dst, "out of destination pages")
			var li, ri []int
			for r := range 2 * layers {
				for k := range pages {
					li = append(li, r*pagesPer+int(w.src[k]))
					ri = append(ri, r*pagesPer+int(w.dst[k]))
				}
			}
			x, err := ini.NewXfer(nixl.Write, local, li, dests, ri, []byte(strconv.Itoa(i)))
			require.NoError(b, err)
			live[x] = w
			posted[i] = time.Now()
			require.NoError(b, ini.PostTo(x, done))
			i++
			continue
		}
		x := <-done
		st, err := ini.Status(x)
		require.Equal(b, nixl.Done, st, "a bare write: %v", err)
		w := live[x]
		delete(live, x)
		require.NoError(b, ini.Release(x))
		srcPages.Put(w.src)
		dstPages.Put(w.dst)
		if gap > 0 {
			time.Sleep(gap)
		}
	}
	select {
	case <-all:
	case <-time.After(time.Minute):
		mu.Lock()
		defer mu.Unlock()
		b.Fatalf("the target had %d of %d notifications after a minute", got, n)
	}
	lat := make([]time.Duration, n)
	mu.Lock()
	for i := range lat {
		lat[i] = arrived[i].Sub(posted[i])
	}
	mu.Unlock()
	return lat
}

// BenchmarkPollSleep: how long the 50 µs sleep of BenchmarkControlOverhead's
// polling driver (pollRooms, after a sweep that found nothing to do)
// lasts here, with nothing else running: what that driver adds to a lone
// room.
func BenchmarkPollSleep(b *testing.B) {
	d := make([]time.Duration, b.N)
	for i := range d {
		t := time.Now()
		time.Sleep(50 * time.Microsecond)
		d[i] = time.Since(t)
	}
	b.ReportMetric(p50(d), "µs-slept-p50")
	b.ReportMetric(pctl(d, 0.99), "µs-slept-p99")
}
