package wire

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// TestEncoderMatchesMsgpack: the append encoder writes every length and
// integer as github.com/vmihailenco/msgpack/v5 does (the golden files pin
// only the values in them), at each form's boundaries.
func TestEncoderMatchesMsgpack(t *testing.T) {
	lens := []int{0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536}
	ints := []int64{0, 1, 127, 128, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, 1<<63 - 1,
		-1, -32, -33, -128, -129, -32768, -32769, -1 << 31, -1<<31 - 1, -1 << 63}
	check := func(what string, got []byte, f func(*msgpack.Encoder) error) {
		t.Helper()
		var buf bytes.Buffer
		require.NoError(t, f(msgpack.NewEncoder(&buf)))
		assert.True(t, bytes.Equal(got, buf.Bytes()), "%s: % x, msgpack writes % x", what, got[:min(len(got), 8)], buf.Bytes()[:min(buf.Len(), 8)])
	}
	for _, n := range lens {
		e := &encoder{}
		e.mapLen(n)
		check(fmt.Sprintf("map of %d", n), e.b, func(m *msgpack.Encoder) error { return m.EncodeMapLen(n) })
		e = &encoder{}
		e.arrayLen(n)
		check(fmt.Sprintf("array of %d", n), e.b, func(m *msgpack.Encoder) error { return m.EncodeArrayLen(n) })
		s := strings.Repeat("x", n)
		e = &encoder{}
		e.str(s)
		check(fmt.Sprintf("string of %d", n), e.b, func(m *msgpack.Encoder) error { return m.EncodeString(s) })
		e = &encoder{}
		e.bytes([]byte(s))
		check(fmt.Sprintf("bin of %d", n), e.b, func(m *msgpack.Encoder) error { return m.EncodeBytes([]byte(s)) })
	}
	for _, v := range ints {
		e := &encoder{}
		e.int(v)
		check(fmt.Sprintf("int %d", v), e.b, func(m *msgpack.Encoder) error { return m.EncodeInt(v) })
		if v >= 0 {
			e = &encoder{}
			e.uint(uint64(v))
			check(fmt.Sprintf("uint %d", v), e.b, func(m *msgpack.Encoder) error { return m.EncodeUint(uint64(v)) })
		}
	}
	e := &encoder{}
	e.uint(math.MaxUint64)
	check("uint max", e.b, func(m *msgpack.Encoder) error { return m.EncodeUint(math.MaxUint64) })
	e = &encoder{}
	e.bytes(nil)
	check("nil bin", e.b, func(m *msgpack.Encoder) error { return m.EncodeBytes(nil) })
}
