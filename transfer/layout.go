package transfer

import (
	"fmt"
	"math"
)

// Order is the order of a KV block's token and head axes (the head's
// elements are always innermost).
type Order uint8

const (
	// NHD is token-major: a block is [token][head][element].
	NHD Order = 1
	// HND is head-major: a block is [head][token][element].
	HND Order = 2
)

// String names the order as the CLI and logs spell it.
func (o Order) String() string {
	switch o {
	case NHD:
		return "nhd"
	case HND:
		return "hnd"
	}
	return fmt.Sprintf("order(%d)", uint8(o))
}

// ParseOrder reads "nhd" or "hnd".
func ParseOrder(s string) (Order, error) {
	switch s {
	case "nhd", "NHD":
		return NHD, nil
	case "hnd", "HND":
		return HND, nil
	}
	return 0, fmt.Errorf("axis order %q: want nhd or hnd", s)
}

// Layout says what a pool's bytes mean as KV cache, so that two pools of
// different layouts (tensor parallelism, block size, axis order) can be
// converted on the way (package pipeline/convert plans it). Region r of
// the pool is layer r / KV, K (r % KV = 0) or V (1); a block of a region
// holds Tokens tokens of the Heads heads FirstHead .. FirstHead+Heads-1 of
// the model (the rank's slice), HeadDim elements of Elem bytes each, in
// Order.
type Layout struct {
	Layers    uint32
	KV        uint32 // 1 (K only, or a latent) or 2 (K and V)
	Heads     uint32 // heads this pool holds
	FirstHead uint32 // the model-wide index of its first head
	HeadDim   uint32 // elements per head
	Tokens    uint32 // tokens per block
	Elem      uint32 // bytes per element
	Order     Order
}

// MaxLayoutBlock is the largest block a Layout may describe (a Segment's
// offset is a uint32).
const MaxLayoutBlock = math.MaxUint32

// Validate reports why l is not a usable layout: a zero axis, KV other
// than 1 or 2, an unknown order, a head slice past the uint32 range, or a
// block too large.
func (l Layout) Validate() error {
	switch {
	case l.Layers == 0 || l.Heads == 0 || l.HeadDim == 0 || l.Tokens == 0 || l.Elem == 0:
		return fmt.Errorf("layout %v has a zero axis", l)
	case l.KV != 1 && l.KV != 2:
		return fmt.Errorf("layout kv is %d; 1 (K) or 2 (K and V) accepted", l.KV)
	case l.Order != NHD && l.Order != HND:
		return fmt.Errorf("layout order %v: nhd or hnd accepted", l.Order)
	case uint64(l.FirstHead)+uint64(l.Heads) > math.MaxUint32:
		return fmt.Errorf("layout heads %d from %d pass the uint32 range", l.Heads, l.FirstHead)
	case uint64(l.Layers)*uint64(l.KV) > MaxPoolRegions:
		return fmt.Errorf("layout of %d layers x %d is more than %d regions", l.Layers, l.KV, MaxPoolRegions)
	}
	if n, ok := l.blockLen(); !ok || n > MaxLayoutBlock {
		return fmt.Errorf("layout block of %d tokens x %d heads x %d elements x %d bytes is larger than %d bytes", l.Tokens, l.Heads, l.HeadDim, l.Elem, uint64(MaxLayoutBlock))
	}
	return nil
}

func (l Layout) blockLen() (uint64, bool) {
	n := uint64(l.Tokens) * uint64(l.Heads) // < 2^64
	for _, f := range []uint32{l.HeadDim, l.Elem} {
		if n != 0 && uint64(f) > math.MaxUint64/n {
			return 0, false
		}
		n *= uint64(f)
	}
	return n, true
}

// BlockLen is the bytes of one block: Tokens × Heads × HeadDim × Elem. It
// assumes a valid layout.
func (l Layout) BlockLen() uint64 {
	n, _ := l.blockLen()
	return n
}

// HeadLen is the bytes of one head of one token: HeadDim × Elem.
func (l Layout) HeadLen() uint64 { return uint64(l.HeadDim) * uint64(l.Elem) }

// Regions is the pool regions the layout needs: Layers × KV.
func (l Layout) Regions() int { return int(l.Layers) * int(l.KV) }

// CheckPool reports why l does not describe pool p: an invalid layout, a
// region count other than Layers × KV, or a block length other than
// BlockLen.
func (l Layout) CheckPool(p Pool) error {
	if err := l.Validate(); err != nil {
		return err
	}
	switch {
	case len(p.Regions) != l.Regions():
		return fmt.Errorf("layout of %d layers x %d needs %d regions; the pool has %d", l.Layers, l.KV, l.Regions(), len(p.Regions))
	case p.BlockLen != l.BlockLen():
		return fmt.Errorf("layout block is %d bytes (%d tokens x %d heads x %d x %d B); the pool's is %d", l.BlockLen(), l.Tokens, l.Heads, l.HeadDim, l.Elem, p.BlockLen)
	}
	return nil
}

// Offset is the byte offset in a block of head h (model-wide index, held
// by the pool) of the block's token t. It assumes a valid layout, t <
// Tokens and h in the slice.
func (l Layout) Offset(t, h uint32) uint64 {
	lh := uint64(h - l.FirstHead)
	if l.Order == NHD {
		return (uint64(t)*uint64(l.Heads) + lh) * l.HeadLen()
	}
	return (lh*uint64(l.Tokens) + uint64(t)) * l.HeadLen()
}

// String formats the layout for logs and errors.
func (l Layout) String() string {
	return fmt.Sprintf("layout[%d layers x %d, heads %d+%d of %d x %d B, %d tokens, %v]", l.Layers, l.KV, l.FirstHead, l.Heads, l.HeadDim, l.Elem, l.Tokens, l.Order)
}
