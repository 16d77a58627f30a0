package transfer

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
)

// MaxSegments is the most segments a Shape may have.
const MaxSegments = 4096

// Segment is a byte range of one block of a group: Len bytes at Off in the
// group's Block-th block.
type Segment struct {
	Block, Off, Len uint32
}

// Shape says which bytes of a block-table copy move, and in what order,
// when they are not whole blocks (a layout conversion: heads split between
// ranks, two blocks merged into one, token- and head-major orders swapped).
// The ids of a table are taken in groups of Group consecutive ids; every
// group of every pool region moves the same Segs, packed back to back in the
// contiguous region in Segs order: one unit of UnitLen bytes per (region,
// group). A gather and the scatter of the same bytes on the other side use
// two shapes with the same segment lengths in the same order: the order is
// the staging order, so a rearrangement happens on whichever side reads or
// writes out of order.
type Shape struct {
	Group uint32
	Segs  []Segment
}

// UnitLen is the bytes one (region, group) unit moves.
func (s Shape) UnitLen() uint64 {
	var n uint64
	for _, g := range s.Segs {
		n += uint64(g.Len)
	}
	return n
}

// Validate reports why s is not a usable shape for blocks of blockLen
// bytes: no group, no or too many segments, an empty segment, or a segment
// past its block or its group.
func (s Shape) Validate(blockLen uint64) error {
	switch {
	case s.Group == 0:
		return fmt.Errorf("shape group is 0 ids")
	case len(s.Segs) == 0:
		return fmt.Errorf("shape has no segments")
	case len(s.Segs) > MaxSegments:
		return fmt.Errorf("shape has %d segments; at most %d", len(s.Segs), MaxSegments)
	}
	for i, g := range s.Segs {
		switch {
		case g.Len == 0:
			return fmt.Errorf("shape segment %d is empty", i)
		case g.Block >= s.Group:
			return fmt.Errorf("shape segment %d names block %d of a group of %d", i, g.Block, s.Group)
		case uint64(g.Off)+uint64(g.Len) > blockLen:
			return fmt.Errorf("shape segment %d [%d, +%d) passes the block's %d bytes: %w", i, g.Off, g.Len, blockLen, ErrOutOfBounds)
		}
	}
	return nil
}

// CheckDisjoint reports two segments of s that share a byte: a destination
// shape must write each byte of a group once.
func (s Shape) CheckDisjoint() error {
	idx := make([]int, len(s.Segs))
	for i := range idx {
		idx[i] = i
	}
	key := func(i int) uint64 { return uint64(s.Segs[i].Block)<<32 | uint64(s.Segs[i].Off) }
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(key(a), key(b)) })
	for k := 1; k < len(idx); k++ {
		a, b := s.Segs[idx[k-1]], s.Segs[idx[k]]
		if a.Block == b.Block && uint64(a.Off)+uint64(a.Len) > uint64(b.Off) {
			return fmt.Errorf("shape segments %d and %d overlap in block %d", idx[k-1], idx[k], a.Block)
		}
	}
	return nil
}

// ShapedCopy is a BlockCopy whose units are Shape's (region, group) units
// instead of whole pieces: units [First, First+Count) of the table, unit q
// being region q / G and group q % G where G = len(IDs) / Shape.Group, each
// UnitLen bytes, packed back to back from RegionOff.
type ShapedCopy struct {
	BlockCopy
	Shape Shape
}

// Groups is the number of groups in the table (len(IDs) / Group).
func (c ShapedCopy) Groups() uint64 { return uint64(len(c.Blocks.IDs)) / uint64(c.Shape.Group) }

// Units is the number of units in the table: regions × groups.
func (c ShapedCopy) Units() uint64 { return uint64(len(c.Blocks.Pool.Regions)) * c.Groups() }

// Bytes is the payload the copy moves.
func (c ShapedCopy) Bytes() uint64 { return c.Count * c.Shape.UnitLen() }

// Check reports why c cannot be carried out against a region of regionLen
// bytes: an invalid shape, ids that are not whole groups, a unit range
// outside the table, an id past the pool, or region bytes past regionLen.
func (c ShapedCopy) Check(regionLen uint64) error {
	if err := c.Shape.Validate(c.Blocks.Pool.BlockLen); err != nil {
		return err
	}
	n := uint64(len(c.Blocks.IDs))
	if n == 0 || n%uint64(c.Shape.Group) != 0 {
		return fmt.Errorf("block table of %d ids is not whole groups of %d", n, c.Shape.Group)
	}
	units := c.Units()
	if c.First > units || c.Count > units-c.First {
		return fmt.Errorf("units [%d, +%d) pass the table's %d (%d regions x %d groups)", c.First, c.Count, units, len(c.Blocks.Pool.Regions), c.Groups())
	}
	if c.Count > 0 {
		g := uint64(c.Shape.Group)
		lo, hi := c.groupsTouched()
		if err := c.Blocks.CheckRange(lo*g, (hi-lo)*g); err != nil {
			return err
		}
	}
	hi, n2 := bits.Mul64(c.Count, c.Shape.UnitLen())
	if hi != 0 || c.RegionOff > regionLen || n2 > regionLen-c.RegionOff {
		return fmt.Errorf("%d units of %d bytes from region offset %d pass the region's %d bytes: %w", c.Count, c.Shape.UnitLen(), c.RegionOff, regionLen, ErrOutOfBounds)
	}
	return nil
}

// groupsTouched returns the group index range [lo, hi) the units touch,
// the whole table when they wrap past a region's last group.
func (c ShapedCopy) groupsTouched() (lo, hi uint64) {
	g := c.Groups()
	first, last := c.First%g, (c.First+c.Count-1)%g
	if c.Count >= g || last < first {
		return 0, g
	}
	return first, last + 1
}

// RegionsTouched returns the first and one-past-last pool region the units
// lie in (Count > 0).
func (c ShapedCopy) RegionsTouched() (lo, hi int) {
	g := c.Groups()
	return int(c.First / g), int((c.First+c.Count-1)/g) + 1
}

// Runs calls yield for every byte run the copy moves, in region order: Len
// bytes between pool address Addr and region offset Off. It is the copy's
// meaning, what a stage without its own shaped path carries out, and the
// model the faster ones are tested against. It assumes c.Check passed.
func (c ShapedCopy) Runs(yield func(addr, off, n uint64) bool) {
	g := c.Groups()
	p := c.Blocks.Pool
	off := c.RegionOff
	for q := c.First; q < c.First+c.Count; q++ {
		r, grp := int(q/g), q%g
		base := grp * uint64(c.Shape.Group)
		for _, s := range c.Shape.Segs {
			id := c.Blocks.IDs[base+uint64(s.Block)]
			addr := p.Regions[r] + uint64(id)*p.Stride + uint64(s.Off)
			if !yield(addr, off, uint64(s.Len)) {
				return
			}
			off += uint64(s.Len)
		}
	}
}

// ShapedGatherer is the optional capability of a Gatherer that carries out
// a shaped block-table gather itself (segment addresses computed from
// region base, stride, id and offset), with GatherBlocks' checks. A
// gatherer without it gets the copy expanded into runs.
type ShapedGatherer interface {
	GatherShaped(region Desc, c ShapedCopy) (Op, error)
}

// ShapedScatterer is ShapedGatherer's inverse for a Scatterer.
type ShapedScatterer interface {
	ScatterShaped(region Desc, c ShapedCopy) (Op, error)
}
