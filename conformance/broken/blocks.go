package broken

import (
	"fmt"

	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/mem"
	gatherhost "github.com/bouncekv/bounce/stages/gather/host"
	scatterhost "github.com/bouncekv/bounce/stages/scatter/host"
	"github.com/bouncekv/bounce/transfer"
)

// BlockFault selects how the block form of a BlockGatherers,
// BlockScatterers or BlockEngines fixture is broken. The block form there
// expands a block copy (or write) into one run (or write) per piece and
// hands it to the correct in-tree stage (or loopback engine); each fault
// changes that expansion.
type BlockFault int

// Block faults, with the rule each one breaks.
const (
	// BlockNone breaks nothing: the expansion the faults change, which
	// the block rules pass.
	BlockNone BlockFault = iota
	// BlockIgnoreFirst copies pieces [0, Count) whatever First says
	// (<kind>/blocks-byte-exact).
	BlockIgnoreFirst
	// BlockIgnoreStride places block i at Regions[r] + i*BlockLen, as if
	// the stride were the block (<kind>/blocks-byte-exact).
	BlockIgnoreStride
	// BlockUncheckedIDs never compares ids with Pool.Blocks: an id past the
	// pool is copied from (or to) whatever registered memory it names
	// (<kind>/blocks-failure-reported).
	BlockUncheckedIDs
	// BlockCheckAsYouGo copies piece by piece at once and checks each id
	// just before its piece, so a chunk with a bad id is refused after the
	// pieces before it moved (<kind>/blocks-failure-reported).
	BlockCheckAsYouGo
	// BlockBlendRepeats writes the XOR of every piece destined to a
	// destination named more than once (<kind>/blocks-repeated-ids).
	BlockBlendRepeats
	// BlockSameShape (engines) places destination piece q by the source
	// table's shape — region q / len(Src.IDs), id q % len(Src.IDs) — as if
	// both tables had the same region and id counts (engine/blocks-geometry).
	BlockSameShape
)

// String names the fault.
func (f BlockFault) String() string {
	switch f {
	case BlockNone:
		return "block-none"
	case BlockIgnoreFirst:
		return "block-ignore-first"
	case BlockIgnoreStride:
		return "block-ignore-stride"
	case BlockUncheckedIDs:
		return "block-unchecked-ids"
	case BlockCheckAsYouGo:
		return "block-check-as-you-go"
	case BlockBlendRepeats:
		return "block-blend-repeats"
	case BlockSameShape:
		return "block-same-shape"
	default:
		return fmt.Sprintf("block-fault(%d)", int(f))
	}
}

// BlockGatherers returns a GathererFactory of host gatherers (package
// stages/gather/host) with a block form broken as f says.
func BlockGatherers(f BlockFault) conformance.GathererFactory {
	return func() (conformance.GathererFixture, error) {
		reg := &mem.Registry{}
		g, err := gatherhost.New(gatherhost.Settings{Registry: reg})
		if err != nil {
			return conformance.GathererFixture{}, err
		}
		return conformance.GathererFixture{Gatherer: &blockGatherer{Gatherer: g, x: expander{reg: reg, fault: f}}, Register: reg.Add}, nil
	}
}

// BlockScatterers returns a ScattererFactory of host scatterers with a
// block form broken as f says.
func BlockScatterers(f BlockFault) conformance.ScattererFactory {
	return func() (conformance.ScattererFixture, error) {
		reg := &mem.Registry{}
		s, err := scatterhost.New(scatterhost.Settings{Registry: reg})
		if err != nil {
			return conformance.ScattererFixture{}, err
		}
		return conformance.ScattererFixture{Scatterer: &blockScatterer{Scatterer: s, x: expander{reg: reg, fault: f, scatter: true}}, Register: reg.Add}, nil
	}
}

type blockGatherer struct {
	*gatherhost.Gatherer
	x expander
}

// GatherBlocks expands c into runs, as the fault says.
func (g *blockGatherer) GatherBlocks(region transfer.Desc, c transfer.BlockCopy) (transfer.Op, error) {
	return g.x.copy(region, c, g.Gather)
}

type blockScatterer struct {
	*scatterhost.Scatterer
	x expander
}

// ScatterBlocks expands c into runs, as the fault says.
func (s *blockScatterer) ScatterBlocks(region transfer.Desc, c transfer.BlockCopy) (transfer.Op, error) {
	return s.x.copy(region, c, s.Scatter)
}

