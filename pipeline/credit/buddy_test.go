package credit

import (
	"sort"
	"testing"

	"pgregory.net/rapid"
)

func mustBuddy(t testing.TB, capacity, granule uint64) *Buddy {
	t.Helper()
	b, err := NewBuddy(capacity, granule)
	if err != nil {
		t.Fatalf("NewBuddy(%d, %d): %v", capacity, granule, err)
	}
	return b
}

func TestNewBuddyValidates(t *testing.T) {
	for _, tc := range []struct {
		name              string
		capacity, granule uint64
	}{
		{"zero granule", 1 << 20, 0},
		{"granule not power of two", 1 << 20, 3 << 10},
		{"capacity below granule", 1023, 1024},
		{"zero capacity", 0, 1},
	} {
		if b, err := NewBuddy(tc.capacity, tc.granule); err == nil {
			t.Errorf("%s: NewBuddy(%d, %d) = capacity %d, want error", tc.name, tc.capacity, tc.granule, b.Capacity())
		}
	}
}

func TestBuddyUsableCapacity(t *testing.T) {
	for _, tc := range []struct{ capacity, granule, want uint64 }{
		{1024, 1024, 1024},
		{1 << 20, 4096, 1 << 20},
		{(1 << 20) - 1, 4096, 1 << 19},
		{3 << 20, 1 << 20, 2 << 20},
		{7 << 20, 1 << 20, 4 << 20},
		{^uint64(0), 1, 1 << 63},
		{^uint64(0), 1 << 63, 1 << 63},
	} {
		b := mustBuddy(t, tc.capacity, tc.granule)
		if b.Capacity() != tc.want || b.FreeBytes() != tc.want {
			t.Errorf("NewBuddy(%d, %d): Capacity %d FreeBytes %d, want %d", tc.capacity, tc.granule, b.Capacity(), b.FreeBytes(), tc.want)
		}
		if err := b.Check(); err != nil {
			t.Error(err)
		}
	}
}

