package credit

import (
	"fmt"
	"math/bits"
	"sort"
)

// none marks the end of an intrusive free list.
const none = ^uint64(0)

// Buddy is a power-of-two buddy allocator over byte offsets [0, Capacity()).
//
// Every block is granule<<k bytes for some order k and starts at a multiple
// of its own size. Free blocks of each order sit on an intrusive doubly
// linked list keyed by offset, and a bit mask records which lists are
// non-empty, so Alloc and Free cost O(log(Capacity/granule)) map operations
// and a failing Alloc costs no map operation at all. Freed buddies coalesce
// eagerly, so freeing everything restores one block of Capacity() bytes.
//
// A Buddy is not safe for concurrent use.
type Buddy struct {
	granule  uint64
	capacity uint64
	maxOrder int
	free     uint64
	mask     uint64   // bit k set when the free list of order k is non-empty
	heads    []uint64 // head offset of each order's free list, or none
	blocks   map[uint64]block
}

// block is the metadata of one block, free or allocated, keyed by offset.
type block struct {
	prev, next uint64 // free list links (free blocks only)
	order      uint8
	free       bool
}

// UsableCapacity is what a buddy allocator over capacity bytes with a
// power-of-two granule can hand out: the largest power-of-two multiple of
// granule that fits in capacity. It is 0 when granule is not a power of two
// or exceeds capacity.
func UsableCapacity(capacity, granule uint64) uint64 {
	if granule == 0 || granule&(granule-1) != 0 || capacity < granule {
		return 0
	}
	return granule << (bits.Len64(capacity/granule) - 1)
}

// NewBuddy returns an allocator over the largest power-of-two multiple of
// granule that fits in capacity: granule<<k for the largest k with
// granule<<k <= capacity. granule must be a power of two and capacity at
// least granule.
func NewBuddy(capacity, granule uint64) (*Buddy, error) {
	if granule == 0 || granule&(granule-1) != 0 {
		return nil, fmt.Errorf("credit: buddy granule %d: must be a power of two", granule)
	}
	if capacity < granule {
		return nil, fmt.Errorf("credit: buddy capacity %d: smaller than granule %d", capacity, granule)
	}
	maxOrder := bits.Len64(capacity/granule) - 1
	b := &Buddy{
		granule:  granule,
		capacity: UsableCapacity(capacity, granule),
		maxOrder: maxOrder,
		heads:    make([]uint64, maxOrder+1),
		blocks:   make(map[uint64]block),
	}
	for i := range b.heads {
		b.heads[i] = none
	}
	b.push(0, maxOrder)
	b.free = b.capacity
	return b, nil
}

// Capacity returns the usable bytes: a power-of-two multiple of the granule.
func (b *Buddy) Capacity() uint64 { return b.capacity }

// Granule returns the smallest block size.
func (b *Buddy) Granule() uint64 { return b.granule }

// FreeBytes returns the bytes not covered by an allocated block.
func (b *Buddy) FreeBytes() uint64 { return b.free }

// LargestFree returns the size of the largest free block (0 when full): the
// largest n for which Alloc(n) succeeds right now.
func (b *Buddy) LargestFree() uint64 {
	if b.mask == 0 {
		return 0
	}
	return b.granule << b.largestOrder()
}

// BlockSize returns the block Alloc(n) would take: max(granule,
// nextPow2(n)). It returns 0 when no Alloc(n) can ever succeed (n == 0 or
// n > Capacity()).
func (b *Buddy) BlockSize(n uint64) uint64 {
	if n == 0 || n > b.capacity {
		return 0
	}
	return b.granule << b.orderOf(n)
}

// Alloc takes a block of BlockSize(n) bytes and returns its offset. ok is
// false when n is 0 or no free block is large enough; that is backpressure,
// not an error.
func (b *Buddy) Alloc(n uint64) (off uint64, ok bool) {
	if n == 0 || n > b.capacity {
		return 0, false
	}
	o := b.orderOf(n)
	avail := b.mask >> uint(o)
	if avail == 0 {
		return 0, false
	}
	j := o + bits.TrailingZeros64(avail)
	off = b.heads[j]
	b.unlink(off, b.blocks[off])
	for j > o {
		j--
		b.push(off+b.granule<<uint(j), j)
	}
	b.blocks[off] = block{prev: none, next: none, order: uint8(o)}
	b.free -= b.granule << uint(o)
	return off, true
}

// Free releases the block starting at off, coalescing it with free buddies,
// and returns its size. ok is false, and nothing changes, when off is not
// the start of an allocated block (a double free included).
func (b *Buddy) Free(off uint64) (size uint64, ok bool) {
	blk, found := b.blocks[off]
	if !found || blk.free {
		return 0, false
	}
	o := int(blk.order)
	size = b.granule << uint(o)
	b.free += size
	for o < b.maxOrder {
		bud := off ^ (b.granule << uint(o))
		bb, found := b.blocks[bud]
		if !found || !bb.free || int(bb.order) != o {
			break
		}
		b.unlink(bud, bb)
		if bud < off {
			delete(b.blocks, off)
			off = bud
		} else {
			delete(b.blocks, bud)
		}
		o++
	}
	b.push(off, o)
	return size, true
}

