package main

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"fmt"
	"slices"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/cuda"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/sender"
	kvtransfer "github.com/kvbridge/kvbridge/transfer"
)

// layerwise (-layerwise) is the layer-wise benchmark on the GPU: time to first
// token at decode behind a prefill rank whose layers are computed on the
// device, each layer sent once the CUDA event recorded after it completes
// (SendLayers gated by Event.Ready), against the whole chunk sent after
// the stream drained (Send), side by side in one run. There is no CUDA
// kernel to build here, so a layer's "compute" is cuMemcpyDtoDAsync on a
// stream writing the layer's K and V pages, repeated to take about one
// layer's transfer time (measured first: whole-chunk rooms without compute,
// divided by the layers). Both ranks are in this process (the ucx engine
// maps its own VRAM directly), Llama-3-8B-shaped pages (32 KiB: 16 tokens
// × 8 KV heads × 128 × bf16).

type lwCase struct {
	Tokens          int     `json:"tokens"`
	Layers          int     `json:"layers"`
	Rooms           int     `json:"rooms"`
	LayerTransferMS float64 `json:"layer_transfer_ms"`
	LayerComputeMS  float64 `json:"layer_compute_ms"`
	CopiesPerLayer  int     `json:"copies_per_layer"`
	WholeTTFTMS     float64 `json:"whole_ttft_ms"`
	LayerTTFTMS     float64 `json:"layerwise_ttft_ms"`
	TTFTRatio       float64 `json:"ttft_ratio"`
	WholeTailMS     float64 `json:"whole_tail_ms"`
	LayerTailMS     float64 `json:"layerwise_tail_ms"`
	TailRatio       float64 `json:"tail_vs_layer_transfer"`
}

type lwRig struct {
	ctx      *cuda.Context
	stream   *cuda.Stream
	prefill  *kvmanager.Prefill
	decode   *kvmanager.Decode
	pre, dec []nixl.Desc // the ranks' KV regions (VRAM)
	scratch  cuda.DevicePtr
	page     uint64
	next     uint64
}

func runLayerwise(layers int, tokens []int, rooms int) ([]lwCase, error) {
	drv, err := cuda.OpenDriver(cuda.DriverPathFromEnv())
	if err != nil {
		return nil, err
	}
	ctx, err := drv.Primary(0)
	if err != nil {
		return nil, err
	}
	defer ctx.Release()
	const page = pageSize
	maxPages := (slices.Max(tokens) + 15) / 16
	region := uint64(maxPages) * page
	g := &lwRig{ctx: ctx, page: page}
	alloc := func() (cuda.DevicePtr, []nixl.Desc, error) {
		// Each region is followed by its ownership proof slot.
		stride := region + kvtransfer.ProofBytes
		p, err := ctx.Alloc(stride * uint64(2*layers))
		if err != nil {
			return 0, nil, fmt.Errorf("allocating %d MiB of KV: %w", stride*uint64(2*layers)>>20, err)
		}
		var rs []nixl.Desc
		for i := range 2 * layers {
			rs = append(rs, nixl.Desc{Addr: uintptr(p) + uintptr(uint64(i)*stride), Len: region, Dev: 0})
		}
		return p, rs, nil
	}
	pre, preRegions, err := alloc()
	if err != nil {
		return nil, err
	}
	defer ctx.Free(pre)
	dec, decRegions, err := alloc()
	if err != nil {
		return nil, err
	}
	defer ctx.Free(dec)
	g.pre, g.dec = preRegions, decRegions
	if g.scratch, err = ctx.Alloc(region); err != nil {
		return nil, err
	}
	defer ctx.Free(g.scratch)
	fill := make([]byte, region)
	for i := range fill {
		fill[i] = byte(i*7 + i/4096)
	}
	if err := ctx.CopyHtoD(g.scratch, fill); err != nil {
		return nil, err
	}
	if g.stream, err = ctx.NewStream(); err != nil {
		return nil, err
	}
	defer g.stream.Destroy()

	var secret [32]byte
	if _, err := crand.Read(secret[:]); err != nil {
		return nil, err
	}
	auth, err := bootstrap.NewAuth(secret[:])
	if err != nil {
		return nil, err
	}
	srv, err := bootstrap.NewServer(bootstrap.ServerConfig{Token: auth.BootstrapToken()})
	if err != nil {
		return nil, err
	}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		return nil, err
	}
	defer srv.Close(context.Background())
	mk := func(role kvmanager.Role, regions []nixl.Desc) kvmanager.Config {
		cfg := kvmanager.DefaultConfig(role)
		cfg.Auth = auth
		cfg.Instance = fmt.Sprintf("gpucheck-lw-%d", time.Now().UnixNano())
		cfg.Compat, cfg.BootstrapURL = fmt.Sprintf("gpucheck-lw:L%d:P%d", layers, page), srv.URL()
		cfg.Engine = nixl.Config{Engine: nixl.EngineUCX, UCX: map[string]string{"TLS": "posix,cma,self"}}
		cfg.Engine.FromEnv()
		cfg.Layout = kvtransfer.Layout{Kind: nixl.VRAM, PageBytes: page, Regions: regions, AuxItemBytes: 64, Aux: nixl.Desc{Len: 64 * 64}}
		return cfg
	}
	if g.prefill, err = kvmanager.NewPrefill(mk(kvmanager.RolePrefill, preRegions)); err != nil {
		return nil, err
	}
	defer g.prefill.Close()
	if g.decode, err = kvmanager.NewDecode(mk(kvmanager.RoleDecode, decRegions)); err != nil {
		return nil, err
	}
	defer g.decode.Close()

	var out []lwCase
	for _, n := range tokens {
		c, err := g.measure(layers, n, rooms)
		if err != nil {
			return nil, fmt.Errorf("%d tokens: %w", n, err)
		}
		fmt.Printf("layerwise %d tok, %d layers: one layer's transfer %.3g ms, compute %.3g ms (%d copies); TTFT %.3g ms vs whole-chunk %.3g ms (ratio %.2f, goal ≤ 0.6); tail %.3g ms = %.2f × a layer's transfer (goal ≤ 1.5; whole-chunk %.3g ms)\n",
			n, layers, c.LayerTransferMS, c.LayerComputeMS, c.CopiesPerLayer, c.LayerTTFTMS, c.WholeTTFTMS, c.TTFTRatio, c.LayerTailMS, c.TailRatio, c.WholeTailMS)
		out = append(out, c)
	}
	return out, nil
}

