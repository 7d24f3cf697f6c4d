package main

import (
	"context"
	"fmt"
	"time"

	"github.com/kvbridge/kvbridge/internal/layerbench"
)

// layerwiseMode: time to first token at decode behind a prefill rank that
// computes layer by layer, each layer sent as its compute ends
// (SendLayers) against the whole chunk after the last layer (Send), side
// by side in one run, at 1K, 4K and 8K tokens of the model's layout. One
// layer's compute is calibrated to one layer's transfer time, measured
// first (whole-chunk rooms without compute, divided by the layers; the
// same layer by layer is the tail row's "streamed" reference). The
// compute is a CPU kernel (float32 matrix products: it holds a host core)
// and a device stand-in (a wait on a device's schedule: the host CPU is
// free, as while a GPU runs the layer), per -layer-compute.
func (b *bench) layerwiseMode() error {
	tokens, rooms, probes := []int{1024, 4096, 8192}, b.layerRooms, 3
	if b.quick {
		tokens, rooms, probes = []int{256, 512}, 2, 1
	}
	computes := []string{"cpu", "device"}
	switch b.layerCompute {
	case "cpu", "device":
		computes = []string{b.layerCompute}
	case "both":
	default:
		return fmt.Errorf("-layer-compute %q: cpu, device or both", b.layerCompute)
	}
	pt := b.model.PageTokens
	c, err := b.cluster((tokens[len(tokens)-1] + pt - 1) / pt)
	if err != nil {
		return err
	}
	defer c.close()
	g := &layerbench.Rig{Prefill: c.prefill, Decode: c.decode, Verify: true}
	ms := func(d time.Duration) float64 { return d.Seconds() * 1e3 }
	total, done := len(tokens)*len(computes), 0
	for _, compute := range computes {
		for _, n := range tokens {
			progress("layerwise", done, total)
			res, err := g.Measure(context.Background(), layerbench.NewKernel(compute == "device"), n, pt, rooms, probes)
			if err != nil {
				return fmt.Errorf("%d tokens, %s compute: %w", n, compute, err)
			}
			done++
			name := fmt.Sprintf("%s %s tok %s", b.model.Name, humanTokens(n), compute)
			refCPU := map[string]float64{"whole-chunk": ms(res.WholeCPU)}
			b.add(Row{Mode: "layerwise", Name: name + " TTFT", Value: ms(res.Layerwise.TTFT), Unit: "ms",
				References: map[string]float64{"whole-chunk": ms(res.Whole.TTFT)},
				CPU:        ms(res.LayerwiseCPU), CPUUnit: "ms/room", RefCPU: refCPU})
			b.add(Row{Mode: "layerwise", Name: name + " tail", Value: ms(res.Layerwise.Tail), Unit: "ms",
				References: map[string]float64{"one layer's transfer": ms(res.LayerTransfer), "streamed": ms(res.StreamedLayerTransfer), "whole-chunk tail": ms(res.Whole.Tail)},
				CPU:        ms(res.LayerwiseCPU), CPUUnit: "ms/room", RefCPU: refCPU})
			b.notes = append(b.notes, fmt.Sprintf("layerwise %s: %d layers, one layer's compute %.3g ms / transfer %.3g ms (%.2f; streamed %.3g ms); TTFT ratio %.2f (goal ≤ 0.6), tail %.2f × a layer's transfer (goal ≤ 1.5); medians of %d rooms each way",
				name, res.Layers, ms(res.LayerCompute), ms(res.LayerTransfer), float64(res.LayerCompute)/float64(max(res.LayerTransfer, 1)),
				ms(res.StreamedLayerTransfer), res.TTFTRatio(), res.TailRatio(), res.Rooms))
		}
	}
	progress("layerwise", total, total)
	return nil
}

func humanTokens(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return fmt.Sprintf("%dK", n/1024)
	}
	return fmt.Sprint(n)
}
