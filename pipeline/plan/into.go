package plan

import (
	"fmt"

	"github.com/bouncekv/bounce/transfer"
)

// LayoutInto packs src into chunks of the given sizes exactly as Layout
// packed the transfer whose chunks they are, so two agents that hold one
// side of a transfer each agree on every piece's region offset without
// exchanging the other side: the holder of a pull packs its sources into
// the puller's chunks. It applies Layout's rule in reverse — each piece at
// the next Align-byte offset while it fits chunk k's size; a piece that
// opens a chunk and is longer than its size is split at it; a chunk is
// done once it ends exactly at its size — and fails, naming the chunk,
// when the sources do not fill the sizes that way (a chunk would end short
// of its size, mix devices or memory kinds, the sources outlast the
// chunks or run out before them). MaxChunk bounds every size and NoMerge
// keeps one gather run per piece; MinChunk and Scatter do not apply (the
// sizes are given).
//
// The plan's chunks have gather runs only (Fill emits no scatter: where
// the bytes land is the other agent's plan; a chunk's Dst device and kind
// are its source's, standing for none), and each chunk's First and
// Count are its piece range, the pieces numbered from 0 over the plan
// (PieceRanges of the other side's plan). The plan keeps src until every
// chunk is filled.
func LayoutInto(src []transfer.Desc, sizes []uint64, opt Options) (*Plan, error) {
	align, err := opt.align()
	if err != nil {
		return nil, err
	}
	for k, n := range sizes {
		if n == 0 || n > opt.MaxChunk {
			return nil, fmt.Errorf("plan: chunk %d has %d bytes; accepted 1..%d", k, n, opt.MaxChunk)
		}
	}
	p := &Plan{Chunks: make([]Chunk, 0, len(sizes)), src: src, align: align, merge: !opt.NoMerge, gatherOnly: true}
	var c *Chunk   // the chunk being packed; nil between chunks
	var end uint64 // its end (the last piece's)
	var pieces uint64
	for i, s := range src {
		if s.Len == 0 {
			continue
		}
		if s.Addr > ^uint64(0)-s.Len {
			return nil, fmt.Errorf("plan: descriptor %d: %v wraps the address space", i, s)
		}
		p.Descs++
		for pos := uint64(0); pos < s.Len; {
			if c == nil {
				k := len(p.Chunks)
				if k == len(sizes) {
					return nil, fmt.Errorf("plan: descriptor %d: the sources outlast the %d chunks", i, len(sizes))
				}
				p.Chunks = append(p.Chunks, Chunk{Index: k, Bytes: sizes[k], SrcDevice: s.Device, DstDevice: s.Device,
					SrcKind: s.Kind, DstKind: s.Kind, First: pieces, first: i, pos: pos})
				c, end = &p.Chunks[k], 0
			}
			off := (end + align - 1) &^ (align - 1)
			rest := s.Len - pos
			switch {
			case c.Descs == 0: // the piece opens the chunk: split at its size
				off = 0
				rest = min(rest, c.Bytes)
			case s.Device != c.SrcDevice || s.Kind != c.SrcKind:
				return nil, fmt.Errorf("plan: chunk %d ends at %d bytes where descriptor %d changes device or memory kind, short of its %d", c.Index, end, i, c.Bytes)
			case off > c.Bytes || rest > c.Bytes-off:
				return nil, fmt.Errorf("plan: chunk %d ends at %d bytes where descriptor %d does not fit, short of its %d", c.Index, end, i, c.Bytes)
			}
			end = off + rest
			c.Payload += rest
			c.Descs++
			pieces++
			p.Payload += rest
			pos += rest
			if end == c.Bytes {
				c = nil // nothing more fits
			}
		}
	}
	switch {
	case c != nil:
		return nil, fmt.Errorf("plan: the sources end at %d bytes of chunk %d, short of its %d", end, c.Index, c.Bytes)
	case len(p.Chunks) < len(sizes):
		return nil, fmt.Errorf("plan: the sources fill %d of the %d chunks", len(p.Chunks), len(sizes))
	case len(p.Chunks) == 0:
		p.src = nil
	}
	for k := range p.Chunks {
		p.Chunks[k].Count = uint64(p.Chunks[k].Descs) // its range: [First, +Descs)
	}
	return p, nil
}

// PieceRanges returns each chunk's piece range (first, count), the pieces
// numbered from 0 over the plan: the ranges a LayoutInto plan of the same
// chunks over the other side's descriptors has, and a block-table plan's
// First and Count.
func (p *Plan) PieceRanges() [][2]uint64 {
	out := make([][2]uint64, len(p.Chunks))
	var first uint64
	for k, c := range p.Chunks {
		out[k] = [2]uint64{first, uint64(c.Descs)}
		first += uint64(c.Descs)
	}
	return out
}
