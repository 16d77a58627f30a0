package transfer

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
)

// Pool describes KV memory the way inference servers hold it: a few
// regions (one per layer, or per layer and K/V), each an array of Blocks
// equal blocks of BlockLen bytes at a fixed Stride, all of one memory Kind
// on one Device. A block id stands for one piece in every region: piece r of
// block i is BlockLen bytes at Regions[r] + i*Stride.
//
// A pool is described once (registered with an agent, exchanged with the
// peer in its descriptor) and requests then name blocks by id, so the cost
// of a request is its ids, not one descriptor per piece.
type Pool struct {
	// Regions holds the address of block 0 in each region; at least one.
	Regions []uint64
	// BlockLen is the bytes of one block in one region; positive.
	BlockLen uint64
	// Stride is the distance in bytes from block i to block i+1 within a
	// region; at least BlockLen.
	Stride uint64
	// Blocks is the number of blocks: ids run from 0 to Blocks-1. At most
	// MaxBlocks.
	Blocks uint64
	// Kind and Device say where the memory lives (Device is 0 for Host).
	Kind   MemKind
	Device int32
}

// ErrDuplicateID means a destination block list names one block twice.
var ErrDuplicateID = errors.New("duplicate block id")

// MaxBlocks is the most blocks a pool may have: ids are uint32.
const MaxBlocks = 1 << 32

// MaxPoolRegions is the most regions a pool may have.
const MaxPoolRegions = 1 << 16

// Validate reports why p is not a usable pool: no regions, a zero block,
// a stride shorter than the block, a block count out of range, a region
// whose extent overflows the address space, or two regions whose pieces
// overlap (a piece of the pool is then not one place in memory).
func (p Pool) Validate() error {
	ext, err := p.geometry()
	if err != nil {
		return err
	}
	return p.checkOverlap(ext)
}

// CheckGeometry is Validate without the overlap check (quadratic in the
// regions): what a stage or engine handed a pool checks before it computes
// an address from it, so that no region's extent overflows.
func (p Pool) CheckGeometry() error {
	_, err := p.geometry()
	return err
}

// geometry checks everything Validate does but overlap and returns the
// extent of one region.
func (p Pool) geometry() (uint64, error) {
	switch {
	case len(p.Regions) == 0:
		return 0, fmt.Errorf("pool has no regions")
	case len(p.Regions) > MaxPoolRegions:
		return 0, fmt.Errorf("pool has %d regions; at most %d", len(p.Regions), MaxPoolRegions)
	case p.BlockLen == 0:
		return 0, fmt.Errorf("pool block length is 0")
	case p.Stride < p.BlockLen:
		return 0, fmt.Errorf("pool stride %d is shorter than its block length %d", p.Stride, p.BlockLen)
	case p.Blocks == 0 || p.Blocks > MaxBlocks:
		return 0, fmt.Errorf("pool has %d blocks; 1 to %d accepted", p.Blocks, uint64(MaxBlocks))
	case p.Kind != Host && p.Kind != CUDA:
		return 0, fmt.Errorf("pool memory kind %s is not host or cuda", p.Kind)
	case p.Device < 0 || (p.Kind == Host && p.Device != 0):
		return 0, fmt.Errorf("pool device %d is not valid for %s memory", p.Device, p.Kind)
	}
	ext, ok := p.extent()
	if !ok {
		return 0, fmt.Errorf("pool extent (%d blocks at stride %d) overflows", p.Blocks, p.Stride)
	}
	for r, a := range p.Regions {
		if a > math.MaxUint64-ext {
			return 0, fmt.Errorf("pool region %d at %#x overflows the address space", r, a)
		}
	}
	return ext, nil
}

// extent is the bytes one region spans: (Blocks-1)*Stride + BlockLen.
func (p Pool) extent() (uint64, bool) {
	hi, lo := bits.Mul64(p.Blocks-1, p.Stride)
	if hi != 0 || lo > math.MaxUint64-p.BlockLen {
		return 0, false
	}
	return lo + p.BlockLen, true
}

// checkOverlap refuses two regions with a common byte: regions whose
// extents intersect overlap unless their offset modulo the stride keeps
// every pair of pieces apart (interleaved K and V at twice the block).
func (p Pool) checkOverlap(ext uint64) error {
	if len(p.Regions) > 1024 {
		// Pairwise is quadratic; beyond this many regions sort first.
		return p.checkOverlapSorted(ext)
	}
	for i := range p.Regions {
		for j := i + 1; j < len(p.Regions); j++ {
			if p.collide(p.Regions[i], p.Regions[j], ext) {
				return fmt.Errorf("pool regions %d (%#x) and %d (%#x) overlap", i, p.Regions[i], j, p.Regions[j])
			}
		}
	}
	return nil
}

