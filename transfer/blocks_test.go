package transfer

import (
	"errors"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// smallPool draws a pool small enough to check byte by byte.
func smallPool(t *rapid.T) Pool {
	blen := rapid.Uint64Range(1, 16).Draw(t, "blockLen")
	stride := blen + rapid.Uint64Range(0, 24).Draw(t, "gap")
	p := Pool{
		BlockLen: blen,
		Stride:   stride,
		Blocks:   rapid.Uint64Range(1, 6).Draw(t, "blocks"),
	}
	nr := rapid.IntRange(1, 5).Draw(t, "regions")
	for range nr {
		p.Regions = append(p.Regions, rapid.Uint64Range(0, 256).Draw(t, "addr"))
	}
	return p
}

// overlapsByBytes marks every byte of every piece and reports a byte marked
// twice: the definition Validate's arithmetic must match.
func overlapsByBytes(p Pool) bool {
	seen := map[uint64]bool{}
	for r := range p.Regions {
		for i := uint64(0); i < p.Blocks; i++ {
			d := p.Piece(r, uint32(i))
			for a := d.Addr; a < d.End(); a++ {
				if seen[a] {
					return true
				}
				seen[a] = true
			}
		}
	}
	return false
}

// TestPoolOverlapMatchesBytes checks Validate's overlap rule (pairwise and
// sorted) against marking every byte.
func TestPoolOverlapMatchesBytes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := smallPool(t)
		want := overlapsByBytes(p)
		err := p.Validate()
		if got := err != nil; got != want {
			t.Fatalf("pool %v regions %v: Validate = %v, byte overlap = %v", p, p.Regions, err, want)
		}
		if want && !strings.Contains(err.Error(), "overlap") {
			t.Fatalf("error %q does not say overlap", err)
		}
		ext, _ := p.extent()
		if got := p.checkOverlapSorted(ext) != nil; got != want {
			t.Fatalf("sorted check = %v, byte overlap = %v (regions %v)", got, want, p.Regions)
		}
	})
}

// TestPoolValidateRefuses names each malformed geometry.
func TestPoolValidateRefuses(t *testing.T) {
	ok := Pool{Regions: []uint64{0x1000, 0x1000 + 4096}, BlockLen: 4096, Stride: 8192, Blocks: 4}
	if err := ok.Validate(); err != nil {
		t.Fatalf("interleaved K/V pool refused: %v", err)
	}
	cases := map[string]struct {
		p    Pool
		want string
	}{
		"no regions":    {Pool{BlockLen: 1, Stride: 1, Blocks: 1}, "no regions"},
		"zero block":    {Pool{Regions: []uint64{0}, Stride: 1, Blocks: 1}, "block length is 0"},
		"short stride":  {Pool{Regions: []uint64{0}, BlockLen: 8, Stride: 4, Blocks: 1}, "shorter"},
		"no blocks":     {Pool{Regions: []uint64{0}, BlockLen: 8, Stride: 8}, "blocks"},
		"too many":      {Pool{Regions: []uint64{0}, BlockLen: 1, Stride: 1, Blocks: MaxBlocks + 1}, "blocks"},
		"overflow":      {Pool{Regions: []uint64{1 << 63}, BlockLen: 1 << 20, Stride: 1 << 40, Blocks: 1 << 24}, "overflow"},
		"host device":   {Pool{Regions: []uint64{0}, BlockLen: 1, Stride: 1, Blocks: 1, Device: 2}, "device"},
		"unknown kind":  {Pool{Regions: []uint64{0}, BlockLen: 1, Stride: 1, Blocks: 1, Kind: 7}, "kind"},
		"solid overlap": {Pool{Regions: []uint64{0, 100}, BlockLen: 64, Stride: 64, Blocks: 2}, "overlap"},
	}
	for name, c := range cases {
		err := c.p.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate = %v, want an error mentioning %q", name, err, c.want)
		}
	}
}

