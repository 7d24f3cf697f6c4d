package layerbench

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/nixl"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newRig is a prefill and a decode rank over the loopback engine with the
// tiny model's layout (2 layers) or layers layers of it.
func newRig(t *testing.T, layers, pages int) *Rig {
	t.Helper()
	srv := testauth.Server()
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
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
	p, err := kvmanager.NewPrefill(mk(kvmanager.RolePrefill))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	d, err := kvmanager.NewDecode(mk(kvmanager.RoleDecode))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return &Rig{Prefill: p, Decode: d, Verify: true}
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
		if err != nil {
			t.Fatalf("room %d (layer-wise %v): %v", i+1, i%2 == 1, err)
		}
		if rm.TTFT < rm.Tail || rm.TTFT < rm.Compute {
			t.Fatalf("room %d: TTFT %v shorter than its tail %v or compute %v", i+1, rm.TTFT, rm.Tail, rm.Compute)
		}
		// A write per layer group (and the aux item's) against one write
		// of every layer (and the aux item's).
		if want := map[bool]uint64{true: 4 + 1, false: 1 + 1}[i%2 == 1]; rm.Posted != want {
			t.Fatalf("room %d (layer-wise %v): %d writes posted, want %d", i+1, i%2 == 1, rm.Posted, want)
		}
	}
	if g.Prefill.Layers() != 4 {
		t.Fatalf("prefill layers %d", g.Prefill.Layers())
	}
}

// TestVerifyCatchesAStalePage: the check RunRoom makes would see a page the
// layer did not land in (the room's pattern differs from the last room's).
func TestVerifyCatchesAStalePage(t *testing.T) {
	g := newRig(t, 2, 4)
	k := NewKernel(false)
	src, dst := []uint32{0, 1}, []uint32{2, 3}
	if _, err := g.RunRoom(context.Background(), src, dst, true, k); err != nil {
		t.Fatal(err)
	}
	pkv, _ := g.Prefill.Memory()
	k.Layer(pkv, g.Prefill.Config().Layout.PageBytes, src, 99, 1) // as a next room's compute, not sent
	if err := g.verify(99, k, src, dst, 2); !errors.Is(err, errMismatch) {
		t.Fatalf("a layer computed and not sent passed the check: %v", err)
	}
}

// TestMeasure: the figures of a short measurement are all there and
// consistent (their values are the benchmark's, not asserted).
func TestMeasure(t *testing.T) {
	g := newRig(t, 4, 16)
	res, err := g.Measure(context.Background(), NewKernel(false), 256, 16, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if res.Layers != 4 || res.Rooms != 2 || res.Tokens != 256 || res.LayerTransfer <= 0 || res.StreamedLayerTransfer <= 0 || res.LayerCompute <= 0 ||
		res.Whole.TTFT <= 0 || res.Layerwise.TTFT <= 0 || res.WholeCPU <= 0 || res.LayerwiseCPU <= 0 {
		t.Fatalf("incomplete result %+v", res)
	}
	if res.TTFTRatio() <= 0 || res.TailRatio() <= 0 {
		t.Fatalf("ratios %v %v", res.TTFTRatio(), res.TailRatio())
	}
}

// TestCalibrate: more products take longer, so the calibration can aim
// (Reps grows with the target; the times themselves are not asserted).
func TestCalibrate(t *testing.T) {
	k := NewKernel(false)
	kv := [][]byte{make([]byte, 4096), make([]byte, 4096)}
	k.Calibrate(0, kv, 1024, []uint32{0, 1})
	if k.Reps != 0 {
		t.Fatalf("target 0: Reps %d", k.Reps)
	}
	k.Calibrate(50*time.Millisecond, kv, 1024, []uint32{0, 1})
	if k.Reps < 10 {
		t.Fatalf("target 50ms: Reps %d", k.Reps)
	}
	d := NewKernel(true)
	d.Calibrate(time.Millisecond, kv, 1024, []uint32{0, 1})
	if d.Wait <= 0 || d.Wait > time.Millisecond || d.Reps != 0 {
		t.Fatalf("device stand-in, target 1ms: Wait %v, Reps %d", d.Wait, d.Reps)
	}
}
