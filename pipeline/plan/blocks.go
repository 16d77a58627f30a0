package plan

import (
	"fmt"
	"math/bits"

	"github.com/bouncekv/bounce/transfer"
)

// LayoutBlocks plans a block-table transfer: piece q of src to piece q of
// dst (pieces numbered region-major, see transfer.Blocks), for every piece.
// A chunk is a range of pieces [First, First+Count), packed back to back in
// its region (piece First+k at offset k*BlockLen): nothing is computed or
// stored per piece, and the chunks need no Fill. Each chunk holds as many
// whole pieces as its cap allows (MaxChunk, or the ramp of MinChunk as in
// Layout), at least one. Options.Align, NoMerge and Scatter do not apply
// (a block chunk's DATA is a piece range of fixed size).
//
// It fails when the tables differ in id count, block length or region
// count, when a block is longer than MaxChunk, or when the plan would
// exceed MaxPieces chunks. It does not check the ids against the pools
// (transfer.Blocks.CheckIDs does, once per request).
func LayoutBlocks(src, dst transfer.Blocks, opt Options) (*Plan, error) {
	return layoutBlocks(src, dst, opt, MaxPieces)
}

// layoutBlocks is LayoutBlocks with at most maxChunks chunks.
func layoutBlocks(src, dst transfer.Blocks, opt Options, maxChunks uint64) (*Plan, error) {
	if opt.MaxChunk == 0 {
		return nil, fmt.Errorf("plan: MaxChunk must be positive")
	}
	bl := src.Pool.BlockLen
	switch {
	case len(src.IDs) != len(dst.IDs):
		return nil, fmt.Errorf("plan: %d source block ids but %d destination ids", len(src.IDs), len(dst.IDs))
	case bl != dst.Pool.BlockLen:
		return nil, fmt.Errorf("plan: source blocks of %d bytes, destination blocks of %d", bl, dst.Pool.BlockLen)
	case len(src.Pool.Regions) != len(dst.Pool.Regions):
		return nil, fmt.Errorf("plan: source pool of %d regions, destination pool of %d", len(src.Pool.Regions), len(dst.Pool.Regions))
	case bl == 0:
		return nil, fmt.Errorf("plan: block length 0")
	case bl > opt.MaxChunk:
		return nil, fmt.Errorf("plan: a block of %d bytes exceeds the %d-byte max chunk", bl, opt.MaxChunk)
	}
	pieces := src.Len()
	hi, payload := bits.Mul64(pieces, bl)
	if hi != 0 {
		return nil, fmt.Errorf("plan: %d pieces of %d bytes overflow", pieces, bl)
	}
	p := &Plan{src: nil, dst: nil, blocks: &blockTables{src: src, dst: dst}, Descs: int(pieces), Payload: payload}
	if pieces == 0 {
		return p, nil
	}
	// Full chunks alone would pass the limit: refused before anything is
	// allocated. The MinChunk ramp and taper add a few smaller chunks
	// (logarithmically many), counted as they are made.
	if n := (pieces + opt.MaxChunk/bl - 1) / (opt.MaxChunk / bl); n > maxChunks {
		return nil, fmt.Errorf("plan: transfer needs more than %d chunks of at most %d bytes", maxChunks, opt.MaxChunk)
	}
	b := builder{max: opt.MaxChunk, min: opt.MinChunk, total: payload}
	for first := uint64(0); first < pieces; {
		if uint64(len(p.Chunks)) == maxChunks {
			return nil, fmt.Errorf("plan: transfer needs more than %d chunks of at most %d bytes ramping from %d", maxChunks, opt.MaxChunk, opt.MinChunk)
		}
		cap := b.capFor(len(p.Chunks), payload-first*bl)
		n := min(max(cap/bl, 1), pieces-first)
		p.Chunks = append(p.Chunks, Chunk{
			Index: len(p.Chunks), Bytes: n * bl, Payload: n * bl, Descs: int(n),
			SrcDevice: src.Pool.Device, DstDevice: dst.Pool.Device, SrcKind: src.Pool.Kind, DstKind: dst.Pool.Kind,
			First: first, Count: n,
		})
		first += n
	}
	p.filled = len(p.Chunks)
	return p, nil
}

// blockTables are a block-table plan's two tables and, for a converted
// one (LayoutShaped), their shapes.
type blockTables struct {
	src, dst           transfer.Blocks
	srcShape, dstShape *transfer.Shape
}

// BlockTables returns a block-table plan's source and destination tables;
// ok is false for a descriptor plan.
func (p *Plan) BlockTables() (src, dst transfer.Blocks, ok bool) {
	if p.blocks == nil {
		return transfer.Blocks{}, transfer.Blocks{}, false
	}
	return p.blocks.src, p.blocks.dst, true
}

// GatherCopy returns chunk k of a block-table plan as the gather's
// BlockCopy (the source pieces into the region from offset 0).
func (p *Plan) GatherCopy(k int) transfer.BlockCopy {
	c := &p.Chunks[k]
	return transfer.BlockCopy{Blocks: p.blocks.src, First: c.First, Count: c.Count}
}
