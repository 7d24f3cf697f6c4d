package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/layerbench"
	"github.com/stretchr/testify/require"
)

// BenchmarkLayerwise: time to first token at decode behind a prefill rank
// that computes layer by layer, each layer sent as its compute ends
// (SendLayers) against the whole chunk after the last layer (Send), side
// by side in the same run, Llama-3-8B-shaped (32 layers, 4 KiB of KV per
// token per layer) over ucx shared memory, at 1K, 4K and 8K tokens. One
// layer's compute is calibrated to one layer's transfer time, measured
// first: compute=cpu is a float32 matrix-product kernel (it holds a core
// of the host, which the transfer may need), compute=device a wait that
// leaves the host CPU free, as a GPU running the layer's kernels does.
// b.N is the rooms of each way (run with -benchtime Nx). Goals (issue 25):
// ttft-ratio ≤ 0.6, tail/layer ≤ 1.5.
func BenchmarkLayerwise(b *testing.B) {
	c := newBenchCluster(b, llamaLayers, 512, llamaPage) // 8,192 tokens of 16-token pages
	g := &layerbench.Rig{Prefill: c.prefill, Decode: c.decode}
	for _, compute := range []string{"cpu", "device"} {
		for _, tokens := range []int{1024, 4096, 8192} {
			b.Run(fmt.Sprintf("compute=%s/tokens=%d", compute, tokens), func(b *testing.B) {
				res, err := g.Measure(context.Background(), layerbench.NewKernel(compute == "device"), tokens, 16, b.N, 3)
				require.NoError(b, err)
				ms := func(d time.Duration) float64 { return d.Seconds() * 1e3 }
				b.ReportMetric(0, "ns/op")
				b.ReportMetric(ms(res.Layerwise.TTFT), "ttft-ms")
				b.ReportMetric(ms(res.Whole.TTFT), "whole-ttft-ms")
				b.ReportMetric(res.TTFTRatio(), "ttft-ratio")
				b.ReportMetric(ms(res.Layerwise.Tail), "tail-ms")
				b.ReportMetric(ms(res.LayerTransfer), "layer-xfer-ms")
				b.ReportMetric(ms(res.StreamedLayerTransfer), "streamed-layer-xfer-ms")
				b.ReportMetric(ms(res.LayerCompute), "layer-compute-ms")
				b.ReportMetric(res.TailRatio(), "tail/layer")
				b.ReportMetric(ms(res.LayerwiseCPU), "cpu-ms/room")
				b.ReportMetric(ms(res.WholeCPU), "whole-cpu-ms/room")
			})
		}
	}
}
