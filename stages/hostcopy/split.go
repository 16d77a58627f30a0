package hostcopy

import "github.com/bouncekv/bounce/transfer"

// Split cuts runs into shares of about equal bytes so that several workers
// can copy one operation: at most parts shares, and no more than one per
// minBytes. Every share but the last holds at least the target
// ceil(bytes/shares) and, when cut inside a strided run, less than one copy
// more. It appends the cut runs to dst and the end index in dst of each
// share to bounds, and returns both; share i is dst[bounds[i-1]:bounds[i]]
// (from 0 for the first). Runs that move no bytes are dropped; with no bytes
// at all there is one empty share.
//
// A strided run is cut between copies, a contiguous one (Count 1, or strides
// equal to Len) at any byte; together the shares move exactly the bytes of
// runs, each once, between the same addresses and region offsets. Runs must
// be validated first: Len × Count and their spans must not overflow.
func Split(dst []transfer.Run, bounds []int, runs []transfer.Run, parts int, minBytes uint64) ([]transfer.Run, []int) {
	var total uint64
	for _, r := range runs {
		total += r.Bytes()
	}
	minBytes = max(minBytes, 1)
	if n := total / minBytes; uint64(parts) > n {
		parts = int(n)
	}
	if parts <= 1 {
		for _, r := range runs {
			if r.Bytes() != 0 {
				dst = append(dst, r)
			}
		}
		return dst, append(bounds, len(dst))
	}
	target := (total + uint64(parts) - 1) / uint64(parts)
	var acc uint64 // bytes in the open share
	closeShare := func() {
		bounds = append(bounds, len(dst))
		acc = 0
	}
	for _, r := range runs {
		if r.Bytes() == 0 {
			continue
		}
		if r.Count > 1 && r.RegionStride == r.Len && r.AddrStride == r.Len {
			r = transfer.Run{RegionOff: r.RegionOff, Addr: r.Addr, Len: r.Len * r.Count, Count: 1}
		}
		for r.Count > 0 {
			last := len(bounds) == parts-1 // the last share takes the rest
			room := target - acc
			if last || r.Bytes() <= room {
				dst = append(dst, r)
				acc += r.Bytes()
				if !last && acc == target {
					closeShare()
				}
				break
			}
			if r.Count == 1 { // contiguous: cut at a byte
				head := r
				head.Len = room
				dst = append(dst, head)
				r.Addr += room
				r.RegionOff += room
				r.Len -= room
				closeShare()
				continue
			}
			// Strided: cut between copies, after the copy that fills the
			// share (it may overshoot by less than one copy).
			k := min((room+r.Len-1)/r.Len, r.Count)
			head := r
			head.Count = k
			dst = append(dst, head)
			acc += head.Bytes()
			r.Addr += k * r.AddrStride
			r.RegionOff += k * r.RegionStride
			r.Count -= k
			closeShare()
		}
	}
	if acc > 0 || len(bounds) == 0 {
		closeShare()
	}
	return dst, bounds
}