// compute queues layer l's "compute" on the stream: copies copies of the
// scratch buffer into the layer's K and V pages [0, n).
func (g *lwRig) compute(l, n, copies int) error {
	size := uint64(n) * g.page
	for range copies {
		for r := 2 * l; r < 2*l+2; r++ {
			if err := g.stream.CopyDtoDAsync(cuda.DevicePtr(g.pre[r].Addr), g.scratch, size); err != nil {
				return err
			}
		}
	}
	return nil
}

type lwRoom struct{ ttft, tail time.Duration }

// room moves one room of n pages; copies < 0: no compute (the transfer
// alone, whole-chunk).
func (g *lwRig) room(layers, n, copies int, layerwise bool) (lwRoom, error) {
	g.next++
	id := g.next
	ctx := context.Background()
	pages := make([]uint32, n)
	for i := range pages {
		pages[i] = uint32(i)
	}
	r, err := receiver.New(g.decode, id)
	if err != nil {
		return lwRoom{}, err
	}
	defer r.Clear()
	s, err := sender.New(g.prefill, id)
	if err != nil {
		return lwRoom{}, err
	}
	defer s.Clear()
	s.Init()
	aux := int(id % 64)
	if err := r.Init(ctx, kvmanager.RequestSpec{DstPages: pages, AuxIndex: aux}); err != nil {
		return lwRoom{}, err
	}
	if st, err := s.WaitReady(ctx); st != kvmanager.WaitingForInput {
		return lwRoom{}, fmt.Errorf("room %d: %v %v %s", id, st, err, s.Failure())
	}
	// The room's own bytes: a stamp at the head of the scratch buffer every
	// layer's copies carry (a page not written for this room would show).
	stamp := bytes.Repeat([]byte{byte(id), byte(id >> 8), 0x5a, 0xa5}, 64)
	if err := g.ctx.CopyHtoD(g.scratch, stamp); err != nil {
		return lwRoom{}, err
	}
	var events []*cuda.Event
	defer func() {
		for _, e := range events {
			e.Destroy()
		}
	}()
	start := time.Now()
	if copies >= 0 {
		for l := range layers {
			if err := g.compute(l, n, copies); err != nil {
				return lwRoom{}, err
			}
			ev, err := g.stream.Record()
			if err != nil {
				return lwRoom{}, err
			}
			events = append(events, ev)
			if layerwise {
				if err := s.SendLayers(pages, l, l+1, true, aux, ev.Ready()); err != nil {
					return lwRoom{}, err
				}
			}
		}
		// The host learns when the last layer's compute ended by waiting
		// for its event (the layer-wise posts do not wait for this).
		if err := events[len(events)-1].Sync(); err != nil {
			return lwRoom{}, err
		}
	}
	computed := time.Now()
	if !layerwise {
		if err := s.Send(pages, true, aux); err != nil {
			return lwRoom{}, err
		}
	}
	st, err := r.Wait(ctx)
	end := time.Now()
	if st != kvmanager.Success {
		return lwRoom{}, fmt.Errorf("room %d: decode %v %v %s", id, st, err, r.Failure())
	}
	if st, err := s.Wait(ctx); st != kvmanager.Success {
		return lwRoom{}, fmt.Errorf("room %d: prefill %v %v %s", id, st, err, s.Failure())
	}
	if copies >= 0 {
		if err := g.verify(layers, n, stamp); err != nil {
			return lwRoom{}, fmt.Errorf("room %d: %w", id, err)
		}
	}
	return lwRoom{ttft: end.Sub(start), tail: end.Sub(computed)}, nil
}