func (p Pool) checkOverlapSorted(ext uint64) error {
	idx := make([]int, len(p.Regions))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(p.Regions[a], p.Regions[b]) })
	for k := 1; k < len(idx); k++ {
		// Any region overlapping a later one in address order overlaps
		// one of the regions whose extent reaches it; check back while the
		// extents still intersect.
		for m := k - 1; m >= 0 && p.Regions[idx[m]]+ext > p.Regions[idx[k]]; m-- {
			if p.collide(p.Regions[idx[m]], p.Regions[idx[k]], ext) {
				return fmt.Errorf("pool regions %d (%#x) and %d (%#x) overlap", idx[m], p.Regions[idx[m]], idx[k], p.Regions[idx[k]])
			}
		}
	}
	return nil
}

// collide reports whether regions at a and b (each ext bytes long) share a
// byte of some piece.
func (p Pool) collide(a, b, ext uint64) bool {
	if a > b {
		a, b = b, a
	}
	d := b - a
	if d >= ext {
		return false // extents apart
	}
	if p.Blocks == 1 || p.Stride == p.BlockLen {
		return true // a region is one solid range, and the ranges meet
	}
	m := d % p.Stride
	return m < p.BlockLen || p.Stride-m < p.BlockLen
}

// Pieces is the number of pieces one block id stands for.
func (p Pool) Pieces() int { return len(p.Regions) }

// Span returns region r's whole extent as a descriptor: the range memory
// registration must cover.
func (p Pool) Span(r int) Desc {
	ext, _ := p.extent()
	return Desc{Addr: p.Regions[r], Len: ext, Device: p.Device, Kind: p.Kind}
}

// Piece returns piece r of block id. It assumes a valid pool, r in range
// and id < Blocks.
func (p Pool) Piece(r int, id uint32) Desc {
	return Desc{Addr: p.Regions[r] + uint64(id)*p.Stride, Len: p.BlockLen, Device: p.Device, Kind: p.Kind}
}

// String formats the pool's geometry for logs and errors.
func (p Pool) String() string {
	return fmt.Sprintf("%s:%d pool[%d regions x %d blocks of %d at stride %d]", p.Kind, p.Device, len(p.Regions), p.Blocks, p.BlockLen, p.Stride)
}

// Blocks names pieces of a pool by block id. Its pieces are numbered
// region-major: piece q is region q / len(IDs) of block IDs[q % len(IDs)],
// so a request's n ids in an L-region pool are L*n pieces, and a chunk of
// the transfer is a range of piece numbers, not a list of them.
type Blocks struct {
	Pool Pool
	IDs  []uint32
}

// Len is the number of pieces: regions × ids.
func (b Blocks) Len() uint64 { return uint64(len(b.Pool.Regions)) * uint64(len(b.IDs)) }

// Piece returns piece q. It assumes q < Len().
func (b Blocks) Piece(q uint64) Desc {
	n := uint64(len(b.IDs))
	return b.Pool.Piece(int(q/n), b.IDs[q%n])
}

// CheckRange reports why pieces [first, first+count) are not all pieces of
// b: an empty table, a range past its end, or an id of the range at or past
// the pool's block count. It checks each id the range touches once
// (at most min(count, len(IDs)) of them), never each piece.
func (b Blocks) CheckRange(first, count uint64) error {
	n := uint64(len(b.IDs))
	if n == 0 {
		return fmt.Errorf("block table has no ids")
	}
	total := b.Len()
	if first > total || count > total-first {
		return fmt.Errorf("pieces [%d, +%d) pass the table's %d (%d regions x %d ids)", first, count, total, len(b.Pool.Regions), n)
	}
	if count == 0 {
		return nil
	}
	touched := min(count, n)
	start := first % n
	for k := uint64(0); k < touched; k++ {
		j := start + k
		if j >= n {
			j -= n
		}
		if uint64(b.IDs[j]) >= b.Pool.Blocks {
			return fmt.Errorf("block id %d (index %d) is not below the pool's %d blocks", b.IDs[j], j, b.Pool.Blocks)
		}
	}
	return nil
}

