package wire

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Hand-made MessagePack, so the cases can hold what an encoder would not
// write (repeated keys, odd encodings).
func mpStrT(s string, wide bool) []byte {
	switch {
	case len(s) < 32 && !wide:
		return append([]byte{0xa0 | byte(len(s))}, s...)
	case len(s) < 256:
		return append([]byte{0xd9, byte(len(s))}, s...)
	default:
		return append(binary.BigEndian.AppendUint16([]byte{0xda}, uint16(len(s))), s...)
	}
}

func mpIntT(v int64, r *rand.Rand) []byte {
	switch {
	case v >= 0 && v < 128 && r.IntN(2) == 0:
		return []byte{byte(v)}
	case v >= -32 && v < 0 && r.IntN(2) == 0:
		return []byte{byte(int8(v))}
	case v >= 0 && v <= math.MaxUint32 && r.IntN(2) == 0:
		return binary.BigEndian.AppendUint32([]byte{0xce}, uint32(v))
	case v >= 0:
		return binary.BigEndian.AppendUint64([]byte{0xcf}, uint64(v))
	default:
		return binary.BigEndian.AppendUint64([]byte{0xd3}, uint64(v))
	}
}

// TestFastFromAgrees: the one-pass reader of a from map (fastFrom) gives
// what the field-by-field reader (slowFrom) gives wherever it answers —
// over random maps of the five fields in any order, with other keys,
// fields missing, repeated with other values, of other types, out of
// range or in other encodings — and answers for every well-formed one,
// so the common case takes it.
func TestFastFromAgrees(t *testing.T) {
	r := rand.New(rand.NewPCG(52, 3))
	fast, clean := 0, 0
	for i := range 20000 {
		type kv struct {
			k string
			v []byte
		}
		ok := true // well-formed so far
		role := []string{RolePrefill, RoleDecode}[r.IntN(2)]
		if r.IntN(20) == 0 {
			role, ok = []string{"", "prefil", "decoder", "Prefill"}[r.IntN(4)], false
		}
		name := func() string {
			if r.IntN(30) == 0 {
				ok = false
				return strings.Repeat("n", MaxNameBytes+1)
			}
			return strings.Repeat(string(rune('a'+r.IntN(26))), r.IntN(40))
		}
		inst, ep := name(), name()
		if ep == "" {
			ok = false
		}
		rank := int64(r.IntN(1000))
		switch r.IntN(30) {
		case 0:
			rank, ok = -1-int64(r.IntN(40)), false
		case 1:
			rank, ok = math.MaxInt32+1+int64(r.IntN(10)), false
		case 2:
			rank = math.MaxInt32
		}
		epoch := r.Int64()
		if r.IntN(30) == 0 {
			epoch, ok = -1-int64(r.IntN(40)), false
		}
		fields := []kv{{"role", mpStrT(role, r.IntN(5) == 0)}, {"instance", mpStrT(inst, r.IntN(5) == 0)},
			{"rank", mpIntT(rank, r)}, {"endpoint", mpStrT(ep, r.IntN(5) == 0)}, {"epoch", mpIntT(epoch, r)}}
		switch r.IntN(12) {
		case 0: // a field missing
			j := r.IntN(len(fields))
			fields, ok = append(fields[:j], fields[j+1:]...), false
		case 1: // a field repeated with another value (the first one wins)
			j := r.IntN(len(fields))
			other := map[string][]byte{"role": mpStrT(RoleDecode, false), "instance": mpStrT("other", false), "rank": {7},
				"endpoint": mpStrT("tcp://other:1", false), "epoch": {9}}[fields[j].k]
			fields = append(fields, kv{fields[j].k, other})
			ok = false // (fastFrom leaves it to slowFrom)
		case 2: // a field of another type
			j := r.IntN(len(fields))
			fields[j].v, ok = []byte{0xc4, 1, 'x'}, false // bin
		case 3, 4: // other keys, any value
			fields = append(fields, kv{"extra", []byte{0x92, 0x01, 0xa1, 'z'}}, kv{"nested", []byte{0x81, 0xa1, 'k', 0xc0}})
		}
		r.Shuffle(len(fields), func(a, b int) { fields[a], fields[b] = fields[b], fields[a] })
		raw := []byte{0x80 | byte(len(fields))}
		for _, f := range fields {
			raw = append(append(raw, mpStrT(f.k, false)...), f.v...)
		}
		if r.IntN(40) == 0 { // cut short
			raw, ok = raw[:r.IntN(len(raw))], false
		}

		var b body
		want := b.slowFrom(raw)
		got, answered := fastFrom(raw)
		if ok {
			clean++
			require.Nil(t, b.err, "case %d: %x", i, raw)
			require.True(t, answered, "case %d: a well-formed from map left to the slow path: %x", i, raw)
		}
		if answered {
			fast++
			require.Nil(t, b.err, "case %d: fastFrom answered a map slowFrom refuses (%v): %x", i, b.err, raw)
			require.Equal(t, want, got, "case %d: %x", i, raw)
		}
	}
	assert.Greater(t, clean, 10000)
	assert.GreaterOrEqual(t, fast, clean)
}

