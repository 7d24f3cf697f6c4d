package kvmanager

import (
	"testing"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPollValuesAreTheCores: the room types are kvmanager's own (go doc
// shows them), carried to and from the core by value: each constant is
// the core's, and PollRooms hands the core the caller's slice as is.
func TestPollValuesAreTheCores(t *testing.T) {
	for _, c := range []struct {
		ours Poll
		core core.Poll
	}{{Failed, core.Failed}, {Bootstrapping, core.Bootstrapping}, {WaitingForInput, core.WaitingForInput}, {Transferring, core.Transferring}, {Success, core.Success}} {
		assert.EqualValues(t, c.core, c.ours, "%v", c.core)
		assert.Equal(t, c.core.String(), c.ours.String())
		assert.Equal(t, c.core.Terminal(), c.ours.Terminal())
	}
	assert.False(t, Poll(0).Valid())
	for _, c := range []struct {
		ours Outcome
		core core.Outcome
	}{{Applied, core.Applied}, {IgnoredTerminal, core.IgnoredTerminal}, {IgnoredCleared, core.IgnoredCleared}, {IgnoredStale, core.IgnoredStale}, {Rejected, core.Rejected}} {
		assert.EqualValues(t, c.core, c.ours, "%v", c.core)
	}
	assert.EqualValues(t, core.RolePrefill, RolePrefill)
	assert.EqualValues(t, core.RoleDecode, RoleDecode)
	out := make([]Poll, 3)
	cp := corePolls(out)
	cp[1] = core.Transferring
	assert.Equal(t, []Poll{0, Transferring, 0}, out, "the core's statuses land in the caller's slice")
	assert.Nil(t, corePolls(nil))
}

// TestReportCarriesEverything: a load report comes across whole, and
// Whole answers as the core's does.
func TestReportCarriesEverything(t *testing.T) {
	cr := core.LoadReport{Status: core.Failed, Code: core.CodeAborted, Reason: "test", Sources: []core.SourceReport{
		{Source: 0, Proven: true, LayerLo: 0, LayerHi: 2, Landed: []core.Landed{{First: 0, Count: 4, LayerLo: 0, LayerHi: 2}}},
		{Source: 1, Dummy: true},
		{Source: 2, Proven: true, LayerLo: 0, LayerHi: 2, Landed: []core.Landed{{First: 0, Count: 2, LayerLo: 0, LayerHi: 2}, {First: 3, Count: 1, LayerLo: 0, LayerHi: 1}}},
	}}
	r := reportOf(cr)
	require.Equal(t, cr, r.core(), "the report there and back")
	assert.Equal(t, Failed, r.Status)
	assert.Equal(t, landed(cr.Whole()), r.Whole())
	assert.NotEmpty(t, r.Whole())
	res := resultOf(core.Result{Outcome: core.Rejected, Status: core.Failed, Err: core.ErrRoomFailed, Drained: true})
	assert.Equal(t, Result{Outcome: Rejected, Status: Failed, Err: core.ErrRoomFailed, Drained: true}, res)
}
