package pipeline

import (
	"fmt"

	"github.com/bouncekv/bounce/pipeline/convert"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// RegisterPoolLayout is RegisterPool for a pool whose KV layout is known
// (transfer.Layout): the layout must describe the pool (regions = layers ×
// K/V, block = tokens × heads × head size × element size) and is advertised
// with it, so a block request between two pools of different layouts is
// converted on the way (a tensor-parallel split or merge, a block-size
// change, an NHD/HND swap: package pipeline/convert plans it), or refused at
// Submit with the reason.
func (a *Agent) RegisterPoolLayout(name string, p transfer.Pool, l transfer.Layout) error {
	return a.registerPool(name, p, &l)
}

// conversion returns the conversion a block request between local pool lp
// and the peer's pool br.DstPool moves with: nil when either pool has no
// layout or the layouts are the same, else the planned one or why the
// layouts cannot be converted.
func (a *Agent) conversion(lp *localPool, pi *peerInfo, br *BlockRequest) (*convert.Conversion, error) {
	return planLayouts(lp.layout, pi.layouts[br.DstPool], br)
}

// planLayouts is the conversion of br between pools of layouts src and
// dst: nil when either has none or they are the same, else the planned
// one, or why they cannot be converted (convert.ErrIncompatible, wrapped
// with ErrUnsupported).
func planLayouts(src, dst *transfer.Layout, br *BlockRequest) (*convert.Conversion, error) {
	if src == nil || dst == nil {
		return nil, nil
	}
	c, err := convert.Plan(*src, *dst, convert.Auto)
	if err != nil {
		return nil, fmt.Errorf("source pool %q to destination pool %q: %w: %w", br.SrcPool, br.DstPool, err, transfer.ErrUnsupported)
	}
	if c.Identity() {
		return nil, nil
	}
	return c, nil
}

// checkIDs checks the resolved tables' ids: below each pool's block count,
// none twice at the destination. O(ids).
func (br *BlockRequest) checkIDs() error {
	if err := br.src.CheckIDs(false); err != nil {
		return fmt.Errorf("source pool %q: %w", br.SrcPool, err)
	}
	if err := br.dst.CheckIDs(true); err != nil {
		return fmt.Errorf("destination pool %q: %w", br.DstPool, err)
	}
	return nil
}

// checkWantShape checks a converted block WANT against local pool lp
// (once per request, O(ids + segments)): the shape's segments lie inside
// the pool's blocks and are disjoint (the decoder checked both against the
// WANT's block length, which is the pool's), the ids are whole groups
// below the pool's block count with none twice (so no byte of the pool is
// written twice by the request), the units cover the pool's regions, and
// peer may write the pool.
func checkWantShape(w *wire.WantBlocks, lp *localPool, peer string) error {
	p := lp.pool
	if err := w.Shape.Validate(p.BlockLen); err != nil {
		return fmt.Errorf("pool %q: %w", w.Pool, err)
	}
	if err := w.Shape.CheckDisjoint(); err != nil {
		return fmt.Errorf("pool %q: %w", w.Pool, err)
	}
	switch {
	case uint64(len(w.IDs))%uint64(w.Shape.Group) != 0:
		return fmt.Errorf("pool %q: %d ids are not whole groups of %d", w.Pool, len(w.IDs), w.Shape.Group)
	case w.Regions() != uint64(len(p.Regions)) || w.Regions()*(uint64(len(w.IDs))/uint64(w.Shape.Group)) != w.Pieces:
		return fmt.Errorf("pool %q has %d regions, not %d units' worth", w.Pool, len(p.Regions), w.Pieces)
	case !lp.writable(peer):
		return fmt.Errorf("pool %q lies in memory %q may not write: %w", w.Pool, peer, transfer.ErrForbidden)
	}
	if err := (transfer.Blocks{Pool: p, IDs: w.IDs}).CheckIDs(true); err != nil {
		return fmt.Errorf("pool %q: %w", w.Pool, err)
	}
	return nil
}

// gatherShaped starts a converted chunk's gather: the stage's own
// GatherShaped when it has the capability (transfer.ShapedGatherer), else
// the copy expanded to runs (expandShaped), the one place the pipeline
// spells a shaped copy out segment by segment.
func gatherShaped(g transfer.Gatherer, region transfer.Desc, c transfer.ShapedCopy) (transfer.Op, error) {
	if sg, ok := g.(transfer.ShapedGatherer); ok {
		return sg.GatherShaped(region, c)
	}
	if err := c.Check(region.Len); err != nil {
		return nil, err
	}
	return g.Gather(region, expandShaped(c))
}

// scatterShaped is gatherShaped for the receiver's scatter.
func scatterShaped(s transfer.Scatterer, region transfer.Desc, c transfer.ShapedCopy) (transfer.Op, error) {
	if ss, ok := s.(transfer.ShapedScatterer); ok {
		return ss.ScatterShaped(region, c)
	}
	if err := c.Check(region.Len); err != nil {
		return nil, err
	}
	return s.Scatter(region, expandShaped(c))
}

// expandShaped spells a checked shaped copy out as runs (its meaning,
// transfer.ShapedCopy.Runs), merging runs that continue each other or
// repeat at fixed strides.
func expandShaped(c transfer.ShapedCopy) []transfer.Run {
	runs := make([]transfer.Run, 0, 16)
	c.Runs(func(addr, off, n uint64) bool {
		runs = appendMerged(runs, transfer.Run{RegionOff: off, Addr: addr, Len: n, Count: 1})
		return true
	})
	return runs
}

// convertedWrites spells a converted block request out as direct writes:
// each source segment to its destination segment (the two shapes pair up
// segment by segment), merged where both continue the previous write. It
// is the direct route's per-descriptor form of a conversion.
func convertedWrites(br *BlockRequest) []transfer.WriteOp {
	units := br.pieces()
	if units == 0 {
		return nil
	}
	src := transfer.ShapedCopy{BlockCopy: transfer.BlockCopy{Blocks: br.src, Count: units}, Shape: br.conv.Src}
	dst := transfer.ShapedCopy{BlockCopy: transfer.BlockCopy{Blocks: br.dst, Count: units}, Shape: br.conv.Dst}
	var srcAddrs []uint64
	src.Runs(func(addr, _, _ uint64) bool { srcAddrs = append(srcAddrs, addr); return true })
	sp, dp := br.src.Pool, br.dst.Pool
	ops := make([]transfer.WriteOp, 0, len(srcAddrs))
	k := 0
	dst.Runs(func(addr, _, n uint64) bool {
		s := srcAddrs[k]
		k++
		if m := len(ops); m > 0 && ops[m-1].Src.End() == s && ops[m-1].Dst.End() == addr {
			ops[m-1].Src.Len += n
			ops[m-1].Dst.Len += n
			return true
		}
		ops = append(ops, transfer.WriteOp{
			Src: transfer.Desc{Addr: s, Len: n, Device: sp.Device, Kind: sp.Kind},
			Dst: transfer.Desc{Addr: addr, Len: n, Device: dp.Device, Kind: dp.Kind},
		})
		return true
	})
	return ops
}
