// Package layerbench measures time to first token at decode behind a
// prefill rank that computes layer by layer, in two ways side by side in
// the same run: each layer's KV sent as soon as its compute ends
// (Sender.SendLayers, one layer per call) against the whole chunk sent
// after the last layer (Sender.Send). kvbench -mode layerwise and
// internal/e2e's BenchmarkLayerwise use it.
//
// The compute is a CPU kernel standing in for a layer's forward pass: a
// float32 matrix product repeated Reps times, then the layer's K and V
// written into the room's prefill pages. Calibrate sizes Reps so that one
// layer's compute takes about one layer's transfer time, measured first
// in the same run: the case where layer-wise streaming gains most (TTFT
// tends to half of whole-chunk's) and where its goals are set.
package layerbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/kvbridge/kvbridge/internal/promread"
	"github.com/prometheus/client_golang/prometheus"
	"slices"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/internal/cpustat"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/sender"
)

// Kernel is the stand-in for one layer's forward pass.
type Kernel struct {
	// Reps is the number of kdim × kdim float32 matrix products per layer
	// (the CPU kernel: it holds a core the transfer may need).
	Reps int
	// Device makes the layer's time pass in a wait of Wait instead, the
	// host CPU free, as it is while a GPU runs the layer's kernels and the
	// host only records an event.
	// Device layers end on a device's schedule, not the host's: layer l
	// ends at Begin's time + (l+1)·Wait, so a late wake-up of the host does
	// not push the later layers back.
	Device bool
	Wait   time.Duration
	t0     time.Time

	a, b, c []float32
	pat     []byte
}

const kdim = 48

// NewKernel returns a CPU kernel with Reps 0 (it only stamps the pages),
// or with device a device stand-in with Wait 0.
func NewKernel(device bool) *Kernel {
	k := &Kernel{Device: device, a: make([]float32, kdim*kdim), b: make([]float32, kdim*kdim), c: make([]float32, kdim*kdim)}
	for i := range k.a {
		k.a[i], k.b[i] = float32(i%7)*0.25, float32(i%5)*0.5
	}
	return k
}

func (k *Kernel) matmul() {
	a, b, c := k.a, k.b, k.c
	for i := 0; i < kdim; i++ {
		for j := 0; j < kdim; j++ {
			var s float32
			for x := 0; x < kdim; x++ {
				s += a[i*kdim+x] * b[x*kdim+j]
			}
			c[i*kdim+j] = s
		}
	}
	a[0] = c[kdim*kdim-1] * 1e-9 // a dependency, so no product can be skipped
}

// StampBytes is how much of each page Layer writes.
const StampBytes = 256

// Layer computes layer l of room into the prefill pages: Reps products,
// then regions 2l (K) and 2l+1 (V) of every page stamped with the layer's
// pattern (Stamp) over their first StampBytes. Not the whole page: on a
// CPU, writing a layer's whole KV takes the memory bandwidth the transfer
// needs (at 8K tokens, 32 MiB a layer, as long as its transfer), where a
// GPU kernel writes it at HBM speed, a small part of the layer's time;
// the stamp still tells a page the layer wrote from one it did not.
func (k *Kernel) Layer(kv [][]byte, pageBytes uint64, pages []uint32, room uint64, l int) {
	if k.Device {
		time.Sleep(time.Until(k.t0.Add(time.Duration(l+1) * k.Wait)))
	} else {
		for range k.Reps {
			k.matmul()
		}
	}
	n := min(StampBytes, pageBytes)
	for r := 2 * l; r < 2*l+2; r++ {
		k.pat = Stamp(k.pat, n, room, r, k.c[0])
		for _, p := range pages {
			copy(kv[r][uint64(p)*pageBytes:], k.pat)
		}
	}
}

// Begin starts a room's forward pass (a device stand-in's layers end on
// the schedule from here).
func (k *Kernel) Begin(at time.Time) { k.t0 = at }

// Stamp is the n bytes Layer writes at the start of each page of region r
// for room (salt is the kernel's last product, so they depend on the
// compute).
func Stamp(buf []byte, n uint64, room uint64, r int, salt float32) []byte {
	buf = slices.Grow(buf[:0], int(n))[:n]
	seed := byte(room*31) ^ byte(r*7) ^ byte(int(salt)&0x0f)
	for i := range buf {
		buf[i] = seed + byte(i)
	}
	return buf
}

// Calibrate sets Reps (Wait with Device) so that Layer over pages takes
// about target, and returns the time one layer then takes. Stamping the
// pages alone may take longer than target: Reps (Wait) is then 0.
func (k *Kernel) Calibrate(target time.Duration, kv [][]byte, pageBytes uint64, pages []uint32) time.Duration {
	timeLayer := func() time.Duration {
		best := time.Duration(1 << 62)
		for range 3 {
			start := time.Now()
			k.Begin(start)
			k.Layer(kv, pageBytes, pages, 0, 0)
			best = min(best, time.Since(start))
		}
		return best
	}
	k.Reps, k.Wait = 0, 0
	base := timeLayer()
	if k.Device {
		k.Wait = max(0, target-base)
		return timeLayer()
	}
	const probe = 50
	k.Reps = probe
	per := max((timeLayer()-base)/probe, time.Nanosecond)
	k.Reps = max(0, int((target-base)/per))
	return timeLayer()
}

