package kvmanager

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// testLayout is a DRAM layout of 2 layers of 64 pages of 64 bytes, with 16
// aux items of 16 bytes, at addresses no test dereferences (the core's
// simulator layout).
func testLayout() transfer.Layout {
	return transfer.Layout{Kind: nixl.DRAM, PageBytes: 64, AuxItemBytes: 16, Aux: nixl.Desc{Addr: 0x9000, Len: 16 * 16},
		Regions: []nixl.Desc{{Addr: 0x1000, Len: 64 * 64}, {Addr: 0x2000, Len: 64 * 64}, {Addr: 0x3000, Len: 64 * 64}, {Addr: 0x4000, Len: 64 * 64}}}
}

// The refusals are exported as kvbridge_layout_refused_total{reason}.
func TestLayoutRefusalsExported(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := newTestPrefill(t, func(cfg *Config) {
		cfg.Registerer = reg
		cfg.Layout = testLayout() // allocated: regions without an address
		cfg.Layout.Regions = []nixl.Desc{{Len: cfg.Layout.Regions[0].Len}, {Len: cfg.Layout.Regions[1].Len}}
		cfg.Layout.Aux.Addr = 0
	})
	kv, aux, state := core.RegionsOf(testLayout())
	kv[1].Addr = kv[0].Addr
	var err error
	p.read(func(c *core.Core) {
		_, err = c.CheckRegister(&wire.Register{From: wire.From{Role: "decode", Instance: "d", Rank: 0, Endpoint: "tcp://d:1", Epoch: 1}, Compat: p.cfg.Compat, KV: kv, Aux: aux, State: state})
	})
	require.ErrorContains(t, err, "overlapping regions", "an overlapping REGISTER")
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "kvbridge_layout_refused_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					got[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	require.Equal(t, fmt.Sprint(map[string]float64{"overlapping_regions": 1, "repeated_page": 0, "page_in_use": 0, "not_owner": 0}), fmt.Sprint(got), "kvbridge_layout_refused_total")
}

// Decode.InitReceiver refuses a spec naming a destination page, or an item
// of one state region, twice at the call, before the room is looked at.
func TestInitReceiverRefusesRepeatedDestinations(t *testing.T) {
	fixedAndMutant(t, "spec-repeat-accepted", func(t *testing.T, fixed bool) {
		cfg := DefaultConfig(RoleDecode)
		cfg.Auth = testauth.Auth()
		cfg.Instance, cfg.Compat, cfg.BootstrapURL = "spec-test", "v1:test", "http://127.0.0.1:1"
		cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
		cfg.Layout = testLayout()
		cfg.Layout.State = []transfer.StateRegion{{Desc: nixl.Desc{Len: 8 * 32}, ItemBytes: 32}}
		cfg.Layout.Regions = []nixl.Desc{{Len: 8 * 64}, {Len: 8 * 64}}
		cfg.Layout.Aux, cfg.Layout.State[0].Addr = nixl.Desc{Len: 4 * 16}, 0
		d, err := NewDecode(cfg)
		require.NoError(t, err)
		defer d.Close()
		for _, spec := range []core.RequestSpec{
			{DstPages: []uint32{1, 2, 1}, AuxIndex: -1},
			{DstPages: []uint32{1}, AuxIndex: 0, StateIndices: [][]uint32{{3, 3}}},
			{DstPages: []uint32{5, 5}, AuxIndex: -1, Dummy: true},
		} {
			// Room 9 does not exist: a spec that passes gets ErrUnknownRoom.
			err := d.InitReceiver(context.Background(), 9, RequestSpec(spec))
			require.Equal(t, fixed, errors.Is(err, core.ErrInvalidSpec), "%+v: %v", spec, err)
		}
		require.ErrorIs(t, d.InitReceiver(context.Background(), 9, RequestSpec{DstPages: []uint32{1, 2}, AuxIndex: -1}), core.ErrUnknownRoom, "a valid spec for an unknown room")
	})
}
