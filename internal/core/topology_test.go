package core

import (
	"errors"
	"testing"

	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTopologyIsTheCores: the prefill instances' topologies a decode rank
// uses are the core's, and so are the decisions to stop trusting one: a
// rank of the instance its bootstrap service no longer knows, its record
// gone from the watch, or a prefill rank refusing this rank's registration
// (an instance may have changed shape under any cached topology) — each
// drops what it concerns, and nothing else does.
func TestTopologyIsTheCores(t *testing.T) {
	c := testCore(t, RoleDecode)
	a, b := prefillT.Bootstrap, "http://other-instance"
	learn := func() {
		c.Step(t0, TopologyLearned{URL: a, Topo: Topology{Instance: "p", TPSize: 2, PPSize: 1, DPSize: 1, PageSize: 16}})
		c.Step(t0, TopologyLearned{URL: b, Topo: Topology{Instance: "q", TPSize: 1, PPSize: 1, DPSize: 1, PageSize: 16}})
	}
	kept := func() (ka, kb bool) {
		_, ka = c.Topology(a)
		_, kb = c.Topology(b)
		return ka, kb
	}
	learn()
	got, ok := c.Topology(a)
	require.True(t, ok)
	assert.Equal(t, 2, got.TPSize)

	c.Step(t0, ResolveFailed{Target: prefillT, Err: errors.New("timeout")})
	ka, kb := kept()
	assert.True(t, ka && kb, "a lookup that failed for another reason drops nothing")

	c.Step(t0, ResolveFailed{Target: prefillT, Err: errors.New("no record"), Unknown: true})
	ka, kb = kept()
	assert.False(t, ka, "instance a's topology kept after its bootstrap service forgot one of its ranks")
	assert.True(t, kb)

	learn()
	c.Step(t0, TargetChanged{Target: Target{Bootstrap: b}, Gone: true})
	ka, kb = kept()
	assert.True(t, ka)
	assert.False(t, kb, "instance b's topology kept after its rank's record went")

	learn()
	c.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
	c.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
	c.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1}})
	c.Step(t0, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: false, Reason: "layout mismatch"}})
	ka, kb = kept()
	assert.False(t, ka || kb, "topologies kept after a prefill rank refused this rank's registration")
}
