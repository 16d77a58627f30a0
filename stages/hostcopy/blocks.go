package hostcopy

import (
	"fmt"

	"github.com/bouncekv/bounce/transfer"
)

// SubmitBlocks is Submit for a block-table chunk (transfer.BlockCopy): the
// pieces [c.First, c.First+c.Count) of c.Blocks, packed back to back in
// region from c.RegionOff. It checks before any byte moves, once each: the
// region (host, registered, holding the packed pieces), the ids the range
// touches (below the pool's block count) and the span of every pool region
// the range touches (one registered host range each) — never each piece.
// The copy is cut into shares of about equal pieces, one per worker at
// most; a worker computes each piece's address from (region base, stride,
// id) and copies consecutive ids of a region whose blocks are contiguous
// (Stride = BlockLen) in one memcpy. Errors and pinning are Submit's. The
// id slice is read until the op is terminal (each id is checked again as
// it is copied, so an id changed meanwhile fails the copy, never lands
// outside the pool).
func (e *Engine) SubmitBlocks(region transfer.Desc, c transfer.BlockCopy) (transfer.Op, error) {
	ctx, err := e.pool.Get()
	if err != nil {
		return nil, err
	}
	ctx.pins = ctx.pins[:0]
	ctx.blk = c
	if err := e.validateBlocks(ctx, region); err != nil {
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
	// Exactly parts shares (o.left counts them), of sizes differing by at
	// most one piece; a chunk of no pieces is one empty share.
	for i := range parts {
		lo, hi := i*c.Count/parts, (i+1)*c.Count/parts
		e.queue[(e.head+e.queued)%len(e.queue)] = share{o: o, blk: &ctx.blk, lo: lo, hi: hi}
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

// validateBlocks checks a block copy against region and the registry and
// records the ranges it uses in ctx.pins.
func (e *Engine) validateBlocks(ctx *copyCtx, region transfer.Desc) error {
	c := &ctx.blk
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
		return fmt.Errorf("block copy: %w: %w", err, transfer.ErrOutOfBounds)
	}
	rd, err := e.reg.Find(region.Addr, region.Len)
	if err != nil {
		return fmt.Errorf("region %v: %w", region, err)
	}
	ctx.touch(rd.Addr)
	if c.Count == 0 {
		return nil
	}
	lo, hi := c.Blocks.RegionsTouched(c.First, c.Count)
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

// copyBlocks moves pieces [c.First+lo, c.First+hi) of a validated block
// copy, merging consecutive ids of contiguous blocks into one memcpy.
func (e *Engine) copyBlocks(base uint64, c *transfer.BlockCopy, lo, hi uint64) error {
	b := c.Blocks
	p := b.Pool
	n := uint64(len(b.IDs))
	solid := p.Stride == p.BlockLen
	for k := lo; k < hi; {
		q := c.First + k
		reg, j := q/n, q%n
		end := min(hi, k+(n-j)) // the pieces of this region
		rbase := p.Regions[reg]
		for k < end {
			id := b.IDs[j]
			if uint64(id) >= p.Blocks {
				return fmt.Errorf("block id %d (index %d) changed to past the pool's %d blocks during the copy: %w", id, j, p.Blocks, transfer.ErrOutOfBounds)
			}
			run := uint64(1)
			if solid {
				for k+run < end && b.IDs[j+run] == id+uint32(run) && uint64(id)+run < p.Blocks {
					run++
				}
			}
			e.copyOne(base+c.RegionOff+k*p.BlockLen, rbase+uint64(id)*p.Stride, run*p.BlockLen)
			k += run
			j += run
		}
	}
	return nil
}
