package plan

import (
	"fmt"
	"math/bits"

	"github.com/bouncekv/bounce/transfer"
)

// LayoutShaped plans a converted block-table transfer (a layout
// conversion, package pipeline/convert): unit q of src under srcShape to
// unit q of dst under dstShape (units numbered region-major over groups,
// see transfer.ShapedCopy). A chunk is a range of units [First,
// First+Count), packed back to back in its region, as many whole units as
// its cap allows, at least one; nothing is computed per unit.
//
// It fails when the tables differ in region or group count, when the two
// shapes differ in unit length, when a unit is longer than MaxChunk, or
// when the plan would exceed MaxPieces chunks. The shapes' segment lengths
// pairing up, and the ids against the pools, are the caller's to check
// (the conversion planner and transfer.Blocks.CheckIDs do).
func LayoutShaped(src, dst transfer.Blocks, srcShape, dstShape transfer.Shape, opt Options) (*Plan, error) {
	if opt.MaxChunk == 0 {
		return nil, fmt.Errorf("plan: MaxChunk must be positive")
	}
	if srcShape.Group == 0 || dstShape.Group == 0 {
		return nil, fmt.Errorf("plan: shape group of 0 ids")
	}
	ul := srcShape.UnitLen()
	gs, gd := uint64(len(src.IDs))/uint64(srcShape.Group), uint64(len(dst.IDs))/uint64(dstShape.Group)
	switch {
	case uint64(len(src.IDs))%uint64(srcShape.Group) != 0 || uint64(len(dst.IDs))%uint64(dstShape.Group) != 0 || gs != gd:
		return nil, fmt.Errorf("plan: %d source ids in groups of %d and %d destination ids in groups of %d do not pair", len(src.IDs), srcShape.Group, len(dst.IDs), dstShape.Group)
	case len(src.Pool.Regions) != len(dst.Pool.Regions):
		return nil, fmt.Errorf("plan: source pool of %d regions, destination pool of %d", len(src.Pool.Regions), len(dst.Pool.Regions))
	case ul == 0 || ul != dstShape.UnitLen():
		return nil, fmt.Errorf("plan: source units of %d bytes, destination units of %d", ul, dstShape.UnitLen())
	case ul > opt.MaxChunk:
		return nil, fmt.Errorf("plan: a unit of %d bytes exceeds the %d-byte max chunk", ul, opt.MaxChunk)
	}
	units := uint64(len(src.Pool.Regions)) * gs
	hi, payload := bits.Mul64(units, ul)
	if hi != 0 {
		return nil, fmt.Errorf("plan: %d units of %d bytes overflow", units, ul)
	}
	p := &Plan{blocks: &blockTables{src: src, dst: dst, srcShape: &srcShape, dstShape: &dstShape}, Descs: int(units), Payload: payload}
	if units == 0 {
		return p, nil
	}
	if n := (units + opt.MaxChunk/ul - 1) / (opt.MaxChunk / ul); n > MaxPieces {
		return nil, fmt.Errorf("plan: transfer needs more than %d chunks of at most %d bytes", MaxPieces, opt.MaxChunk)
	}
	b := builder{max: opt.MaxChunk, min: opt.MinChunk, total: payload}
	for first := uint64(0); first < units; {
		cap := b.capFor(len(p.Chunks), payload-first*ul)
		n := min(max(cap/ul, 1), units-first)
		p.Chunks = append(p.Chunks, Chunk{
			Index: len(p.Chunks), Bytes: n * ul, Payload: n * ul, Descs: int(n),
			SrcDevice: src.Pool.Device, DstDevice: dst.Pool.Device, SrcKind: src.Pool.Kind, DstKind: dst.Pool.Kind,
			First: first, Count: n,
		})
		first += n
	}
	p.filled = len(p.Chunks)
	return p, nil
}

// Shapes returns a converted block-table plan's source and destination
// shapes; ok is false for any other plan.
func (p *Plan) Shapes() (src, dst transfer.Shape, ok bool) {
	if p.blocks == nil || p.blocks.srcShape == nil {
		return transfer.Shape{}, transfer.Shape{}, false
	}
	return *p.blocks.srcShape, *p.blocks.dstShape, true
}

// GatherShaped returns chunk k of a converted plan as the gather's
// ShapedCopy (the source units into the region from offset 0).
func (p *Plan) GatherShaped(k int) transfer.ShapedCopy {
	c := &p.Chunks[k]
	return transfer.ShapedCopy{BlockCopy: transfer.BlockCopy{Blocks: p.blocks.src, First: c.First, Count: c.Count}, Shape: *p.blocks.srcShape}
}
