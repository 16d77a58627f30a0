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
	if err := e.validateShaped(ctx, region); err != nil {
		e.putCtx(ctx)
		return nil, fmt.Errorf("%s: %w", e.name, err)
	}
	if err := e.reg.Pin(ctx.pins); err != nil {
		e.putCtx(ctx)
		return nil, fmt.Errorf("%s: %w", e.name, err)
	}
	parts := uint64(1)
	if b := c.Bytes(); b >= 2*MinShareBytes {
		parts = min(uint64(e.workers), b/MinShareBytes, c.Count)
	}
	o := &op{e: e, ctx: ctx, region: region, done: make(chan struct{})}
	o.left.Store(int32(parts))

	e.mu.Lock()
	if e.pool.ClosedLocked() {
		e.mu.Unlock()
		e.reg.Unpin(ctx.pins)
		e.putCtx(ctx)
		return nil, fmt.Errorf("%s: submit: %w", e.name, transfer.ErrClosed)
	}
	for i := range parts {
		lo, hi := i*c.Count/parts, (i+1)*c.Count/parts
		e.queue[(e.head+e.queued)%len(e.queue)] = share{o: o, shp: &ctx.shp, lo: lo, hi: hi}
		e.queued++
	}
	if parts == 1 {
		e.cond.Signal()
	} else {
		e.cond.Broadcast()
	}
	e.mu.Unlock()
	return o, nil
}

// validateShaped checks a shaped copy against region and the registry and
// records the ranges it uses in ctx.pins.
func (e *Engine) validateShaped(ctx *copyCtx, region transfer.Desc) error {
	c := &ctx.shp
	p := c.Blocks.Pool
	if region.Kind != transfer.Host || p.Kind != transfer.Host {
		return fmt.Errorf("region %v, pool %v: only host memory: %w", region, p, transfer.ErrUnsupported)
	}
	if region.Len == 0 {
		return fmt.Errorf("region %v: empty: %w", region, transfer.ErrOutOfBounds)
	}
	if err := p.CheckGeometry(); err != nil {
		return fmt.Errorf("pool %v: %v: %w", p, err, transfer.ErrOutOfBounds)
	}
	if err := c.Check(region.Len); err != nil {
		return fmt.Errorf("shaped copy: %w: %w", err, transfer.ErrOutOfBounds)
	}
	rd, err := e.reg.Find(region.Addr, region.Len)
	if err != nil {
		return fmt.Errorf("region %v: %w", region, err)
	}
	ctx.touch(rd.Addr)
	if c.Count == 0 {
		return nil
	}
	lo, hi := c.RegionsTouched()
	for r := lo; r < hi; r++ {
		span := p.Span(r)
		if span.Addr+span.Len < span.Addr {
			return fmt.Errorf("pool region %d at %#x wraps the address space: %w", r, span.Addr, transfer.ErrOutOfBounds)
		}
		d, err := e.reg.Find(span.Addr, span.Len)
		if err != nil {
			return fmt.Errorf("pool region %d %v: %w", r, span, err)
		}
		ctx.touch(d.Addr)
	}
	return nil
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
