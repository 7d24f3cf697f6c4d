package kvmanager

import (
	"os"
	"reflect"
	"regexp"
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
	}
	assert.Equal(t, Transferring, MinPoll(Success, Transferring, WaitingForInput+1))
	assert.Equal(t, Failed, MinPoll(Success, Failed))
	assert.Zero(t, MinPoll(Success, 0), "a rank forgotten (0) is not read as a status")
	assert.Zero(t, MinPoll())
	for ours, theirs := range map[string]string{CodeAborted: core.CodeAborted, CodeCleared: core.CodeCleared, CodeFailed: core.CodeFailed,
		CodeNotDelivered: core.CodeNotDelivered, CodeNotRegistered: core.CodeNotRegistered, CodeOutOfRange: core.CodeOutOfRange,
		CodePeerRestarted: core.CodePeerRestarted, CodePeerUnreachable: core.CodePeerUnreachable, CodeRefused: core.CodeRefused, CodeRejected: core.CodeRejected} {
		assert.Equal(t, theirs, ours, "a failure code is the core's")
	}
	assert.EqualValues(t, core.RolePrefill, RolePrefill)
	assert.EqualValues(t, core.RoleDecode, RoleDecode)
	out := make([]Poll, 3)
	cp := corePolls(out)
	cp[1] = core.Transferring
	assert.Equal(t, []Poll{0, Transferring, 0}, out, "the core's statuses land in the caller's slice")
	assert.Nil(t, corePolls(nil))
}

// TestReportFieldsAreTheCores: the report types kvmanager copies field by
// field have the core's fields, so a field added there is not dropped on
// the way out (TestReportCarriesEverything fills each).
func TestReportFieldsAreTheCores(t *testing.T) {
	for _, c := range []struct{ ours, core any }{{LoadReport{}, core.LoadReport{}}, {SourceReport{}, core.SourceReport{}}} {
		ours, theirs := fieldNames(c.ours), fieldNames(c.core)
		assert.Equal(t, theirs, ours, "%T", c.ours)
	}
}

func fieldNames(v any) (names []string) {
	t := reflect.TypeOf(v)
	for i := range t.NumField() {
		names = append(names, t.Field(i).Name)
	}
	return names
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
	assert.Equal(t, core.ErrRoomFailed, refusal(core.Result{Outcome: core.Rejected, Status: core.Failed, Err: core.ErrRoomFailed, Drained: true}))
	for o := core.Applied; o < core.Rejected; o++ {
		assert.NoError(t, refusal(core.Result{Outcome: o, Err: core.ErrRoomFailed}), "%v is no refusal", o)
	}
	assert.Contains(t, (core.Rejected + 1).String(), "Outcome(", "the core has an Outcome past Rejected: say here whether it is a refusal")
}

// TestEveryCounterIsAMetric: the core's counters are readable only as
// metrics (there is no Stats method), so each of them must be collected
// (a counter added to core.CoreStats and not to Collect would be counted
// and never seen).
func TestEveryCounterIsAMetric(t *testing.T) {
	src, err := os.ReadFile("metrics.go")
	require.NoError(t, err)
	st := reflect.TypeOf(core.CoreStats{})
	for i := range st.NumField() {
		f := st.Field(i).Name
		assert.True(t, regexp.MustCompile(`\bst\.`+f+`\b`).Match(src), "core.CoreStats.%s is collected by no metric (kvmanager/metrics.go)", f)
	}
}

// targetOf is a core target as the public Target a test passes to
// CreateReceiver.
func targetOf(t core.Target) Target {
	return Target{Bootstrap: t.Bootstrap, Rank: t.Rank, DP: t.DP, PP: t.PP}
}