// Rig is a prefill rank and a decode rank that reach each other; the
// prefill rank's KV memory must be the Manager's own (Memory()), as must
// the decode rank's when Verify is set.
type Rig struct {
	Prefill *kvmanager.Prefill
	Decode  *kvmanager.Decode
	// Verify checks every layer's first and last page at decode after each
	// room.
	Verify bool
	// Metrics is the prefill rank's registry (its Config.Registerer):
	// Room.Posted is read from it (nil: Posted stays 0).
	Metrics prometheus.Gatherer

	mu   sync.Mutex
	next uint64
}

// Room is one room's timings.
type Room struct {
	// TTFT: from the first layer's compute start to the decode room's
	// Success (Receiver.Wait returned).
	TTFT time.Duration
	// Tail: from the last layer's compute end to the decode room's Success.
	Tail time.Duration
	// Compute: the layers' compute, all of them.
	Compute time.Duration
	// Posted counts the writes the prefill rank posted meanwhile (its
	// counter: the room's own when rooms run one at a time).
	Posted uint64
}

// RunRoom moves one room of pages (prefill src into decode dst) through
// the rig, computing each layer with k first; layerwise sends each layer as
// its compute ends, else the whole chunk after the last. k nil: no compute
// (the transfer alone: Tail is then the whole transfer).
func (g *Rig) RunRoom(ctx context.Context, src, dst []uint32, layerwise bool, k *Kernel) (Room, error) {
	g.mu.Lock()
	g.next++
	id := g.next
	g.mu.Unlock()
	lay := g.Prefill.Config().Layout
	aux := -1
	if lay.Aux.Len > 0 && lay.AuxItemBytes > 0 {
		aux = int(id % (lay.Aux.Len / lay.AuxItemBytes))
	}
	r, err := receiver.New(g.Decode, id)
	if err != nil {
		return Room{}, err
	}
	defer r.Clear()
	s, err := sender.New(g.Prefill, id)
	if err != nil {
		return Room{}, err
	}
	defer s.Clear()
	if err := s.Init(); err != nil {
		return Room{}, err
	}
	if err := r.Init(ctx, kvmanager.RequestSpec{DstPages: dst, AuxIndex: aux}); err != nil {
		return Room{}, err
	}
	if st, err := s.WaitReady(ctx); st != kvmanager.WaitingForInput {
		return Room{}, fmt.Errorf("room %d: prefill %v before any layer: %v %s", id, st, err, s.Failure())
	}
	kv, _ := g.Prefill.Memory()
	layers := s.Layers()
	posted := g.posted()
	start := time.Now()
	if k != nil {
		k.Begin(start)
	}
	for l := range layers {
		if k != nil {
			k.Layer(kv, lay.PageBytes, src, id, l)
		}
		if layerwise {
			if err := s.SendLayers(src, l, l+1, true, aux, nil); err != nil {
				return Room{}, fmt.Errorf("room %d: layer %d: %w", id, l, err)
			}
		}
	}
	computed := time.Now()
	if !layerwise {
		if err := s.Send(src, true, aux); err != nil {
			return Room{}, fmt.Errorf("room %d: %w", id, err)
		}
	}
	st, err := r.Wait(ctx)
	end := time.Now()
	if st != kvmanager.Success {
		return Room{}, fmt.Errorf("room %d: decode %v: %v %s", id, st, err, r.Failure())
	}
	if st, err := s.Wait(ctx); st != kvmanager.Success {
		return Room{}, fmt.Errorf("room %d: prefill %v: %v %s", id, st, err, s.Failure())
	}
	if g.Verify && k != nil {
		if err := g.verify(id, k, src, dst, layers); err != nil {
			return Room{}, err
		}
	}
	return Room{TTFT: end.Sub(start), Tail: end.Sub(computed), Compute: computed.Sub(start), Posted: g.posted() - posted}, nil
}

// posted is the prefill rank's count of posted writes the core let go
// (kvbridge_registry_events_total{event="EventPosted",outcome="Applied"}).
func (g *Rig) posted() uint64 {
	if g.Metrics == nil {
		return 0
	}
	n, _ := promread.Value(g.Metrics, "kvbridge_registry_events_total", "event", "EventPosted", "outcome", "Applied")
	return uint64(n)
}

// errMismatch: a decode page does not hold what the prefill layer wrote.
var errMismatch = errors.New("layerbench: decode page differs from the prefill layer's")