// TestBlocksCheckRangeMatchesPieces checks CheckRange against looking at
// every piece of the range, and Piece's region-major numbering.
func TestBlocksCheckRangeMatchesPieces(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := Pool{Regions: []uint64{0, 1 << 20, 2 << 20}, BlockLen: 64, Stride: 128, Blocks: rapid.Uint64Range(1, 8).Draw(t, "blocks")}
		p.Regions = p.Regions[:rapid.IntRange(1, 3).Draw(t, "regions")]
		ids := rapid.SliceOfN(rapid.Uint32Range(0, 9), 0, 6).Draw(t, "ids")
		b := Blocks{Pool: p, IDs: ids}
		first := rapid.Uint64Range(0, 20).Draw(t, "first")
		count := rapid.Uint64Range(0, 20).Draw(t, "count")
		err := b.CheckRange(first, count)
		want := len(ids) > 0 && first+count <= b.Len()
		if want {
			for q := first; q < first+count; q++ {
				if uint64(ids[q%uint64(len(ids))]) >= p.Blocks {
					want = false
				}
			}
		}
		if (err == nil) != want {
			t.Fatalf("CheckRange(%d, %d) over ids %v, %d blocks = %v; per piece says ok=%v", first, count, ids, p.Blocks, err, want)
		}
		if err == nil {
			for q := first; q < first+count; q++ {
				r, j := int(q/uint64(len(ids))), q%uint64(len(ids))
				if got, w := b.Piece(q), p.Piece(r, ids[j]); got != w {
					t.Fatalf("piece %d = %v, want %v", q, got, w)
				}
			}
			if count > 0 {
				lo, hi := b.RegionsTouched(first, count)
				if lo != int(first/uint64(len(ids))) || hi != int((first+count-1)/uint64(len(ids)))+1 {
					t.Fatalf("RegionsTouched = %d..%d", lo, hi)
				}
			}
		}
	})
}

// TestBlockCopyCheckRegion refuses a copy whose pieces pass the region.
func TestBlockCopyCheckRegion(t *testing.T) {
	p := Pool{Regions: []uint64{0x10000}, BlockLen: 4096, Stride: 4096, Blocks: 16}
	c := BlockCopy{Blocks: Blocks{Pool: p, IDs: []uint32{3, 1, 2}}, First: 0, Count: 3, RegionOff: 4096}
	if err := c.Check(4 * 4096); err != nil {
		t.Fatalf("copy that fits refused: %v", err)
	}
	if err := c.Check(4*4096 - 1); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("copy one byte past the region: %v, want ErrOutOfBounds", err)
	}
	if got := c.Bytes(); got != 3*4096 {
		t.Fatalf("Bytes = %d", got)
	}
}

// TestCheckIDs checks CheckIDs against a map model on both of its paths
// (bitmap and sorted copy).
func TestCheckIDs(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		blocks := rapid.SampledFrom([]uint64{1, 7, 64, 65, 5000, 1 << 32}).Draw(t, "blocks")
		hi := uint32(min(blocks+2, 1<<32-1))
		ids := rapid.SliceOfN(rapid.Uint32Range(0, hi), 0, 50).Draw(t, "ids")
		unique := rapid.Bool().Draw(t, "unique")
		b := Blocks{Pool: Pool{Regions: []uint64{0}, BlockLen: 1, Stride: 1, Blocks: blocks}, IDs: ids}
		var wantErr error
		seen := map[uint32]bool{}
		for _, id := range ids {
			if uint64(id) >= blocks {
				wantErr = ErrOutOfBounds
				break
			}
		}
		if wantErr == nil && unique {
			for _, id := range ids {
				if seen[id] {
					wantErr = ErrDuplicateID
					break
				}
				seen[id] = true
			}
		}
		err := b.CheckIDs(unique)
		if (err == nil) != (wantErr == nil) || wantErr != nil && !errors.Is(err, wantErr) {
			t.Fatalf("CheckIDs(%v) of %v in %d blocks = %v, want %v", unique, ids, blocks, err, wantErr)
		}
	})
}