// verify compares the first and last page of every region at decode with
// prefill's, and the first page's head with the room's stamp.
func (g *lwRig) verify(layers, n int, stamp []byte) error {
	a, b := make([]byte, g.page), make([]byte, g.page)
	for r := range 2 * layers {
		for _, p := range []int{0, n - 1} {
			off := cuda.DevicePtr(uint64(p) * g.page)
			if err := g.ctx.CopyDtoH(a, cuda.DevicePtr(g.pre[r].Addr)+off); err != nil {
				return err
			}
			if err := g.ctx.CopyDtoH(b, cuda.DevicePtr(g.dec[r].Addr)+off); err != nil {
				return err
			}
			if !bytes.Equal(a, b) || (p == 0 && !bytes.Equal(a[:len(stamp)], stamp)) {
				return fmt.Errorf("region %d page %d differs at decode", r, p)
			}
		}
	}
	return nil
}

func (g *lwRig) measure(layers, tokens, rooms int) (lwCase, error) {
	c := lwCase{Tokens: tokens, Layers: layers, Rooms: rooms}
	n := (tokens + 15) / 16
	if _, err := g.room(layers, n, -1, false); err != nil { // warm-up
		return c, err
	}
	var xfer []time.Duration
	for range 3 {
		rm, err := g.room(layers, n, -1, false)
		if err != nil {
			return c, err
		}
		xfer = append(xfer, rm.tail)
	}
	layer := medianD(xfer) / time.Duration(layers)
	// One copy pass of a layer, timed on the stream.
	once := func(copies int) (time.Duration, error) {
		start := time.Now()
		if err := g.compute(0, n, copies); err != nil {
			return 0, err
		}
		err := g.stream.Sync()
		return time.Since(start), err
	}
	if _, err := once(1); err != nil {
		return c, err
	}
	per, err := once(4)
	if err != nil {
		return c, err
	}
	per /= 4
	c.CopiesPerLayer = max(1, int((layer+per/2)/max(per, 1)))
	lc, err := once(c.CopiesPerLayer)
	if err != nil {
		return c, err
	}
	var ways [2][]lwRoom
	for i := range 2 * rooms {
		rm, err := g.room(layers, n, c.CopiesPerLayer, i%2 == 1)
		if err != nil {
			return c, err
		}
		ways[i%2] = append(ways[i%2], rm)
	}
	med := func(rs []lwRoom, f func(lwRoom) time.Duration) float64 {
		d := make([]time.Duration, len(rs))
		for i, r := range rs {
			d[i] = f(r)
		}
		return medianD(d).Seconds() * 1e3
	}
	ttft, tail := func(r lwRoom) time.Duration { return r.ttft }, func(r lwRoom) time.Duration { return r.tail }
	c.LayerTransferMS, c.LayerComputeMS = layer.Seconds()*1e3, lc.Seconds()*1e3
	c.WholeTTFTMS, c.LayerTTFTMS = med(ways[0], ttft), med(ways[1], ttft)
	c.WholeTailMS, c.LayerTailMS = med(ways[0], tail), med(ways[1], tail)
	c.TTFTRatio = c.LayerTTFTMS / c.WholeTTFTMS
	c.TailRatio = c.LayerTailMS / max(c.LayerTransferMS, 1e-9)
	return c, nil
}

func medianD(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
