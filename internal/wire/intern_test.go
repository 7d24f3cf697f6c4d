package wire

import (
	"fmt"
	"testing"
	"unsafe"
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
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(frames)
		if err != nil {
			t.Fatal(err)
		}
		a := got.(*Abort)
		if a.From.Endpoint != endpoint || a.From.Instance != "inst-"+endpoint {
			t.Fatalf("decoded %+v, want endpoint %q", a.From, endpoint)
		}
		return a
	}
	a, b := decode("tcp://10.0.0.1:17000"), decode("tcp://10.0.0.1:17000")
	if unsafe.StringData(a.From.Endpoint) != unsafe.StringData(b.From.Endpoint) ||
		unsafe.StringData(a.From.Instance) != unsafe.StringData(b.From.Instance) {
		t.Error("the same sender's names decoded twice are two strings")
	}
	for i := 0; i < 3*maxInterned; i++ {
		decode(fmt.Sprintf("tcp://made-up:%d", i))
		names.mu.Lock()
		n := len(names.m)
		names.mu.Unlock()
		if n > maxInterned {
			t.Fatalf("%d names interned, bound %d", n, maxInterned)
		}
	}
}