func (g *Rig) verify(id uint64, k *Kernel, src, dst []uint32, layers int) error {
	pkv, _ := g.Prefill.Memory()
	dkv, _ := g.Decode.Memory()
	pb := g.Prefill.Config().Layout.PageBytes
	for r := range 2 * layers {
		for _, i := range []int{0, len(src) - 1} {
			want := pkv[r][uint64(src[i])*pb:][:pb]
			got := dkv[r][uint64(dst[i])*pb:][:pb]
			if !bytes.Equal(got, want) {
				return fmt.Errorf("room %d region %d page %d: %w", id, r, dst[i], errMismatch)
			}
		}
	}
	return nil
}

// Result is one token count's figures, medians over the rooms.
type Result struct {
	Tokens, Layers, Rooms int
	// LayerTransfer is one layer's transfer time: a whole-chunk room with
	// no compute, from Send to Success, divided by the layers.
	LayerTransfer time.Duration
	// StreamedLayerTransfer is one layer's transfer when every layer is
	// sent by its own call (SendLayers, no compute, all at once), divided
	// the same way: what a layer costs streamed.
	StreamedLayerTransfer time.Duration
	// LayerCompute is one layer's compute after calibration.
	LayerCompute time.Duration
	// Whole and Layerwise are the two ways' rooms (medians).
	Whole, Layerwise Room
	// WholeCPU and LayerwiseCPU: this process's CPU per room (both ranks
	// and the kernel are in it).
	WholeCPU, LayerwiseCPU time.Duration
}

// TTFTRatio is layer-wise TTFT over whole-chunk's (goal ≤ 0.6 where
// transfer ≈ compute).
func (r Result) TTFTRatio() float64 { return float64(r.Layerwise.TTFT) / float64(r.Whole.TTFT) }

// TailRatio is layer-wise's tail over one layer's transfer time (goal ≤
// 1.5).
func (r Result) TailRatio() float64 {
	return float64(r.Layerwise.Tail) / float64(max(r.LayerTransfer, 1))
}

// Measure runs rooms rooms of each way (alternating, so both see the same
// machine) over the first pages pages, after a warm-up room and the
// calibration: one layer's transfer time first (probes whole-chunk rooms
// without compute; as many layer-wise ones for StreamedLayerTransfer),
// then k calibrated to it.
func (g *Rig) Measure(ctx context.Context, k *Kernel, tokens, pageTokens, rooms, probes int) (Result, error) {
	n := (tokens + pageTokens - 1) / pageTokens
	src, dst := make([]uint32, n), make([]uint32, n)
	for i := range src {
		src[i], dst[i] = uint32(i), uint32(i)
	}
	res := Result{Tokens: tokens, Rooms: rooms, Layers: g.Prefill.Layers()}
	if _, err := g.RunRoom(ctx, src, dst, false, nil); err != nil { // warm-up: first touch, connections
		return res, err
	}
	var xfer []time.Duration
	for range max(probes, 1) {
		rm, err := g.RunRoom(ctx, src, dst, false, nil)
		if err != nil {
			return res, err
		}
		xfer = append(xfer, rm.Tail)
	}
	res.LayerTransfer = median(xfer) / time.Duration(res.Layers)
	xfer = xfer[:0]
	for range max(probes, 1) {
		rm, err := g.RunRoom(ctx, src, dst, true, nil)
		if err != nil {
			return res, err
		}
		xfer = append(xfer, rm.Tail)
	}
	res.StreamedLayerTransfer = median(xfer) / time.Duration(res.Layers)
	kv, _ := g.Prefill.Memory()
	res.LayerCompute = k.Calibrate(res.LayerTransfer, kv, g.Prefill.Config().Layout.PageBytes, src)
	var ways [2][]Room
	var cpu [2]time.Duration
	for i := range 2 * rooms {
		way := i % 2 // 0 whole-chunk, 1 layer-wise
		m, err := cpustat.Start(0)
		if err != nil {
			return res, err
		}
		rm, err := g.RunRoom(ctx, src, dst, way == 1, k)
		if err != nil {
			return res, err
		}
		used, err := m.Read()
		if err != nil {
			return res, err
		}
		ways[way] = append(ways[way], rm)
		cpu[way] += used.Total()
	}
	res.Whole, res.Layerwise = medianRoom(ways[0]), medianRoom(ways[1])
	res.WholeCPU, res.LayerwiseCPU = cpu[0]/time.Duration(rooms), cpu[1]/time.Duration(rooms)
	return res, nil
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func medianRoom(rs []Room) Room {
	pick := func(f func(Room) time.Duration) time.Duration {
		d := make([]time.Duration, len(rs))
		for i, r := range rs {
			d[i] = f(r)
		}
		return median(d)
	}
	return Room{TTFT: pick(func(r Room) time.Duration { return r.TTFT }), Tail: pick(func(r Room) time.Duration { return r.Tail }),
		Compute: pick(func(r Room) time.Duration { return r.Compute })}
}
