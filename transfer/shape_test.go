package transfer

import (
	"errors"
	"testing"

	"pgregory.net/rapid"
)

// wholeShape is the shape of whole-block copies: one group per id, the
// whole block as one segment.
func wholeShape(blockLen uint64) Shape {
	return Shape{Group: 1, Segs: []Segment{{Len: uint32(blockLen)}}}
}

// TestWholeShapeRunsArePieces checks that the whole-block shape moves
// exactly the BlockCopy's pieces, in order, packed from RegionOff.
func TestWholeShapeRunsArePieces(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := smallPool(t)
		n := rapid.IntRange(1, 6).Draw(t, "ids")
		ids := make([]uint32, n)
		for i := range ids {
			ids[i] = uint32(rapid.Uint64Range(0, p.Blocks-1).Draw(t, "id"))
		}
		b := Blocks{Pool: p, IDs: ids}
		first := rapid.Uint64Range(0, b.Len()).Draw(t, "first")
		count := rapid.Uint64Range(0, b.Len()-first).Draw(t, "count")
		c := ShapedCopy{BlockCopy: BlockCopy{Blocks: b, First: first, Count: count, RegionOff: 7}, Shape: wholeShape(p.BlockLen)}
		if err := c.Check(7 + count*p.BlockLen); err != nil {
			t.Fatalf("Check: %v", err)
		}
		k := uint64(0)
		c.Runs(func(addr, off, l uint64) bool {
			d := b.Piece(first + k)
			if addr != d.Addr || l != d.Len || off != 7+k*p.BlockLen {
				t.Fatalf("run %d = (%#x, %d, %d), want piece %v at %d", k, addr, off, l, d, 7+k*p.BlockLen)
			}
			k++
			return true
		})
		if k != count {
			t.Fatalf("%d runs, want %d", k, count)
		}
		if c.Bytes() != count*p.BlockLen {
			t.Fatalf("Bytes = %d, want %d", c.Bytes(), count*p.BlockLen)
		}
	})
}

// TestShapedRunsStayInBounds checks, for any shape Check accepts, that every
// run lies in a block the table names and inside the region.
func TestShapedRunsStayInBounds(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := smallPool(t)
		group := rapid.Uint32Range(1, 3).Draw(t, "group")
		var s Shape
		s.Group = group
		for range rapid.IntRange(1, 4).Draw(t, "segs") {
			off := rapid.Uint32Range(0, uint32(p.BlockLen)-1).Draw(t, "off")
			s.Segs = append(s.Segs, Segment{
				Block: rapid.Uint32Range(0, group-1).Draw(t, "block"),
				Off:   off,
				Len:   rapid.Uint32Range(1, uint32(p.BlockLen)-off).Draw(t, "len"),
			})
		}
		groups := rapid.IntRange(1, 3).Draw(t, "groups")
		ids := make([]uint32, int(group)*groups)
		for i := range ids {
			ids[i] = uint32(rapid.Uint64Range(0, p.Blocks-1).Draw(t, "id"))
		}
		c := ShapedCopy{BlockCopy: BlockCopy{Blocks: Blocks{Pool: p, IDs: ids}}, Shape: s}
		c.First = rapid.Uint64Range(0, c.Units()).Draw(t, "first")
		c.Count = rapid.Uint64Range(0, c.Units()-c.First).Draw(t, "count")
		regionLen := c.Bytes()
		if err := c.Check(regionLen); err != nil {
			t.Fatalf("Check: %v", err)
		}
		if c.Count > 0 {
			if err := c.Check(regionLen - 1); !errors.Is(err, ErrOutOfBounds) {
				t.Fatalf("Check one byte short = %v, want ErrOutOfBounds", err)
			}
		}
		var moved uint64
		c.Runs(func(addr, off, l uint64) bool {
			in := false
			for r := range p.Regions {
				for _, id := range ids {
					d := p.Piece(r, id)
					in = in || (addr >= d.Addr && addr+l <= d.End())
				}
			}
			if !in || off+l > regionLen {
				t.Fatalf("run (%#x, %d, %d) is outside the table's blocks or the region", addr, off, l)
			}
			moved += l
			return true
		})
		if moved != c.Bytes() {
			t.Fatalf("runs move %d bytes, Bytes = %d", moved, c.Bytes())
		}
	})
}

func TestShapeRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Shape
	}{
		{"no group", Shape{Segs: []Segment{{Len: 1}}}},
		{"no segments", Shape{Group: 1}},
		{"empty segment", Shape{Group: 1, Segs: []Segment{{Len: 0}}}},
		{"block past group", Shape{Group: 2, Segs: []Segment{{Block: 2, Len: 1}}}},
		{"past block", Shape{Group: 1, Segs: []Segment{{Off: 10, Len: 7}}}},
	} {
		if err := tc.s.Validate(16); err == nil {
			t.Errorf("%s: Validate accepted %+v", tc.name, tc.s)
		}
	}
	ok := Shape{Group: 2, Segs: []Segment{{Block: 1, Off: 8, Len: 8}, {Block: 0, Off: 0, Len: 8}, {Block: 1, Off: 0, Len: 8}}}
	if err := ok.CheckDisjoint(); err != nil {
		t.Fatalf("disjoint shape refused: %v", err)
	}
	bad := Shape{Group: 2, Segs: []Segment{{Block: 1, Off: 8, Len: 8}, {Block: 0, Off: 0, Len: 8}, {Block: 1, Off: 4, Len: 5}}}
	if err := bad.CheckDisjoint(); err == nil {
		t.Fatalf("overlapping segments accepted")
	}
	c := ShapedCopy{BlockCopy: BlockCopy{Blocks: Blocks{Pool: Pool{Regions: []uint64{0}, BlockLen: 16, Stride: 16, Blocks: 4}, IDs: []uint32{0, 1, 2}}, Count: 1}, Shape: Shape{Group: 2, Segs: []Segment{{Len: 16}}}}
	if err := c.Check(1 << 20); err == nil {
		t.Fatalf("3 ids in groups of 2 accepted")
	}
}