// expander turns a block copy into runs, one per piece.
type expander struct {
	reg     *mem.Registry
	fault   BlockFault
	scatter bool
}

// check is BlockCopy.Check, less the id comparison under BlockUncheckedIDs
// (the piece range is still checked: the expansion indexes the ids).
func (x expander) check(c transfer.BlockCopy, regionLen uint64) error {
	if x.fault != BlockUncheckedIDs {
		return c.Check(regionLen)
	}
	n := c.Blocks.Len()
	if n == 0 || c.First > n || c.Count > n-c.First {
		return fmt.Errorf("broken: pieces [%d, +%d) pass the table's %d", c.First, c.Count, n)
	}
	if c.RegionOff > regionLen || c.Count*c.Blocks.Pool.BlockLen > regionLen-c.RegionOff {
		return fmt.Errorf("broken: pieces pass the region: %w", transfer.ErrOutOfBounds)
	}
	return nil
}

// piece is piece q of b as the fault places it.
func (x expander) piece(b transfer.Blocks, q uint64) transfer.Desc {
	d := b.Piece(q)
	if x.fault == BlockIgnoreStride {
		n := uint64(len(b.IDs))
		d.Addr = b.Pool.Regions[q/n] + uint64(b.IDs[q%n])*b.Pool.BlockLen
	}
	return d
}

func (x expander) copy(region transfer.Desc, c transfer.BlockCopy, do func(transfer.Desc, []transfer.Run) (transfer.Op, error)) (transfer.Op, error) {
	if x.fault == BlockCheckAsYouGo {
		return x.copyAsYouGo(region, c)
	}
	if err := x.check(c, region.Len); err != nil {
		return nil, fmt.Errorf("broken block copy: %w", err)
	}
	first := c.First
	if x.fault == BlockIgnoreFirst {
		first = 0
	}
	bl := c.Blocks.Pool.BlockLen
	runs := make([]transfer.Run, 0, c.Count)
	seen := map[uint64][]uint64{} // BlockBlendRepeats: destination address → region offsets
	for k := range c.Count {
		d := x.piece(c.Blocks, first+k)
		ro := c.RegionOff + k*bl
		if x.fault == BlockBlendRepeats && x.scatter {
			if prev := seen[d.Addr]; len(prev) > 0 {
				seen[d.Addr] = append(prev, ro)
				continue
			}
			seen[d.Addr] = []uint64{ro}
		}
		runs = append(runs, transfer.Run{RegionOff: ro, Addr: d.Addr, Len: bl, Count: 1})
	}
	op, err := do(region, runs)
	if err != nil || x.fault != BlockBlendRepeats || !x.scatter {
		return op, err
	}
	return &blendOp{Op: op, region: region, seen: seen, bl: bl}, nil
}

// copyAsYouGo copies each piece synchronously, checking it just before.
func (x expander) copyAsYouGo(region transfer.Desc, c transfer.BlockCopy) (transfer.Op, error) {
	bl := c.Blocks.Pool.BlockLen
	if len(c.Blocks.IDs) == 0 || c.First+c.Count > c.Blocks.Len() {
		return nil, fmt.Errorf("broken: pieces [%d, +%d) pass the table", c.First, c.Count)
	}
	if _, err := x.reg.Find(region.Addr, region.Len); err != nil {
		return nil, fmt.Errorf("broken: region: %w", err)
	}
	for k := range c.Count {
		q := c.First + k
		if err := c.Blocks.CheckRange(q, 1); err != nil {
			return nil, fmt.Errorf("broken: piece %d: %w", q, err)
		}
		d := c.Blocks.Piece(q)
		ro := c.RegionOff + k*bl
		if ro+bl > region.Len {
			return nil, fmt.Errorf("broken: piece %d passes the region: %w", q, transfer.ErrOutOfBounds)
		}
		p, err := x.reg.Slice(d.Addr, bl)
		if err != nil {
			return nil, fmt.Errorf("broken: piece %d: %w", q, err)
		}
		r := mem.Unsafe(region.Addr+ro, bl)
		if x.scatter {
			copy(p, r)
		} else {
			copy(r, p)
		}
	}
	return doneOp{}, nil
}

