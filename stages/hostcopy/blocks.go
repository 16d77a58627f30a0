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
	return e.submitTable(ctx, region, e.validateBlocks, c.Bytes(), c.Count, func(o *op, lo, hi uint64) share {
		return share{o: o, blk: &ctx.blk, lo: lo, hi: hi}
	})
}

// submitTable checks and pins the table copy ctx holds (validate records
// the ranges it uses) and queues it as shares of about equal units, one
// per worker at most: count units of bytes in all, share(o, lo, hi) the
// share of units [lo, hi). Errors and pinning are Submit's.
func (e *Engine) submitTable(ctx *copyCtx, region transfer.Desc, validate func(*copyCtx, transfer.Desc) error, bytes, count uint64, mk func(o *op, lo, hi uint64) share) (transfer.Op, error) {
	if err := validate(ctx, region); err != nil {
		e.putCtx(ctx)
		return nil, fmt.Errorf("%s: %w", e.name, err)
	}
	if err := e.reg.Pin(ctx.pins); err != nil {
		e.putCtx(ctx)
		return nil, fmt.Errorf("%s: %w", e.name, err)
	}
	parts := uint64(1)
	if bytes >= 2*MinShareBytes {
		parts = min(uint64(e.workers), bytes/MinShareBytes, count)
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
	// most one unit; a chunk of no units is one empty share.
	for i := range parts {
		e.queue[(e.head+e.queued)%len(e.queue)] = mk(o, i*count/parts, (i+1)*count/parts)
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
	return e.validateTable(ctx, region, c.Blocks.Pool, "block copy", c.Check, c.Count, func() (int, int) {
		return c.Blocks.RegionsTouched(c.First, c.Count)
	})
}

// validateTable checks a table copy of count units of pool p packed in
// region before any byte moves, once each: host memory, the pool's
// geometry, the copy against the region's length (check), the region
// registered, and the span of every pool region the units touch (touched,
// asked only when something moves) one registered host range; it records
// the ranges used in ctx.pins.
func (e *Engine) validateTable(ctx *copyCtx, region transfer.Desc, p transfer.Pool, what string, check func(regionLen uint64) error, count uint64, touched func() (int, int)) error {
	if region.Kind != transfer.Host || p.Kind != transfer.Host {
		return fmt.Errorf("region %v, pool %v: only host memory: %w", region, p, transfer.ErrUnsupported)
	}
	if region.Len == 0 {
		return fmt.Errorf("region %v: empty: %w", region, transfer.ErrOutOfBounds)
	}
	if err := p.CheckGeometry(); err != nil {
		return fmt.Errorf("pool %v: %v: %w", p, err, transfer.ErrOutOfBounds)
	}
	if err := check(region.Len); err != nil {
		return fmt.Errorf("%s: %w: %w", what, err, transfer.ErrOutOfBounds)
	}
	rd, err := e.reg.Find(region.Addr, region.Len)
	if err != nil {
		return fmt.Errorf("region %v: %w", region, err)
	}
	ctx.touch(rd.Addr)
	if count == 0 {
		return nil
	}
	lo, hi := touched()
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
