package wire

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSendersNamesInterned: a sender's instance and endpoint decoded from
// two messages are the same string (not allocated again), and names made
// up by a peer, all different, keep the table within maxInterned while
// still decoding right.
func TestSendersNamesInterned(t *testing.T) {
	decode := func(endpoint string) *Abort {
		t.Helper()
		m := &Abort{Room: 7, Reason: "r"}
		m.From = From{Role: RoleDecode, Instance: "inst-" + endpoint, Rank: 1, Endpoint: endpoint, Epoch: 3}
		frames, err := Encode(m)
		require.NoError(t, err)
		got, err := Decode(frames)
		require.NoError(t, err)
		a := got.(*Abort)
		require.Equal(t, endpoint, a.From.Endpoint, "decoded %+v", a.From)
		require.Equal(t, "inst-"+endpoint, a.From.Instance, "decoded %+v", a.From)
		return a
	}
	a, b := decode("tcp://10.0.0.1:17000"), decode("tcp://10.0.0.1:17000")
	assert.Same(t, unsafe.StringData(a.From.Endpoint), unsafe.StringData(b.From.Endpoint), "the same sender's endpoint decoded twice is two strings")
	assert.Same(t, unsafe.StringData(a.From.Instance), unsafe.StringData(b.From.Instance), "the same sender's instance decoded twice is two strings")
	for i := 0; i < 3*maxInterned; i++ {
		decode(fmt.Sprintf("tcp://made-up:%d", i))
		names.mu.Lock()
		n := len(names.m)
		names.mu.Unlock()
		require.LessOrEqual(t, n, maxInterned, "names interned past the bound")
	}
}