// blendOp, once the scatter is done, XORs into every destination named
// more than once the other pieces destined to it.
type blendOp struct {
	transfer.Op
	region  transfer.Desc
	seen    map[uint64][]uint64
	bl      uint64
	blended bool
}

func (o *blendOp) Poll() (transfer.Status, error) {
	st, err := o.Op.Poll()
	if st == transfer.Done && !o.blended {
		o.blended = true
		for addr, ros := range o.seen {
			dst := mem.Unsafe(addr, o.bl)
			for _, ro := range ros[1:] {
				src := mem.Unsafe(o.region.Addr+ro, o.bl)
				for i := range dst {
					dst[i] ^= src[i]
				}
			}
		}
	}
	return st, err
}

// BlockEngines returns an EngineFactory of loopback pairs whose A offers a
// block form broken as f says: each block write expanded into one write
// per piece (BlockIgnoreFirst, BlockIgnoreStride and BlockUncheckedIDs
// apply to the destination table; BlockCheckAsYouGo does not apply).
func BlockEngines(f BlockFault) conformance.EngineFactory {
	return func() (conformance.EnginePair, error) {
		fab := loopback.NewFabric()
		a, err := fab.NewEngine("a")
		if err != nil {
			return conformance.EnginePair{}, err
		}
		b, err := fab.NewEngine("b")
		if err != nil {
			a.Close()
			return conformance.EnginePair{}, err
		}
		ea := &blockEngine{Engine: a, fault: f}
		return conformance.EnginePair{
			A: ea, B: b,
			KillB:   func() { b.Close() },
			Cleanup: func() { a.Close(); b.Close() },
		}, nil
	}
}

// blockEngine is a loopback engine with an expanding PostBlocks.
type blockEngine struct {
	*loopback.Engine
	fault BlockFault
}

// PostBlocks expands w into one write per piece and posts them as one op.
func (e *blockEngine) PostBlocks(peer string, w transfer.BlockWrite) (transfer.Op, error) {
	x := expander{fault: e.fault}
	if w.Src.Pool.BlockLen != w.Dst.Pool.BlockLen {
		return nil, fmt.Errorf("broken: block lengths %d and %d differ", w.Src.Pool.BlockLen, w.Dst.Pool.BlockLen)
	}
	if err := w.Src.CheckRange(w.First, w.Count); err != nil {
		return nil, fmt.Errorf("broken: source: %w", err)
	}
	if err := x.check(transfer.BlockCopy{Blocks: w.Dst, First: w.First, Count: w.Count}, ^uint64(0)); err != nil {
		return nil, fmt.Errorf("broken: destination: %w", err)
	}
	first := w.First
	if e.fault == BlockIgnoreFirst {
		first = 0
	}
	ops := make([]transfer.WriteOp, 0, w.Count)
	type blend struct {
		dst  transfer.Desc
		srcs []transfer.Desc
	}
	var blends map[uint64]*blend
	if e.fault == BlockBlendRepeats {
		blends = map[uint64]*blend{}
	}
	for k := range w.Count {
		src, dst := w.Src.Piece(w.First+k), x.piece(w.Dst, first+k)
		if e.fault == BlockSameShape {
			q, n := first+k, uint64(len(w.Src.IDs))
			dst.Addr = w.Dst.Pool.Regions[q/n] + uint64(w.Dst.IDs[q%n])*w.Dst.Pool.Stride
		}
		if blends != nil {
			if b := blends[dst.Addr]; b != nil {
				b.srcs = append(b.srcs, src)
				continue
			}
			blends[dst.Addr] = &blend{dst: dst}
		}
		ops = append(ops, transfer.WriteOp{Src: src, Dst: dst})
	}
	op, err := e.PostWrite(peer, ops)
	if err != nil || blends == nil {
		return op, err
	}
	return &afterDone{Op: op, then: func() {
		for _, b := range blends {
			d := mem.Unsafe(b.dst.Addr, b.dst.Len)
			for _, s := range b.srcs {
				for i, v := range mem.Unsafe(s.Addr, s.Len) {
					d[i] ^= v
				}
			}
		}
	}}, nil
}

// afterDone runs then once, on the first Poll that reports Done.
type afterDone struct {
	transfer.Op
	then func()
	ran  bool
}

func (o *afterDone) Poll() (transfer.Status, error) {
	st, err := o.Op.Poll()
	if st == transfer.Done && !o.ran {
		o.ran = true
		o.then()
	}
	return st, err
}
