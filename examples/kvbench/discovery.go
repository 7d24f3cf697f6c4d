package main

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/cpustat"
	"github.com/kvbridge/kvbridge/internal/discovery"
	"github.com/kvbridge/kvbridge/internal/etcdtest"
	"github.com/kvbridge/kvbridge/internal/records"
)

// discoveryMode: 64 prefill instances × 8 ranks published by this process,
// in an embedded etcd server and in 64 HTTP bootstrap servers (one per
// instance, as each instance embeds one). Measured: a decode rank resolving
// an instance it has not seen (topology and its 8 ranks, connection
// included), and the etcd watch's delay for a restarted rank (new
// endpoint) next to an HTTP lookup of that rank, which is how a decode rank
// finds it without a watch (once heartbeats have declared the old one dead).
func (b *bench) discoveryMode() error {
	const instances, ranks = 64, 8
	samples := 32
	if b.quick {
		samples = 4
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	etcd, err := etcdtest.Start()
	if err != nil {
		return err
	}
	defer etcd.Close()
	auth := benchAuth()
	rec := func(inst string, tp int, port int) records.RankRecord {
		return records.RankRecord{Instance: inst, DPSize: 1, TPRank: tp, TPSize: ranks, PPSize: 1,
			Endpoint: fmt.Sprintf("tcp://10.0.%d.%d:%d", tp, len(inst), port), PageSize: 16, DType: "bf16", Compat: "v1:bench"}
	}
	var etcdURLs, httpURLs []string
	var owners []*discovery.EtcdClient
	defer func() {
		for _, o := range owners {
			o.Close()
		}
	}()
	progress("discovery", 0, 4)
	for i := 0; i < instances; i++ {
		name := fmt.Sprintf("inst-%d", i)
		url := "etcd://" + etcd.Endpoint + "/" + name
		o, err := discovery.DialEtcd(url, bootstrap.EtcdConfig{})
		if err != nil {
			return err
		}
		owners = append(owners, o)
		srv, err := bootstrap.NewServer(bootstrap.ServerConfig{Token: auth.BootstrapToken()})
		if err != nil {
			return err
		}
		if err := srv.Start("127.0.0.1:0"); err != nil {
			return err
		}
		defer srv.Close(context.Background())
		hc := discovery.NewClient(srv.URL())
		hc.Token = auth.BootstrapToken()
		for tp := 0; tp < ranks; tp++ {
			if _, err := o.RegisterRank(ctx, rec(name, tp, 17000)); err != nil {
				return err
			}
			if _, err := hc.RegisterRank(ctx, rec(name, tp, 17000)); err != nil {
				return err
			}
		}
		etcdURLs, httpURLs = append(etcdURLs, url), append(httpURLs, srv.URL())
	}
	progress("discovery", 1, 4)
	// resolve: wall and CPU time (client and servers are all in this
	// process).
	var cpuE, cpuH time.Duration
	resolve := func(url string, cpuSum *time.Duration) (time.Duration, error) {
		m, err := cpustat.Start(0)
		if err != nil {
			return 0, err
		}
		defer func() {
			if r, err := m.Read(); err == nil {
				*cpuSum += r.Total()
			}
		}()
		start := time.Now()
		d, err := discovery.Dial(url, discovery.DialOptions{})
		if err != nil {
			return 0, err
		}
		defer d.Close()
		if _, err := d.Topology(ctx); err != nil {
			return 0, err
		}
		for tp := 0; tp < ranks; tp++ {
			if _, err := d.Rank(ctx, 0, tp, 0); err != nil {
				return 0, err
			}
		}
		return time.Since(start), nil
	}
	var re, rh []time.Duration
	for s := 0; s < samples; s++ {
		i := (s * 7) % instances
		e, err := resolve(etcdURLs[i], &cpuE)
		if err != nil {
			return err
		}
		h, err := resolve(httpURLs[i], &cpuH)
		if err != nil {
			return err
		}
		re, rh = append(re, e), append(rh, h)
	}
	progress("discovery", 2, 4)
	// A restarted rank: the watch's delay, next to one HTTP lookup.
	watcher, err := discovery.DialEtcd(etcdURLs[0], bootstrap.EtcdConfig{})
	if err != nil {
		return err
	}
	defer watcher.Close()
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	events := watcher.Watch(wctx)
	time.Sleep(100 * time.Millisecond) // let the watch start (a benchmark, not a test)
	var we, wh []time.Duration
	var cpuW, cpuL time.Duration
	hc := discovery.NewClient(httpURLs[0])
	cur := rec("inst-0", 3, 17000).Endpoint
	for s := 0; s < samples; s++ {
		r := rec("inst-0", 3, 18000+s)
		// The old process deregisters (or its lease lapses), the new one
		// registers: timed from the new record's put to the watch event.
		if err := owners[0].DeregisterRank(ctx, 0, 3, 0, cur); err != nil {
			return err
		}
		m, err := cpustat.Start(0)
		if err != nil {
			return err
		}
		start := time.Now()
		if _, err := owners[0].RegisterRank(ctx, r); err != nil {
			return err
		}
		for ev := range events {
			if !ev.Deleted && ev.Endpoint == r.Endpoint {
				break
			}
		}
		we = append(we, time.Since(start))
		u, err := m.Read()
		if err != nil {
			return err
		}
		cpuW += u.Total()
		cur = r.Endpoint
		if m, err = cpustat.Start(0); err != nil {
			return err
		}
		hs := time.Now()
		if _, err := hc.Rank(ctx, 0, 3, 0); err != nil {
			return err
		}
		wh = append(wh, time.Since(hs))
		if u, err = m.Read(); err != nil {
			return err
		}
		cpuL += u.Total()
	}
	progress("discovery", 4, 4)
	ms := func(d []time.Duration) float64 {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return float64(d[len(d)/2].Microseconds()) / 1e3
	}
	// CPU: ms per operation, mean over the samples (servers and client).
	per := func(d time.Duration) float64 { return d.Seconds() * 1e3 / float64(samples) }
	b.add(Row{Mode: "discovery", Name: fmt.Sprintf("resolve a new instance (%d ranks), etcd, p50", ranks), Value: ms(re), Unit: "ms",
		References: map[string]float64{"HTTP server": ms(rh)},
		CPU:        per(cpuE), CPUUnit: "ms/resolve", RefCPU: map[string]float64{"HTTP server": per(cpuH)}})
	b.add(Row{Mode: "discovery", Name: "restarted rank seen (etcd watch), p50", Value: ms(we), Unit: "ms",
		References: map[string]float64{"HTTP lookup": ms(wh)},
		CPU:        per(cpuW), CPUUnit: "ms/restart seen", RefCPU: map[string]float64{"HTTP lookup": per(cpuL)}})
	return nil
}
