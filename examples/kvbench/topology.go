package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/cpustat"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/kvbridge/kvbridge/transfer"
)

// topoCluster is a bootstrap server, a prefill instance of TP p and a
// decode instance of TP d, every rank a Manager in this process.
type topoCluster struct {
	srv      *bootstrap.Server
	prefills []*kvmanager.Prefill
	decodes  []*kvmanager.Decode
	next     uint64
}

func (b *bench) topoCluster(ptp, dtp int, layout transfer.PageLayout, pages int) (c *topoCluster, err error) {
	return b.topoClusterPages(ptp, dtp, layout, pages, b.model.PageTokens, b.model.PageTokens, pages)
}

// topoClusterPages is topoCluster with each side's tokens per page and
// pages per region.
func (b *bench) topoClusterPages(ptp, dtp int, layout transfer.PageLayout, pages, prefillPT, decodePT, decodePages int, mods ...func(*kvmanager.Config)) (c *topoCluster, err error) {
	auth := benchAuth()
	c = &topoCluster{}
	if c.srv, err = bootstrap.NewServer(bootstrap.ServerConfig{Token: auth.BootstrapToken()}); err != nil {
		return nil, err
	}
	// The cleanup holds its own reference: "return nil, err" sets the
	// named result c to nil before deferred functions run.
	built := c
	defer func() {
		if err != nil {
			built.close()
		}
	}()
	if err = c.srv.Start("127.0.0.1:0"); err != nil {
		return nil, err
	}
	inst := fmt.Sprintf("kvbench-topo-%d", time.Now().UnixNano())
	mk := func(role kvmanager.Role, par transfer.Parallel) (kvmanager.Config, error) {
		cfg := kvmanager.DefaultConfig(role)
		cfg.Auth = auth
		cfg.Instance = inst + map[kvmanager.Role]string{kvmanager.RolePrefill: "-p", kvmanager.RoleDecode: "-d"}[role]
		cfg.Compat, cfg.BootstrapURL = b.model.Compat(), c.srv.URL()
		cfg.Engine = nixl.Config{Engine: b.engine, UCX: map[string]string{"TLS": b.tls}}
		cfg.Engine.FromEnv()
		m, n := b.model, pages
		m.PageTokens = prefillPT
		if role == kvmanager.RoleDecode {
			m.PageTokens, n = decodePT, decodePages
		}
		cfg.Parallel, cfg.Model, cfg.PageTokens = par, m.Mapping(layout), m.PageTokens
		var err error
		cfg.Layout, err = m.RankLayout(b.mem, layout, par, n, 4096)
		if err == nil && b.mem == nixl.VRAM {
			err = b.vramRegions(cfg.Layout.Regions) // (freed by the mode once the ranks are closed)
		}
		for _, mod := range mods {
			mod(&cfg)
		}
		return cfg, err
	}
	for r := 0; r < ptp; r++ {
		cfg, err := mk(kvmanager.RolePrefill, transfer.Parallel{TPSize: ptp, TPRank: r})
		if err != nil {
			return nil, err
		}
		p, err := kvmanager.NewPrefill(cfg)
		if err != nil {
			return nil, err
		}
		c.prefills = append(c.prefills, p)
	}
	for r := 0; r < dtp; r++ {
		cfg, err := mk(kvmanager.RoleDecode, transfer.Parallel{TPSize: dtp, TPRank: r})
		if err != nil {
			return nil, err
		}
		d, err := kvmanager.NewDecode(cfg)
		if err != nil {
			return nil, err
		}
		c.decodes = append(c.decodes, d)
	}
	return c, nil
}

func (c *topoCluster) close() {
	for _, d := range c.decodes {
		d.Close()
	}
	for _, p := range c.prefills {
		p.Close()
	}
	c.srv.Close(context.Background())
}

// room moves one request: every decode rank asks, every prefill rank sends
// its pages in 128-page chunks (concurrently, as a TP group does).
func (c *topoCluster) room(src, dst []uint32) error { return c.roomChunks(src, dst, 128) }

