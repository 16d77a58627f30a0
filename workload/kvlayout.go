package workload

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/bouncekv/bounce/transfer"
)

// KVByte is byte e of element dim of head head of token tok of layer
// layer's K (kv 0) or V (1), as a transfer of a layout conversion is
// verified: every element's bytes encode where it belongs, so an element
// that lands in another token, head, layer or tensor is caught, whatever
// the two sides' layouts.
func KVByte(seed uint64, layer, kv, tok, head, dim, e uint32) byte {
	x := seed ^ uint64(layer)*0x9e3779b97f4a7c15 ^ uint64(kv)*0xbf58476d1ce4e5b9 ^ uint64(tok)*0x94d049bb133111eb ^
		uint64(head)*0x2545f4914f6cdd1d ^ uint64(dim)*0x5851f42d4c957f2d ^ uint64(e)*0x14057b7ef767814f
	x ^= x >> 31
	x *= 0xd6e8feb86659fd93
	x ^= x >> 32
	return byte(x)
}

// KVPool is a pool with its layout over host bytes: Mem holds the pool,
// byte 0 at address Base.
type KVPool struct {
	Pool   transfer.Pool
	Layout transfer.Layout
	Mem    []byte
	Base   uint64
}

// headBytes returns the bytes of head h of token t of block id in region r.
func (k KVPool) headBytes(r int, id, t, h uint32) []byte {
	off := k.Pool.Regions[r] + uint64(id)*k.Pool.Stride + k.Layout.Offset(t, h) - k.Base
	return k.Mem[off : off+k.Layout.HeadLen()]
}

// heads returns the head range [lo, hi) of heads that both the layout holds
// and [lo, hi) names (hi 0: every head the layout holds).
func (k KVPool) heads(lo, hi uint32) (uint32, uint32) {
	l := k.Layout
	if hi == 0 {
		return l.FirstHead, l.FirstHead + l.Heads
	}
	return max(lo, l.FirstHead), min(hi, l.FirstHead+l.Heads)
}

// Put writes the pattern of a request's tokens into the blocks ids (token
// i*Tokens + t at token t of ids[i]), for heads [lo, hi) of the ones the
// pool holds (hi 0: all of them).
func (k KVPool) Put(seed uint64, ids []uint32, lo, hi uint32) {
	l := k.Layout
	lo, hi = k.heads(lo, hi)
	_ = k.eachRegion(func(r int) error {
		layer, kv := uint32(r)/l.KV, uint32(r)%l.KV
		for i, id := range ids {
			for t := range l.Tokens {
				tok := uint32(i)*l.Tokens + t
				for h := lo; h < hi; h++ {
					b := k.headBytes(r, id, t, h)
					for d := range l.HeadDim {
						for e := range l.Elem {
							b[d*l.Elem+e] = KVByte(seed, layer, kv, tok, h, d, e)
						}
					}
				}
			}
		}
		return nil
	})
}

// Check reports the first element of heads [lo, hi) of the blocks ids (hi
// 0: every head the pool holds) whose bytes are not the pattern of its
// (layer, K/V, token, head, element), naming it.
func (k KVPool) Check(seed uint64, ids []uint32, lo, hi uint32) error {
	l := k.Layout
	lo, hi = k.heads(lo, hi)
	return k.eachRegion(func(r int) error {
		layer, kv := uint32(r)/l.KV, uint32(r)%l.KV
		for i, id := range ids {
			for t := range l.Tokens {
				tok := uint32(i)*l.Tokens + t
				for h := lo; h < hi; h++ {
					b := k.headBytes(r, id, t, h)
					for d := range l.HeadDim {
						for e := range l.Elem {
							if want := KVByte(seed, layer, kv, tok, h, d, e); b[d*l.Elem+e] != want {
								return fmt.Errorf("layer %d %s token %d head %d element %d byte %d (block %d, token %d of it): %#x, want %#x",
									layer, []string{"K", "V"}[kv], tok, h, d, e, id, t, b[d*l.Elem+e], want)
							}
						}
					}
				}
			}
		}
		return nil
	})
}

// eachRegion runs f for every region of the pool (regions are disjoint
// memory), spread over up to GOMAXPROCS goroutines, and returns the error
// of the lowest region f failed in: the pattern of a large request is
// written and checked at the machine's speed, the report the same.
func (k KVPool) eachRegion(f func(r int) error) error {
	n := len(k.Pool.Regions)
	workers := max(1, min(n, runtime.GOMAXPROCS(0)))
	errs := make([]error, n)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := w; r < n; r += workers {
				errs[r] = f(r)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