// Allocated returns the size of the allocated block starting at off, and
// false when off does not start an allocated block.
func (b *Buddy) Allocated(off uint64) (size uint64, ok bool) {
	blk, found := b.blocks[off]
	if !found || blk.free {
		return 0, false
	}
	return b.granule << blk.order, true
}

// Blocks calls fn for every allocated block in ascending offset order.
func (b *Buddy) Blocks(fn func(off, size uint64)) {
	offs := make([]uint64, 0, len(b.blocks))
	for off, blk := range b.blocks {
		if !blk.free {
			offs = append(offs, off)
		}
	}
	sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
	for _, off := range offs {
		fn(off, b.granule<<b.blocks[off].order)
	}
}

// Check verifies the allocator's internal invariants: free and allocated
// blocks tile [0, Capacity()) exactly, each block is aligned to its size,
// the free lists and their mask agree with the block table, no two free
// buddies are left uncoalesced, and FreeBytes matches. It is meant for tests.
func (b *Buddy) Check() error {
	onList := 0
	for o, head := range b.heads {
		if (head != none) != (b.mask&(1<<uint(o)) != 0) {
			return fmt.Errorf("credit: buddy: order %d: mask bit disagrees with list head %#x", o, head)
		}
		prev := none
		for off := head; off != none; {
			blk, found := b.blocks[off]
			switch {
			case !found:
				return fmt.Errorf("credit: buddy: order %d list names unknown block %#x", o, off)
			case !blk.free || int(blk.order) != o:
				return fmt.Errorf("credit: buddy: order %d list holds block %#x (free=%v order=%d)", o, off, blk.free, blk.order)
			case blk.prev != prev:
				return fmt.Errorf("credit: buddy: order %d list: block %#x prev %#x, want %#x", o, off, blk.prev, prev)
			}
			onList++
			if onList > len(b.blocks) {
				return fmt.Errorf("credit: buddy: order %d free list has a cycle", o)
			}
			prev, off = off, blk.next
		}
	}
	offs := make([]uint64, 0, len(b.blocks))
	free, nfree := uint64(0), 0
	for off, blk := range b.blocks {
		offs = append(offs, off)
		if int(blk.order) > b.maxOrder {
			return fmt.Errorf("credit: buddy: block %#x has order %d > max %d", off, blk.order, b.maxOrder)
		}
		size := b.granule << blk.order
		if off%size != 0 {
			return fmt.Errorf("credit: buddy: block %#x of %d bytes is not aligned to its size", off, size)
		}
		if blk.free {
			nfree++
			free += size
			if int(blk.order) < b.maxOrder {
				if bb, found := b.blocks[off^size]; found && bb.free && bb.order == blk.order {
					return fmt.Errorf("credit: buddy: free buddies %#x and %#x of %d bytes not coalesced", off, off^size, size)
				}
			}
		}
	}
	if nfree != onList {
		return fmt.Errorf("credit: buddy: %d free blocks but %d on free lists", nfree, onList)
	}
	if free != b.free {
		return fmt.Errorf("credit: buddy: free blocks sum to %d bytes, FreeBytes says %d", free, b.free)
	}
	sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
	next := uint64(0)
	for _, off := range offs {
		if off != next {
			return fmt.Errorf("credit: buddy: block at %#x, want one at %#x (gap or overlap)", off, next)
		}
		next = off + b.granule<<b.blocks[off].order
	}
	if next != b.capacity {
		return fmt.Errorf("credit: buddy: blocks end at %#x, capacity %#x", next, b.capacity)
	}
	return nil
}

// orderOf returns the order of the block for n bytes; 0 < n <= capacity.
func (b *Buddy) orderOf(n uint64) int {
	if n <= b.granule {
		return 0
	}
	units := (n-1)/b.granule + 1
	return bits.Len64(units - 1)
}

// largestOrder returns the order of the largest free block, or -1.
func (b *Buddy) largestOrder() int { return bits.Len64(b.mask) - 1 }

// push puts a free block of order o at the head of its list.
func (b *Buddy) push(off uint64, o int) {
	head := b.heads[o]
	if head != none {
		hb := b.blocks[head]
		hb.prev = off
		b.blocks[head] = hb
	}
	b.blocks[off] = block{prev: none, next: head, order: uint8(o), free: true}
	b.heads[o] = off
	b.mask |= 1 << uint(o)
}

// unlink takes the free block blk at off off its list; the caller then
// overwrites or deletes its table entry.
func (b *Buddy) unlink(off uint64, blk block) {
	o := int(blk.order)
	if blk.prev != none {
		pb := b.blocks[blk.prev]
		pb.next = blk.next
		b.blocks[blk.prev] = pb
	} else {
		b.heads[o] = blk.next
	}
	if blk.next != none {
		nb := b.blocks[blk.next]
		nb.prev = blk.prev
		b.blocks[blk.next] = nb
	}
	if b.heads[o] == none {
		b.mask &^= 1 << uint(o)
	}
}