// TestFromMemoAgrees: a from map read again comes from the memo
// (fromMemos) only where its bytes are the remembered ones. Senders whose
// maps take one slot and have one length, each differing from the others
// in one field (instance, endpoint, rank or epoch), and senders whose maps
// are of other lengths, decode each as its own sender, in any order, read
// for the first time or again.
func TestFromMemoAgrees(t *testing.T) {
	r := rand.New(rand.NewPCG(52, 4))
	base := From{Role: RoleDecode, Instance: "decode-a", Rank: 3, Endpoint: "tcp://10.0.0.1:5555", Epoch: 0x1234_5678_9abc_de01}
	senders := make([]From, 16)
	for i := range senders {
		f := base
		switch i % 4 {
		case 0:
			f.Instance = "decode-" + string(rune('a'+i))
		case 1:
			f.Endpoint = "tcp://10.0.0." + strconv.Itoa(i%10) + ":5555"
		case 2:
			f.Rank = 3 + i
		case 3:
			f.Epoch = base.Epoch + uint64(i)<<8 // the same last byte: the same slot
		}
		senders[i] = f
	}
	slot, size := -1, -1
	for _, f := range senders {
		raw := fromMapOf(t, f)
		if slot < 0 {
			slot, size = fromSlot(raw), len(raw)
		}
		require.Equal(t, slot, fromSlot(raw), "the case needs every sender in one slot")
		require.Len(t, raw, size, "the case needs every sender's map of one length")
	}
	// And senders whose maps are longer or shorter (the memo of the map
	// read last must end a value only where it is that value).
	for i := range 8 {
		f := base
		f.Instance = strings.Repeat("d", 1+3*i)
		senders = append(senders, f)
	}
	for i := range 4000 {
		f := senders[r.IntN(len(senders))]
		frames, err := Encode(&Abort{From: f, Room: uint64(i), Reason: "memo"})
		require.NoError(t, err)
		m, err := Decode(frames)
		require.NoError(t, err)
		require.Equal(t, f, m.Sender(), "message %d", i)
	}
}

// TestFromMemoRepeatedKey: a body that repeats its from key is read as
// its first from (as every other key: the first wins), though the memo
// of the map read last ends the second.
func TestFromMemoRepeatedKey(t *testing.T) {
	a := From{Role: RoleDecode, Instance: "decode-a", Rank: 1, Endpoint: "tcp://10.0.0.1:5555", Epoch: 0x1234_5678_9abc_de03}
	b := a
	b.Instance, b.Epoch = "decode-b", 0x1234_5678_9abc_de05
	frames, err := Encode(&Abort{From: b, Room: 1, Reason: "memo"})
	require.NoError(t, err)
	for range fromReplaceAfter + 1 { // b's map remembered, whatever the slot held
		m, err := Decode(frames)
		require.NoError(t, err)
		require.Equal(t, b, m.Sender())
	}
	bFrom := fromMapOf(t, b)
	body, err := EncodeBody(&Abort{From: a, Room: 2, Reason: "memo"})
	require.NoError(t, err)
	require.Equal(t, byte(0x80), body[0]&0xf0, "a fixmap body")
	body[0]++ // one more key: from again, b's
	body = append(append(body, mpStrT("from", false)...), bFrom...)
	frames[2] = body
	m, err := Decode(frames)
	require.NoError(t, err)
	require.Equal(t, a, m.Sender(), "a body with two from keys: the first")
}

// TestFromMemoTurnsAllocateNothing: senders that take turns on one memo
// slot decode with no more allocations than one sender alone (a slot's
// memo is replaced only after misses in a row, not at every miss).
func TestFromMemoTurnsAllocateNothing(t *testing.T) {
	a := From{Role: RoleDecode, Instance: "decode-a", Rank: 1, Endpoint: "tcp://10.0.0.1:5555", Epoch: 0x1234_5678_9abc_de07}
	b := a
	b.Instance = "decode-b" // the same epoch's last byte: the same slot
	fa, err := Encode(&Abort{From: a, Room: 1, Reason: "memo"})
	require.NoError(t, err)
	fb, err := Encode(&Abort{From: b, Room: 1, Reason: "memo"})
	require.NoError(t, err)
	decode := func(f [][]byte) {
		if _, err := Decode(f); err != nil {
			panic(err)
		}
	}
	alone := testing.AllocsPerRun(200, func() { decode(fa); decode(fa) })
	turns := testing.AllocsPerRun(200, func() { decode(fa); decode(fb) })
	require.Equal(t, alone, turns, "allocations of two decodes: one sender %v, two taking turns %v", alone, turns)
}

// fromMapOf is the encoding of f's from map in a message's body.
func fromMapOf(t *testing.T, f From) []byte {
	t.Helper()
	body, err := EncodeBody(&Abort{From: f, Room: 1, Reason: "memo"})
	require.NoError(t, err)
	b, err := parseMap(body)
	require.NoError(t, err)
	defer b.release()
	raw, ok := b.get("from")
	require.True(t, ok)
	return append([]byte(nil), raw.b...)
}