func TestBuddyBlockSize(t *testing.T) {
	b := mustBuddy(t, 1<<20, 4096)
	for _, tc := range []struct{ n, want uint64 }{
		{0, 0},
		{1, 4096},
		{4096, 4096},
		{4097, 8192},
		{8192, 8192},
		{12289, 16384},
		{1 << 19, 1 << 19},
		{1<<19 + 1, 1 << 20},
		{1 << 20, 1 << 20},
		{1<<20 + 1, 0},
		{^uint64(0), 0},
	} {
		if got := b.BlockSize(tc.n); got != tc.want {
			t.Errorf("BlockSize(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
}

func TestBuddySplitAndCoalesce(t *testing.T) {
	b := mustBuddy(t, 64, 8) // orders 0..3: 8, 16, 32, 64
	a, ok := b.Alloc(8)
	if !ok || a != 0 {
		t.Fatalf("Alloc(8) = %d, %v; want 0, true", a, ok)
	}
	// Splitting 64 left free blocks 8@8, 16@16, 32@32.
	if got := b.LargestFree(); got != 32 {
		t.Fatalf("LargestFree = %d, want 32", got)
	}
	c, ok := b.Alloc(20) // takes the 32 block
	if !ok || c != 32 {
		t.Fatalf("Alloc(20) = %d, %v; want 32, true", c, ok)
	}
	d, ok := b.Alloc(9) // the 16 block
	if !ok || d != 16 {
		t.Fatalf("Alloc(9) = %d, %v; want 16, true", d, ok)
	}
	e, ok := b.Alloc(1) // the last 8
	if !ok || e != 8 {
		t.Fatalf("Alloc(1) = %d, %v; want 8, true", e, ok)
	}
	if b.FreeBytes() != 0 || b.LargestFree() != 0 {
		t.Fatalf("full arena: FreeBytes %d LargestFree %d", b.FreeBytes(), b.LargestFree())
	}
	if _, ok := b.Alloc(1); ok {
		t.Fatal("Alloc on a full arena succeeded")
	}
	for _, off := range []uint64{a, d, c} {
		if _, ok := b.Free(off); !ok {
			t.Fatalf("Free(%d) failed", off)
		}
	}
	// 8@8 is still allocated, so nothing above 32@32 can form a 64 block.
	if got := b.LargestFree(); got != 32 {
		t.Fatalf("LargestFree = %d, want 32", got)
	}
	if size, ok := b.Free(e); !ok || size != 8 {
		t.Fatalf("Free(8) = %d, %v", size, ok)
	}
	if b.FreeBytes() != 64 || b.LargestFree() != 64 {
		t.Fatalf("after freeing all: FreeBytes %d LargestFree %d, want 64", b.FreeBytes(), b.LargestFree())
	}
	if err := b.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestBuddyBadFrees(t *testing.T) {
	b := mustBuddy(t, 1<<16, 1<<10)
	off, _ := b.Alloc(3000) // 4 KiB block
	for _, bad := range []uint64{off + 1024, 1 << 15, 1 << 16, ^uint64(0)} {
		if size, ok := b.Free(bad); ok {
			t.Errorf("Free(%#x) = %d, true; not the start of an allocated block", bad, size)
		}
	}
	if size, ok := b.Free(off); !ok || size != 4096 {
		t.Fatalf("Free(%#x) = %d, %v; want 4096, true", off, size, ok)
	}
	if _, ok := b.Free(off); ok {
		t.Fatal("double free reported ok")
	}
	if _, ok := b.Allocated(off); ok {
		t.Fatal("Allocated true after free")
	}
	if b.FreeBytes() != b.Capacity() {
		t.Fatalf("FreeBytes %d, want %d", b.FreeBytes(), b.Capacity())
	}
	if err := b.Check(); err != nil {
		t.Fatal(err)
	}
	for _, n := range []uint64{0, 1<<16 + 1, ^uint64(0)} {
		if _, ok := b.Alloc(n); ok {
			t.Errorf("Alloc(%d) succeeded", n)
		}
	}
}

// TestBuddyProperties drives random Alloc/Free sequences against a model of
// the allocated blocks.
func TestBuddyProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		granule := uint64(1) << rapid.IntRange(0, 12).Draw(t, "granuleShift")
		units := rapid.Uint64Range(1, 300).Draw(t, "units")
		extra := rapid.Uint64Range(0, granule-1).Draw(t, "extra")
		b, err := NewBuddy(granule*units+extra, granule)
		if err != nil {
			t.Fatal(err)
		}
		capacity := b.Capacity()
		if capacity&(capacity-1) != 0 || capacity%granule != 0 || capacity > granule*units+extra || 2*capacity <= granule*units {
			t.Fatalf("usable capacity %d for %d units of %d", capacity, units, granule)
		}
		live := map[uint64]uint64{} // off -> size
		var order []uint64          // offsets in allocation order, for picking
		steps := rapid.IntRange(1, 400).Draw(t, "steps")
		for range steps {
			if len(order) == 0 || rapid.IntRange(0, 9).Draw(t, "op") < 6 {
				n := rapid.OneOf(rapid.Uint64Range(1, 3*granule), rapid.Uint64Range(1, capacity+granule)).Draw(t, "n")
				want := b.BlockSize(n)
				fits := want != 0 && want <= b.LargestFree()
				off, ok := b.Alloc(n)
				if ok != fits {
					t.Fatalf("Alloc(%d) ok=%v, but BlockSize %d vs LargestFree %d says %v", n, ok, want, b.LargestFree(), fits)
				}
				if !ok {
					continue
				}
				if want < n || want < granule || want&(want-1) != 0 || (want > granule && want/2 >= n) {
					t.Fatalf("BlockSize(%d) = %d: not the smallest power-of-two block >= max(n, granule)", n, want)
				}
				if off%want != 0 || off+want > capacity {
					t.Fatalf("Alloc(%d) = %#x: block of %d not aligned or beyond capacity %d", n, off, want, capacity)
				}
				for o, sz := range live {
					if off < o+sz && o < off+want {
						t.Fatalf("Alloc(%d) = [%#x,+%d) overlaps live [%#x,+%d)", n, off, want, o, sz)
					}
				}
				if sz, ok := b.Allocated(off); !ok || sz != want {
					t.Fatalf("Allocated(%#x) = %d, %v; want %d", off, sz, ok, want)
				}
				live[off] = want
				order = append(order, off)
			} else {
				i := rapid.IntRange(0, len(order)-1).Draw(t, "victim")
				off := order[i]
				order = append(order[:i], order[i+1:]...)
				size, ok := b.Free(off)
				if !ok || size != live[off] {
					t.Fatalf("Free(%#x) = %d, %v; want %d", off, size, ok, live[off])
				}
				delete(live, off)
				if _, ok := b.Free(off); ok {
					t.Fatalf("double Free(%#x) reported ok", off)
				}
			}
			var used uint64
			for _, sz := range live {
				used += sz
			}
			if b.FreeBytes() != capacity-used {
				t.Fatalf("FreeBytes %d, want capacity %d - live %d", b.FreeBytes(), capacity, used)
			}
			if err := b.Check(); err != nil {
				t.Fatal(err)
			}
		}
		sort.Slice(order, func(i, j int) bool { return order[i] < order[j] })
		for _, off := range order {
			if _, ok := b.Free(off); !ok {
				t.Fatalf("final Free(%#x) failed", off)
			}
		}
		if b.FreeBytes() != capacity {
			t.Fatalf("after freeing all: FreeBytes %d, capacity %d (leak)", b.FreeBytes(), capacity)
		}
		if err := b.Check(); err != nil {
			t.Fatal(err)
		}
		if off, ok := b.Alloc(capacity); !ok || off != 0 {
			t.Fatalf("Alloc(capacity) after freeing all = %#x, %v: blocks did not coalesce", off, ok)
		}
	})
}
