package hostcopy

import (
	"fmt"

	"github.com/bouncekv/bounce/transfer"
)

// SubmitShaped is SubmitBlocks for a shaped block copy (transfer.ShapedCopy,
// a layout conversion's units): units [c.First, c.First+c.Count), each the
// shape's segments of one group of ids in one pool region, packed back to
// back in region from c.RegionOff. It checks as SubmitBlocks does, once
// each: the region, the shape against the pool's blocks, the ids the units
// touch, and the span of every pool region they touch. The copy is cut into
// shares of whole units; a worker computes each segment's address from
// (region base, stride, id, offset) and copies a segment that continues
// the previous one in both memories in the same memcpy.
func (e *Engine) SubmitShaped(region transfer.Desc, c transfer.ShapedCopy) (transfer.Op, error) {
	ctx, err := e.pool.Get()
	if err != nil {
		return nil, err
	}
	ctx.pins = ctx.pins[:0]
	ctx.shp = c
	return e.submitTable(ctx, region, e.validateShaped, c.Bytes(), c.Count, func(o *op, lo, hi uint64) share {
		return share{o: o, shp: &ctx.shp, lo: lo, hi: hi}
	})
}

// validateShaped checks a shaped copy against region and the registry and
// records the ranges it uses in ctx.pins.
func (e *Engine) validateShaped(ctx *copyCtx, region transfer.Desc) error {
	c := &ctx.shp
	return e.validateTable(ctx, region, c.Blocks.Pool, "shaped copy", c.Check, c.Count, c.RegionsTouched)
}

// copyShaped moves units [c.First+lo, c.First+hi) of a validated shaped
// copy, one memcpy per run of segments contiguous in both memories.
func (e *Engine) copyShaped(base uint64, c *transfer.ShapedCopy, lo, hi uint64) error {
	p := c.Blocks.Pool
	ids := c.Blocks.IDs
	grp := uint64(c.Shape.Group)
	groups := uint64(len(ids)) / grp
	ulen := c.Shape.UnitLen()
	off := base + c.RegionOff + lo*ulen
	var runA, runO, runN uint64 // the pending run: pool address, region address, bytes
	for q := c.First + lo; q < c.First+hi; q++ {
		rbase := p.Regions[q/groups]
		first := (q % groups) * grp
		for _, s := range c.Shape.Segs {
			id := ids[first+uint64(s.Block)]
			if uint64(id) >= p.Blocks {
				return fmt.Errorf("block id %d (index %d) changed to past the pool's %d blocks during the copy: %w", id, first+uint64(s.Block), p.Blocks, transfer.ErrOutOfBounds)
			}
			a := rbase + uint64(id)*p.Stride + uint64(s.Off)
			if runN > 0 && runA+runN == a && runO+runN == off {
				runN += uint64(s.Len)
			} else {
				if runN > 0 {
					e.copyOne(runO, runA, runN)
				}
				runA, runO, runN = a, off, uint64(s.Len)
			}
			off += uint64(s.Len)
		}
	}
	if runN > 0 {
		e.copyOne(runO, runA, runN)
	}
	return nil
}
