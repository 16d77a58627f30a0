// Package convert plans the conversion of KV blocks between two pool
// layouts (transfer.Layout): a tensor-parallel split or merge of heads, a
// change of tokens per block, a swap of token- and head-major order, or any
// combination. It is pure logic: it returns the two transfer.Shapes a
// block-table copy moves with, the sender's (how it reads its blocks into
// staging) and the receiver's (how it writes staging into its blocks), or
// the reason the layouts cannot be converted.
package convert

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/bouncekv/bounce/transfer"
)

// ErrIncompatible means two layouts cannot be converted into each other.
var ErrIncompatible = errors.New("layouts cannot be converted")

// Side is the side of a transfer that rearranges the bytes: the one whose
// copy reads or writes out of its memory order.
type Side uint8

const (
	// Auto lets Plan choose: the sender when the destination holds more
	// heads than the source (a merge: several senders share the work), else
	// the receiver.
	Auto Side = iota
	// Receiver: staging is in the source's order; the scatter rearranges.
	Receiver
	// Sender: staging is in the destination's order; the gather
	// rearranges.
	Sender
)

// String names the side.
func (s Side) String() string {
	switch s {
	case Auto:
		return "auto"
	case Receiver:
		return "receiver"
	case Sender:
		return "sender"
	}
	return fmt.Sprintf("side(%d)", uint8(s))
}

// Limits of a conversion.
const (
	// MaxGroup is the most ids of one side a group may hold (the ratio of
	// the two block sizes' least common multiple to a block size).
	MaxGroup = 1024
	// MaxPieces bounds the (token, head) pieces of one group the planner
	// enumerates before merging them into segments.
	MaxPieces = 1 << 20
)

// Conversion is a planned layout conversion. Every (region, group) unit
// moves Src's segments of SrcGroup consecutive source ids into staging and
// Dst's segments of DstGroup consecutive destination ids out of it; the
// two shapes have the same segment lengths in the same order. A group
// covers Tokens tokens; heads [FirstHead, FirstHead+Heads) move (the heads
// both sides hold); the rest of a destination block is not written.
type Conversion struct {
	Src, Dst         transfer.Shape
	Tokens           uint32
	FirstHead, Heads uint32
	Rearranger       Side

	whole bool // one segment of a whole block on both sides
}

// UnitLen is the bytes one unit moves.
func (c *Conversion) UnitLen() uint64 { return c.Src.UnitLen() }

// Identity reports whether the conversion moves whole blocks unchanged, id
// for id: a plain block-table copy does the same.
func (c *Conversion) Identity() bool {
	return c.Src.Group == 1 && c.Dst.Group == 1 && len(c.Src.Segs) == 1 && len(c.Dst.Segs) == 1 &&
		c.Src.Segs[0].Off == 0 && c.Dst.Segs[0].Off == 0 && c.whole
}

// Groups returns the number of groups a request of nsrc source and ndst
// destination ids makes, or why the counts do not pair up.
func (c *Conversion) Groups(nsrc, ndst int) (uint64, error) {
	gs, gd := int(c.Src.Group), int(c.Dst.Group)
	switch {
	case nsrc == 0 || ndst == 0:
		return 0, fmt.Errorf("%d source and %d destination block ids: %w", nsrc, ndst, ErrIncompatible)
	case nsrc%gs != 0 || ndst%gd != 0 || nsrc/gs != ndst/gd:
		return 0, fmt.Errorf("%d source and %d destination block ids do not pair as groups of %d and %d (%d tokens each; pad the shorter side to whole groups): %w", nsrc, ndst, gs, gd, c.Tokens, ErrIncompatible)
	}
	return uint64(nsrc / gs), nil
}

