package nixl

// Descriptor coalescing. A transfer's pairs come from lists prepared page
// by page, so a run of contiguous pages is many pairs; an engine moves such
// a run as one operation (one put, one copy, one CUDA copy) when the pairs
// are adjacent on both sides: each next source starts where the run's
// source ends, each next destination where its destination ends, and the
// engine's own condition holds: the pairs lie in one registered region on
// each side (a copy never spans two allocations that happen to be
// adjacent), and for puts the same keys. Pairs whose source and
// destination overlap are undefined, as a memcpy's are: a run is one copy.
// SGLang's NIXL connector saw descriptors per peer fall from 1.71 M to
// 13.3 K this way (#40500). The libnixl engine passes index lists into a
// dense prepared list, which NIXL (1.4: nixlAgent::makeXferReq) merges
// the same way itself.

// pieceRun is one engine operation: pairs first … first+n−1, len bytes.
type pieceRun struct {
	first, n int
	len      uint64
}

// coalesce groups n pairs into runs and calls each with every run in
// order; it returns how many runs there were. src(k) and dst(k) are pair
// k's addresses, length(k) its bytes; join(k) (k ≥ 1) says whether pair k
// may share an operation with pair k−1 beyond adjacency (nil: always).
// It allocates nothing: a post of scattered pages costs no more than
// before.
func coalesce(n int, src, dst, length func(k int) uint64, join func(k int) bool, each func(pieceRun)) int {
	runs := 0
	var cur pieceRun
	var send, dend uint64
	for k := 0; k < n; k++ {
		s, d, l := src(k), dst(k), length(k)
		if k > 0 && s == send && d == dend && (join == nil || join(k)) {
			cur.n++
			cur.len += l
		} else {
			if k > 0 {
				each(cur)
			}
			cur = pieceRun{first: k, n: 1, len: l}
			runs++
		}
		send, dend = s+l, d+l
	}
	if n > 0 {
		each(cur)
	}
	return runs
}

// Pieces is how many operations the engine split the transfer's last post
// into: its pairs after coalescing (the libnixl engine: the pairs given to
// NIXL, which merges adjacent ones itself). 0 before the first post.
func (x *Xfer) Pieces() int { return int(x.pieces.Load()) }