// BlockCopy is one chunk of a block-table copy between a contiguous region
// and a pool: pieces [First, First+Count) of Blocks, packed back to back in
// the region from RegionOff (piece First+k at RegionOff + k*BlockLen). A
// gather copies the pieces into the region; a scatter copies them out.
type BlockCopy struct {
	Blocks    Blocks
	First     uint64
	Count     uint64
	RegionOff uint64
}

// Bytes is the payload the copy moves.
func (c BlockCopy) Bytes() uint64 { return c.Count * c.Blocks.Pool.BlockLen }

// Check reports why c cannot be carried out against a region of regionLen
// bytes: a piece range outside the table, an id past the pool, or region
// bytes past regionLen. It does not look at memory registration: the
// stage checks each region span the range touches against its registry.
func (c BlockCopy) Check(regionLen uint64) error {
	if err := c.Blocks.CheckRange(c.First, c.Count); err != nil {
		return err
	}
	hi, n := bits.Mul64(c.Count, c.Blocks.Pool.BlockLen)
	if hi != 0 || c.RegionOff > regionLen || n > regionLen-c.RegionOff {
		return fmt.Errorf("%d pieces of %d bytes from region offset %d pass the region's %d bytes: %w", c.Count, c.Blocks.Pool.BlockLen, c.RegionOff, regionLen, ErrOutOfBounds)
	}
	return nil
}

// RegionsTouched returns the first and one-past-last pool region that
// pieces [first, first+count) of b lie in (count > 0).
func (b Blocks) RegionsTouched(first, count uint64) (lo, hi int) {
	n := uint64(len(b.IDs))
	return int(first / n), int((first+count-1)/n) + 1
}

// BlockGatherer is the optional capability of a Gatherer that copies a
// block-table chunk straight from a pool, computing each piece's address
// from (region base, stride, id) itself, so no per-piece table is built on
// the host. GatherBlocks checks c against the region and the pool's memory
// before any byte moves, with Gather's ErrBusy rule.
type BlockGatherer interface {
	GatherBlocks(region Desc, c BlockCopy) (Op, error)
}

// BlockScatterer is BlockGatherer's inverse for a Scatterer.
type BlockScatterer interface {
	ScatterBlocks(region Desc, c BlockCopy) (Op, error)
}

// BlockWrite is a direct write in block-table form: piece q of Src to piece
// q of Dst, for q in [First, First+Count). Src's pool is local memory, Dst's
// the peer's (from its descriptor); both have the same block length and
// Count pieces in range.
type BlockWrite struct {
	Src, Dst     Blocks
	First, Count uint64
}

// BlockPoster is the optional capability of an Engine that posts a
// block-table write as one operation without the caller spelling out each
// piece (NIXL's prepared descriptor lists, a copy engine's kernel). It
// checks as PostWrite does, once per pool region the write touches.
type BlockPoster interface {
	PostBlocks(peer string, w BlockWrite) (Op, error)
}

// CheckIDs reports why b's ids are not a usable block list: an id at or
// past the pool's block count or, when unique is set, an id listed twice
// (a destination list must name each block once: two pieces landing in one
// place would leave its bytes to whichever copy ran last). It costs O(ids):
// a bitmap over the pool's blocks when that is small next to the list (and
// at most 16 MiB), else a sorted copy.
func (b Blocks) CheckIDs(unique bool) error {
	for j, id := range b.IDs {
		if uint64(id) >= b.Pool.Blocks {
			return fmt.Errorf("block id %d (index %d) is not below the pool's %d blocks: %w", id, j, b.Pool.Blocks, ErrOutOfBounds)
		}
	}
	if !unique || len(b.IDs) < 2 {
		return nil
	}
	// The bitmap is at most 16 MiB, whatever a hostile list's length.
	if words := (b.Pool.Blocks + 63) / 64; words <= 4*uint64(len(b.IDs))+1024 && words <= 1<<21 {
		seen := make([]uint64, words)
		for j, id := range b.IDs {
			w, m := id/64, uint64(1)<<(id%64)
			if seen[w]&m != 0 {
				return fmt.Errorf("block id %d (index %d) is listed twice: %w", id, j, ErrDuplicateID)
			}
			seen[w] |= m
		}
		return nil
	}
	s := slices.Clone(b.IDs)
	slices.Sort(s)
	for k := 1; k < len(s); k++ {
		if s[k] == s[k-1] {
			return fmt.Errorf("block id %d is listed twice: %w", s[k], ErrDuplicateID)
		}
	}
	return nil
}
