package wire

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// BenchmarkDecodeSenders: decoding messages from 1, 16 and 64 sender
// processes in turn (round robin: the worst order for the memo of from
// maps), an ABORT each; allocations and time per message.
func BenchmarkDecodeSenders(b *testing.B) {
	for _, n := range []int{1, 16, 64} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(52, uint64(n)))
			msgs := make([][][]byte, n)
			for i := range msgs {
				f := From{Role: RoleDecode, Instance: "decode-" + strconv.Itoa(i), Rank: i % 8,
					Endpoint: "tcp://10.0.0." + strconv.Itoa(i) + ":5555", Epoch: r.Uint64()<<16 | uint64(r.Uint32()&0xffff) | 1}
				frames, err := Encode(&Abort{From: f, Room: uint64(i), Reason: "benchmark"})
				if err != nil {
					b.Fatal(err)
				}
				msgs[i] = frames
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := Decode(msgs[i%n]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