// Plan plans the conversion of blocks of layout src into blocks of layout
// dst, with the bytes rearranged on side (Auto: Plan chooses). It refuses,
// wrapping ErrIncompatible, layouts that differ in layers, K/V, head size
// or element size, head slices that share no head, block sizes whose least
// common multiple makes a group past MaxGroup, and a group that needs more
// than transfer.MaxSegments segments.
func Plan(src, dst transfer.Layout, side Side) (*Conversion, error) {
	if err := src.Validate(); err != nil {
		return nil, fmt.Errorf("source %w", err)
	}
	if err := dst.Validate(); err != nil {
		return nil, fmt.Errorf("destination %w", err)
	}
	refuse := func(format string, a ...any) (*Conversion, error) {
		return nil, fmt.Errorf("convert %v to %v: %s: %w", src, dst, fmt.Sprintf(format, a...), ErrIncompatible)
	}
	switch {
	case src.Layers != dst.Layers:
		return refuse("%d layers against %d", src.Layers, dst.Layers)
	case src.KV != dst.KV:
		return refuse("%d K/V tensors a layer against %d", src.KV, dst.KV)
	case src.HeadDim != dst.HeadDim:
		return refuse("heads of %d elements against %d", src.HeadDim, dst.HeadDim)
	case src.Elem != dst.Elem:
		return refuse("elements of %d bytes against %d", src.Elem, dst.Elem)
	}
	h0, h1 := max(src.FirstHead, dst.FirstHead), min(src.FirstHead+src.Heads, dst.FirstHead+dst.Heads)
	if h0 >= h1 {
		return refuse("the source holds heads [%d, %d), the destination [%d, %d): no head in common", src.FirstHead, src.FirstHead+src.Heads, dst.FirstHead, dst.FirstHead+dst.Heads)
	}
	g := gcd(src.Tokens, dst.Tokens)
	gs, gd := dst.Tokens/g, src.Tokens/g // source and destination ids a group
	if gs > MaxGroup || gd > MaxGroup {
		return refuse("blocks of %d and %d tokens make groups of %d and %d ids; at most %d", src.Tokens, dst.Tokens, gs, gd, MaxGroup)
	}
	tokens := uint64(gs) * uint64(src.Tokens)
	if n := tokens * uint64(h1-h0); n > MaxPieces {
		return refuse("a group of %d tokens x %d heads is more than %d pieces", tokens, h1-h0, MaxPieces)
	}
	switch side {
	case Auto:
		side = Receiver
		if dst.Heads > src.Heads {
			side = Sender
		}
	case Receiver, Sender:
	default:
		return nil, fmt.Errorf("convert: side %v: auto, receiver or sender accepted", side)
	}
	order := src // the layout staging follows
	if side == Sender {
		order = dst
	}
	type piece struct {
		key        uint64 // position in order's group
		sb, db     uint32
		soff, doff uint64
	}
	hl := src.HeadLen()
	bl := order.BlockLen()
	ps := make([]piece, 0, tokens*uint64(h1-h0))
	for t := uint32(0); uint64(t) < tokens; t++ {
		for h := h0; h < h1; h++ {
			p := piece{
				sb: t / src.Tokens, soff: src.Offset(t%src.Tokens, h),
				db: t / dst.Tokens, doff: dst.Offset(t%dst.Tokens, h),
			}
			p.key = uint64(t/order.Tokens)*bl + order.Offset(t%order.Tokens, h)
			ps = append(ps, p)
		}
	}
	slices.SortFunc(ps, func(a, b piece) int { return cmp.Compare(a.key, b.key) })
	c := &Conversion{Src: transfer.Shape{Group: gs}, Dst: transfer.Shape{Group: gd}, Tokens: uint32(tokens), FirstHead: h0, Heads: h1 - h0, Rearranger: side}
	for i, p := range ps {
		if i > 0 {
			s, d := &c.Src.Segs[len(c.Src.Segs)-1], &c.Dst.Segs[len(c.Dst.Segs)-1]
			if s.Block == p.sb && uint64(s.Off)+uint64(s.Len) == p.soff && d.Block == p.db && uint64(d.Off)+uint64(d.Len) == p.doff &&
				uint64(s.Len)+hl <= transfer.MaxLayoutBlock {
				s.Len += uint32(hl)
				d.Len += uint32(hl)
				continue
			}
		}
		if len(c.Src.Segs) == transfer.MaxSegments {
			return refuse("a group needs more than %d segments", transfer.MaxSegments)
		}
		c.Src.Segs = append(c.Src.Segs, transfer.Segment{Block: p.sb, Off: uint32(p.soff), Len: uint32(hl)})
		c.Dst.Segs = append(c.Dst.Segs, transfer.Segment{Block: p.db, Off: uint32(p.doff), Len: uint32(hl)})
	}
	c.whole = gs == 1 && gd == 1 && c.UnitLen() == src.BlockLen() && c.UnitLen() == dst.BlockLen()
	return c, nil
}

func gcd(a, b uint32) uint32 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
