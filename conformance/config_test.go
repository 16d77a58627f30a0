package conformance

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestSizeFloors: whatever sizes are given, the result keeps every one of
// them and holds a size above 1 MiB and one above the fragment size (when
// that fits under maxSize), adding nothing that is not needed.
func TestSizeFloors(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sizes := rapid.SliceOfN(rapid.Uint64Range(1, maxSize), 1, 8).Draw(t, "sizes")
		frag := rapid.OneOf(rapid.Just(uint64(0)), rapid.Uint64Range(1, maxSize)).Draw(t, "frag")
		got := sizeFloors(sizes, frag)
		if !slices.Equal(got[:len(sizes)], sizes) {
			t.Fatalf("sizeFloors(%v, %d) = %v: the given sizes changed", sizes, frag, got)
		}
		maxOf := slices.Max(got)
		if maxOf <= largeFloor {
			t.Fatalf("sizeFloors(%v, %d) = %v: nothing above 1 MiB", sizes, frag, got)
		}
		if frag > 0 && frag+floorExtra <= maxSize && maxOf <= frag {
			t.Fatalf("sizeFloors(%v, %d) = %v: nothing above the fragment size", sizes, frag, got)
		}
		if added := len(got) - len(sizes); added > 0 && slices.Max(sizes) > max(largeFloor, frag) {
			t.Fatalf("sizeFloors(%v, %d) = %v: added %d sizes where none was needed", sizes, frag, got, added)
		}
	})
}

func TestDefaultsKeepLargeWrites(t *testing.T) {
	c, err := Config{Sizes: []uint64{1, 4097, 1 << 20}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.maxSize() <= largeFloor {
		t.Fatalf("--sizes 1,4097,1MiB runs %v: no write above 1 MiB", c.Sizes)
	}
}
