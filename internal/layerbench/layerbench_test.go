package layerbench

import (
	"context"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newRig is a prefill and a decode rank over the loopback engine with the
// tiny model's layout (2 layers) or layers layers of it.
func newRig(t *testing.T, layers, pages int) *Rig {
	t.Helper()
	srv := testauth.Server()
	require.NoError(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { srv.Close(context.Background()) })
	model := kvmodel.Presets["tiny"]
	model.Layers = layers
	mk := func(role kvmanager.Role) kvmanager.Config {
		cfg := kvmanager.DefaultConfig(role)
		cfg.Auth = testauth.Auth()
		cfg.Instance = fmt.Sprintf("layerbench-%d", time.Now().UnixNano())
		cfg.Compat, cfg.BootstrapURL = model.Compat(), srv.URL()
		cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
		cfg.Layout = model.Layout(nixl.DRAM, pages, 16)
		return cfg
	}
	reg := prometheus.NewRegistry() // the prefill rank's: Room.Posted
	pcfg := mk(kvmanager.RolePrefill)
	pcfg.Registerer = reg
	p, err := kvmanager.NewPrefill(pcfg)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	d, err := kvmanager.NewDecode(mk(kvmanager.RoleDecode))
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return &Rig{Prefill: p, Decode: d, Verify: true, Metrics: reg}
}

// TestRoomsLandAsComputed: with each layer sent as its compute ends, and
// with the whole chunk after the last layer, every layer's pages at decode
// hold what that room's compute wrote (each room writes its own pattern:
// a layer posted before its compute would carry the previous room's).
func TestRoomsLandAsComputed(t *testing.T) {
	g := newRig(t, 4, 8)
	k, dev := NewKernel(false), NewKernel(true)
	k.Reps = 2
	src, dst := []uint32{1, 2, 3}, []uint32{7, 0, 4}
	ctx := context.Background()
	for i := range 8 {
		kern := k
		if i >= 4 {
			kern = dev
		}
		rm, err := g.RunRoom(ctx, src, dst, i%2 == 1, kern)
		require.NoError(t, err, "room %d (layer-wise %v)", i+1, i%2 == 1)
		require.GreaterOrEqual(t, rm.TTFT, rm.Tail, "room %d: TTFT shorter than its tail", i+1)
		require.GreaterOrEqual(t, rm.TTFT, rm.Compute, "room %d: TTFT shorter than its compute", i+1)
		// A write per layer group (and the aux item's) against one write
		// of every layer (and the aux item's).
		require.Equal(t, map[bool]uint64{true: 4 + 1, false: 1 + 1}[i%2 == 1], rm.Posted, "room %d (layer-wise %v): writes posted", i+1, i%2 == 1)
	}
	require.Equal(t, 4, g.Prefill.Layers(), "prefill layers")
}

// TestVerifyCatchesAStalePage: the check RunRoom makes would see a page the
// layer did not land in (the room's pattern differs from the last room's).
func TestVerifyCatchesAStalePage(t *testing.T) {
	g := newRig(t, 2, 4)
	k := NewKernel(false)
	src, dst := []uint32{0, 1}, []uint32{2, 3}
	_, err := g.RunRoom(context.Background(), src, dst, true, k)
	require.NoError(t, err)
	pkv, _ := g.Prefill.Memory()
	k.Layer(pkv, g.Prefill.Config().Layout.PageBytes, src, 99, 1) // as a next room's compute, not sent
	require.ErrorIs(t, g.verify(99, k, src, dst, 2), errMismatch, "a layer computed and not sent passed the check")
}

// TestMeasure: the figures of a short measurement are all there and
// consistent (their values are the benchmark's, not asserted).
func TestMeasure(t *testing.T) {
	g := newRig(t, 4, 16)
	res, err := g.Measure(context.Background(), NewKernel(false), 256, 16, 2, 2)
	require.NoError(t, err)
	require.EqualValues(t, 4, res.Layers, "incomplete result %+v", res)
	require.EqualValues(t, 2, res.Rooms, "incomplete result %+v", res)
	require.EqualValues(t, 256, res.Tokens, "incomplete result %+v", res)
	require.Positive(t, res.LayerTransfer, "incomplete result %+v", res)
	require.Positive(t, res.StreamedLayerTransfer, "incomplete result %+v", res)
	require.Positive(t, res.LayerCompute, "incomplete result %+v", res)
	require.Positive(t, res.Whole.TTFT, "incomplete result %+v", res)
	require.Positive(t, res.Layerwise.TTFT, "incomplete result %+v", res)
	require.Positive(t, res.WholeCPU, "incomplete result %+v", res)
	require.Positive(t, res.LayerwiseCPU, "incomplete result %+v", res)
	require.Positive(t, res.TTFTRatio(), "ratios")
	require.Positive(t, res.TailRatio(), "ratios")
}

// TestCalibrate: more products take longer, so the calibration can aim
// (Reps grows with the target; the times themselves are not asserted).
func TestCalibrate(t *testing.T) {
	k := NewKernel(false)
	kv := [][]byte{make([]byte, 4096), make([]byte, 4096)}
	k.Calibrate(0, kv, 1024, []uint32{0, 1})
	require.Zero(t, k.Reps, "target 0: Reps")
	k.Calibrate(50*time.Millisecond, kv, 1024, []uint32{0, 1})
	require.GreaterOrEqual(t, k.Reps, 10, "target 50ms: Reps")
	d := NewKernel(true)
	d.Calibrate(time.Millisecond, kv, 1024, []uint32{0, 1})
	require.Positive(t, d.Wait, "device stand-in, target 1ms: Wait")
	require.LessOrEqual(t, d.Wait, time.Millisecond, "device stand-in, target 1ms: Wait")
	require.Zero(t, d.Reps, "device stand-in, target 1ms: Reps")
}
