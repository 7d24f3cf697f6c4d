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

// PieceRun is one engine operation: pairs first … first+n−1, len bytes.
type PieceRun struct {
	First, N int
	Len      uint64
}

// Coalesce groups n pairs into runs and calls each with every run in
// order; it returns how many runs there were. src(k) and dst(k) are pair
// k's addresses, length(k) its bytes; join(k) (k ≥ 1) says whether pair k
// may share an operation with pair k−1 beyond adjacency (nil: always).
// It allocates nothing: a post of scattered pages costs no more than
// before.
func Coalesce(n int, src, dst, length func(k int) uint64, join func(k int) bool, each func(PieceRun)) int {
	runs := 0
	var cur PieceRun
	var send, dend uint64
	for k := 0; k < n; k++ {
		s, d, l := src(k), dst(k), length(k)
		if k > 0 && s == send && d == dend && (join == nil || join(k)) {
			cur.N++
			cur.Len += l
		} else {
			if k > 0 {
				each(cur)
			}
			cur = PieceRun{First: k, N: 1, Len: l}
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

// SetPieces records how many operations an engine's post of x made after
// coalescing (what Pieces reports).
func (x *Xfer) SetPieces(n int) { x.pieces.Store(int64(n)) }