// roomChunks is room with chunks of chunk prefill pages.
func (c *topoCluster) roomChunks(src, dst []uint32, chunk int) error {
	c.next++
	id := c.next
	ctx := context.Background()
	var rs []*receiver.Receiver
	var ss []*sender.Sender
	defer func() {
		for _, r := range rs {
			r.Clear()
		}
		for _, s := range ss {
			s.Clear()
		}
	}()
	for _, d := range c.decodes {
		r, err := receiver.NewFor(d, id, "", kvmanager.AutoDP)
		if err != nil {
			return err
		}
		rs = append(rs, r)
	}
	for _, p := range c.prefills {
		s, err := sender.New(p, id)
		if err != nil {
			return err
		}
		s.Init()
		ss = append(ss, s)
	}
	for _, r := range rs {
		if err := r.Init(ctx, kvmanager.RequestSpec{DstPages: dst, AuxIndex: int(id % 4096)}); err != nil {
			return err
		}
	}
	errs := make([]error, len(ss))
	var wg sync.WaitGroup
	for i, s := range ss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if st, err := s.WaitReady(ctx); st != kvmanager.WaitingForInput {
				errs[i] = fmt.Errorf("room %d: prefill rank %d: %v %v", id, i, st, err)
				return
			}
			for k := 0; k < len(src); k += chunk {
				end := min(k+chunk, len(src))
				if err := s.Send(src[k:end], end == len(src), int(id%4096)); err != nil {
					errs[i] = err
					return
				}
			}
			s.Wait(ctx)
			<-s.Released() // a pulled room's pages are free only then
		}()
	}
	for i, r := range rs {
		if st, _ := r.Wait(ctx); st != kvmanager.Success {
			errs = append(errs, fmt.Errorf("room %d: decode rank %d: %v: %s", id, i, st, r.Failure()))
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// timeRooms runs warm once, then room iters times, and returns GB/s (bytes
// a room), CPU s/GB and CPU µs per room (every rank is in this process).
func timeRooms(iters int, bytes float64, warm, room func() error) (gbps, cpuPerGB, cpuRoom float64, err error) {
	if err := warm(); err != nil {
		return 0, 0, 0, err
	}
	wall, cpu, err := cpuOver(func() error {
		for i := 0; i < iters; i++ {
			if err := room(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, 0, 0, err
	}
	return bytes * float64(iters) / wall.Seconds() / 1e9, cpustat.PerGB(cpu, bytes*float64(iters)),
		float64(cpu.Microseconds()) / float64(iters), nil
}

// topologyMode: heterogeneous TP (prefill TP 2 → decode TP 1, TP 1 → TP 2)
// with head-sliced writes, NHD and HND, next to TP 1 → TP 1 moving the same
// bytes with whole pages, in the same run.
func (b *bench) topologyMode() error {
	tokens, iters := 4096, 6
	if b.quick {
		tokens, iters = 512, 2
	}
	n := tokens / b.model.PageTokens
	pages := 2 * n
	bytes := float64(n) * float64(b.model.PageBytes()) * float64(2*b.model.Layers) // into the decode instance, all ranks
	// measure: GB/s, CPU s/GB and CPU µs per room (every rank is in this
	// process).
	measure := func(ptp, dtp int, layout transfer.PageLayout) (float64, float64, float64, error) {
		c, err := b.topoCluster(ptp, dtp, layout, pages)
		if err != nil {
			return 0, 0, 0, err
		}
		defer c.close()
		rng := rand.New(rand.NewPCG(3, 4))
		all := scatter("contiguous", pages, pages, rng)
		return timeRooms(iters, bytes, func() error { return c.room(all, all) }, // warm up: touch every page
			func() error {
				return c.room(scatter("fragmented", n, pages, rng), scatter("fragmented", n, pages, rng))
			})
	}
	steps := 0
	for _, layout := range []transfer.PageLayout{transfer.HND, transfer.NHD} {
		progress("topology", steps, 6)
		ref, refCPU, _, err := measure(1, 1, layout)
		if err != nil {
			return err
		}
		steps++
		for _, tp := range [][2]int{{2, 1}, {1, 2}} {
			progress("topology", steps, 6)
			v, cpu, room, err := measure(tp[0], tp[1], layout)
			if err != nil {
				return err
			}
			steps++
			b.add(Row{Mode: "topology", Name: fmt.Sprintf("%s TP %d→%d %v %d tok", b.model.Name, tp[0], tp[1], layout, tokens),
				Bytes: uint64(bytes), Value: v, Unit: "GB/s", References: map[string]float64{"TP 1→1": ref},
				CPU: cpu, CPUUnit: "s/GB", RefCPU: map[string]float64{"TP 1→1": refCPU}, CPURoom: room})
		}
	}
	progress("topology", steps, 6)
	return nil
}

// pagesMode: pages of different sizes on the two sides (TP 1 → 1), HND and
// NHD, next to equal pages moving the same bytes in the same run: prefill
// pages of a quarter and of four times the decode rank's. Each side's
// pages are fragmented in runs of 8; chunks carry 2,048 tokens.
func (b *bench) pagesMode() error {
	tokens, iters := 4096, 6
	if b.quick {
		tokens, iters = 512, 2
	}
	pt := b.model.PageTokens
	bytes := float64(tokens) * float64(b.model.BytesPerToken())
	measure := func(layout transfer.PageLayout, prefillPT, decodePT int) (float64, float64, float64, error) {
		pn, dn := tokens/prefillPT, tokens/decodePT
		c, err := b.topoClusterPages(1, 1, layout, 2*pn, prefillPT, decodePT, 2*dn)
		if err != nil {
			return 0, 0, 0, err
		}
		defer c.close()
		chunk := min(2048/prefillPT, pn)
		rng := rand.New(rand.NewPCG(3, 4))
		room := func(kind string) func() error {
			return func() error {
				return c.roomChunks(scatter(kind, pn, 2*pn, rng), scatter(kind, dn, 2*dn, rng), chunk)
			}
		}
		return timeRooms(iters, bytes, room("contiguous"), room("fragmented"))
	}
	steps := 0
	for _, layout := range []transfer.PageLayout{transfer.HND, transfer.NHD} {
		progress("pages", steps, 6)
		ref, refCPU, _, err := measure(layout, pt, pt)
		if err != nil {
			return err
		}
		steps++
		for _, sizes := range [][2]int{{max(pt/4, 1), pt}, {pt * 4, pt}} {
			progress("pages", steps, 6)
			v, cpu, room, err := measure(layout, sizes[0], sizes[1])
			if err != nil {
				return err
			}
			steps++
			key := fmt.Sprintf("pages %d→%d", pt, pt)
			b.add(Row{Mode: "pages", Name: fmt.Sprintf("%s pages %d→%d %v %d tok", b.model.Name, sizes[0], sizes[1], layout, tokens),
				Bytes: uint64(bytes), Value: v, Unit: "GB/s", References: map[string]float64{key: ref},
				CPU: cpu, CPUUnit: "s/GB", RefCPU: map[string]float64{key: refCPU}, CPURoom: room})
		}
	}
	progress("pages", steps, 6)
	return nil
}
