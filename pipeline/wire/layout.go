package wire

import (
	"fmt"
	"math/bits"

	"github.com/bouncekv/bounce/transfer"
)

// The pool layout and shaped WANT encodings (version 6).
//
// A pool descriptor ends in a has-layout byte (0 or 1) and, when 1, the
// layout: layers, kv, heads, first head, head size, tokens, element size
// as u32 and the order as u8.
//
// A WANT of form formShaped (2) carries a WantBlocks followed by its Shape:
// group u32, the segment count u32 and per segment block, offset and
// length u32.

// formShaped is the WANT form of a block-table request with a Shape.
const formShaped = 2

// layoutLen is a layout's encoded size after its has-layout byte.
const layoutLen = 7*4 + 1

// segmentSize is one encoded shape segment.
const segmentSize = 12

func layoutEncLen(l *transfer.Layout) int {
	if l == nil {
		return 1
	}
	return 1 + layoutLen
}

func appendLayout(b []byte, l *transfer.Layout) []byte {
	if l == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	for _, v := range []uint32{l.Layers, l.KV, l.Heads, l.FirstHead, l.HeadDim, l.Tokens, l.Elem} {
		b = le.AppendUint32(b, v)
	}
	return append(b, byte(l.Order))
}

// layout decodes a pool's layout (nil when it has none).
func (d *decoder) layout() *transfer.Layout {
	switch has := d.u8("pool has-layout"); {
	case d.err != nil || has == 0:
		return nil
	case has != 1:
		d.err = errorf(d.what, ErrMalformed, "pool has-layout byte %d, want 0 or 1", has)
		return nil
	}
	l := &transfer.Layout{}
	for _, f := range []*uint32{&l.Layers, &l.KV, &l.Heads, &l.FirstHead, &l.HeadDim, &l.Tokens, &l.Elem} {
		*f = d.u32("pool layout")
	}
	l.Order = transfer.Order(d.u8("pool layout order"))
	if d.err != nil {
		return nil
	}
	return l
}

// checkLayout reports why p's layout does not describe its pool.
func (p *PoolDesc) checkLayout() string {
	if p.Layout == nil {
		return ""
	}
	if err := p.Layout.CheckPool(p.Pool); err != nil {
		return fmt.Sprintf("pool %q: %v", p.Name, err)
	}
	return ""
}

func shapeLen(s *transfer.Shape) int { return 4 + 4 + segmentSize*len(s.Segs) }

func appendShape(b []byte, s *transfer.Shape) []byte {
	b = le.AppendUint32(b, s.Group)
	b = le.AppendUint32(b, uint32(len(s.Segs)))
	for _, g := range s.Segs {
		b = le.AppendUint32(b, g.Block)
		b = le.AppendUint32(b, g.Off)
		b = le.AppendUint32(b, g.Len)
	}
	return b
}

func (d *decoder) shape() *transfer.Shape {
	s := &transfer.Shape{Group: d.u32("shape group")}
	n := d.count("shape segment count", transfer.MaxSegments, segmentSize)
	if d.err != nil {
		return nil
	}
	s.Segs = make([]transfer.Segment, n)
	for i := range s.Segs {
		e := d.b[d.off+segmentSize*i:]
		s.Segs[i] = transfer.Segment{Block: le.Uint32(e), Off: le.Uint32(e[4:]), Len: le.Uint32(e[8:])}
	}
	d.off += segmentSize * n
	return s
}

// checkShape reports why a shaped WantBlocks is inconsistent: an invalid
// or overlapping shape for its blocks, ids that are not whole groups, a
// unit count that is not regions × groups, or a payload that overflows.
// It is O(segments log segments), once per request.
func (w *WantBlocks) checkShape() string {
	s := w.Shape
	if err := s.Validate(w.BlockLen); err != nil {
		return err.Error()
	}
	if err := s.CheckDisjoint(); err != nil {
		return err.Error()
	}
	groups := uint64(len(w.IDs)) / uint64(s.Group)
	switch {
	case uint64(len(w.IDs))%uint64(s.Group) != 0:
		return fmt.Sprintf("%d ids are not whole groups of %d", len(w.IDs), s.Group)
	case w.Pieces == 0 || w.Pieces%groups != 0:
		return fmt.Sprintf("%d units is not a positive multiple of %d groups", w.Pieces, groups)
	case w.Pieces/groups > transfer.MaxPoolRegions:
		return fmt.Sprintf("%d units over %d groups is more than %d regions", w.Pieces, groups, transfer.MaxPoolRegions)
	}
	if hi, _ := bits.Mul64(w.Pieces, s.UnitLen()); hi != 0 {
		return fmt.Sprintf("%d units of %d bytes overflow", w.Pieces, s.UnitLen())
	}
	return ""
}

// UnitLen is the bytes of one piece (BlockLen) or, with a Shape, of one
// unit.
func (w *WantBlocks) UnitLen() uint64 {
	if w.Shape != nil {
		return w.Shape.UnitLen()
	}
	return w.BlockLen
}

// wantForm is the form byte of a block-table WANT.
func wantForm(w *WantBlocks) byte {
	if w.Shape != nil {
		return formShaped
	}
	return formBlocks
}
