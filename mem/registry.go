package mem

import (
	"fmt"
	"sort"
	"sync"

	"github.com/bouncekv/bounce/transfer"
)

// Registry is a set of registered memory ranges: host memory, and CUDA
// device memory (under unified addressing a device range never overlaps a
// host one, so both share one address-ordered list). Find and Slice resolve
// host ranges only; a device range is found (bounds-checked, never sliced)
// by FindKind. A range pinned by a copy in flight cannot be removed. It is
// safe for concurrent use.
type Registry struct {
	mu     sync.RWMutex
	ranges []transfer.Desc   // sorted by Addr, non-overlapping
	pins   map[uint64]int    // pin count by range Addr
	gens   map[uint64]uint64 // registration number by range Addr
	next   uint64
}

// Add registers d. Zero-length and overlapping ranges, memory kinds other
// than Host and CUDA, and host ranges with a device number are errors.
func (r *Registry) Add(d transfer.Desc) error {
	if d.Kind != transfer.Host && d.Kind != transfer.CUDA {
		return fmt.Errorf("mem: register %v: unknown memory kind: %w", d, transfer.ErrUnsupported)
	}
	if d.Kind == transfer.Host && d.Device != 0 {
		return fmt.Errorf("mem: register %v: host memory has device 0: %w", d, transfer.ErrUnsupported)
	}
	if d.Len == 0 || d.Addr+d.Len < d.Addr {
		return fmt.Errorf("mem: register %v: empty or wrapping range: %w", d, transfer.ErrOutOfBounds)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	i := r.search(d.Addr)
	if i < len(r.ranges) && r.ranges[i].Addr < d.End() {
		if r.ranges[i] == d {
			return nil
		}
		return fmt.Errorf("mem: register %v: overlaps %v", d, r.ranges[i])
	}
	if i > 0 && r.ranges[i-1].End() > d.Addr {
		return fmt.Errorf("mem: register %v: overlaps %v", d, r.ranges[i-1])
	}
	r.ranges = append(r.ranges, transfer.Desc{})
	copy(r.ranges[i+1:], r.ranges[i:])
	r.ranges[i] = d
	if r.gens == nil {
		r.gens = make(map[uint64]uint64)
	}
	r.next++
	r.gens[d.Addr] = r.next
	return nil
}

// CheckRanges checks a list of ranges as a peer advertises them: each
// non-empty and not wrapping around the address space, in ascending order,
// none overlapping the next. Metadata decoders use it on untrusted input.
func CheckRanges(ranges []transfer.Desc) error {
	for i, d := range ranges {
		if d.Len == 0 || d.Addr+d.Len < d.Addr {
			return fmt.Errorf("range %d %v is empty or wraps", i, d)
		}
		if i > 0 && ranges[i-1].End() > d.Addr {
			return fmt.Errorf("range %d %v is unsorted or overlaps %v", i, d, ranges[i-1])
		}
	}
	return nil
}

// Remove unregisters exactly d. It returns an error wrapping ErrInUse while
// d is pinned: an operation in flight still reads or writes it.
func (r *Registry) Remove(d transfer.Desc) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, x := range r.ranges {
		if x.Addr == d.Addr && x.Len == d.Len {
			if n := r.pins[x.Addr]; n > 0 {
				return fmt.Errorf("mem: deregister %v: %d operations in flight use it: %w", d, n, transfer.ErrInUse)
			}
			r.ranges = append(r.ranges[:i], r.ranges[i+1:]...)
			delete(r.gens, x.Addr)
			return nil
		}
	}
	return fmt.Errorf("mem: deregister %v: %w", d, transfer.ErrNotRegistered)
}

// Pin marks the registered ranges that start at starts (as Find returned
// them) as in use by one operation, once per entry, so Remove refuses them
// until Unpin. When
// one of them is no longer registered it pins nothing and returns an error
// wrapping ErrNotRegistered.
func (r *Registry) Pin(starts []uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range starts {
		if i := r.search(a); i == len(r.ranges) || r.ranges[i].Addr != a {
			return fmt.Errorf("mem: pin %#x: range deregistered meanwhile: %w", a, transfer.ErrNotRegistered)
		}
	}
	if r.pins == nil {
		r.pins = make(map[uint64]int)
	}
	for _, a := range starts {
		r.pins[a]++
	}
	return nil
}

// Pinned returns the number of pins held over all ranges: 0 once every
// operation that pinned memory has ended.
func (r *Registry) Pinned() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	n := 0
	for _, c := range r.pins {
		n += c
	}
	return n
}

// search returns the index of the first range starting at or after a.
func (r *Registry) search(a uint64) int {
	return sort.Search(len(r.ranges), func(i int) bool { return r.ranges[i].Addr >= a })
}

// Unpin releases what one Pin(starts) took.
func (r *Registry) Unpin(starts []uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range starts {
		if r.pins[a] <= 1 {
			delete(r.pins, a)
		} else {
			r.pins[a]--
		}
	}
}

// Find returns the registered host range holding [addr, addr+n). Bytes
// in a registered device range are an error wrapping ErrUnsupported: a
// caller of Find dereferences host addresses.
func (r *Registry) Find(addr, n uint64) (transfer.Desc, error) {
	return r.FindKind(transfer.Host, 0, addr, n)
}

// FindKind returns the registered range holding [addr, addr+n), which must
// be memory of kind on device (else an error wrapping ErrUnsupported).
func (r *Registry) FindKind(kind transfer.MemKind, device int32, addr, n uint64) (transfer.Desc, error) {
	d, err := r.FindAny(addr, n)
	if err != nil {
		return d, err
	}
	if d.Kind != kind || d.Device != device {
		return transfer.Desc{}, fmt.Errorf("mem: [%#x+%d] lies in %v, not %s memory of device %d: %w", addr, n, d, kind, device, transfer.ErrUnsupported)
	}
	return d, nil
}

// FindAny returns the registered range of any kind holding [addr, addr+n).
func (r *Registry) FindAny(addr, n uint64) (transfer.Desc, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	d, err := FindRange(r.ranges, addr, n)
	if err != nil {
		return d, fmt.Errorf("mem: %w", err)
	}
	return d, nil
}

// Lookup is Find that also returns the range's registration number, unique
// per Add: a range removed and registered again (perhaps other memory at
// the same address) gets a new one. Code that caches something per
// registered range (a plugin's mapping of it) compares numbers.
func (r *Registry) Lookup(addr, n uint64) (transfer.Desc, uint64, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	d, err := FindRange(r.ranges, addr, n)
	if err != nil {
		return d, 0, fmt.Errorf("mem: %w", err)
	}
	return d, r.gens[d.Addr], nil
}

// FindRange returns the range of sorted, non-overlapping ranges (see
// CheckRanges) that holds [addr, addr+n). A range past every registration
// is ErrNotRegistered; one that starts inside a range but runs past its end
// is ErrOutOfBounds.
func FindRange(ranges []transfer.Desc, addr, n uint64) (transfer.Desc, error) {
	i := sort.Search(len(ranges), func(i int) bool { return ranges[i].Addr > addr })
	if i == 0 {
		return transfer.Desc{}, fmt.Errorf("[%#x+%d]: %w", addr, n, transfer.ErrNotRegistered)
	}
	d := ranges[i-1]
	if !d.Contains(addr, n) {
		if addr >= d.End() {
			return transfer.Desc{}, fmt.Errorf("[%#x+%d]: %w", addr, n, transfer.ErrNotRegistered)
		}
		return transfer.Desc{}, fmt.Errorf("[%#x+%d] exceeds registered %v: %w", addr, n, d, transfer.ErrOutOfBounds)
	}
	return d, nil
}

// Slice returns the bytes of [addr, addr+n) after checking that they lie in
// one registered range.
func (r *Registry) Slice(addr, n uint64) ([]byte, error) {
	if _, err := r.Find(addr, n); err != nil {
		return nil, err
	}
	return Unsafe(addr, n), nil
}

// Ranges returns a copy of the registered ranges in address order.
func (r *Registry) Ranges() []transfer.Desc {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return append([]transfer.Desc(nil), r.ranges...)
}

// CheckWrite makes the checks of one write op that every engine writing
// between registered host ranges makes before it looks at the destination
// in the peer's ranges: both sides are host memory (else an error wrapping
// transfer.ErrUnsupported), the lengths are equal (else one wrapping
// transfer.ErrOutOfBounds) and, unless the op is empty, the source lies in
// one range of own (else Find's error). It returns that range; for an empty
// op, which moves nothing and needs no further check, a zero Desc.
func CheckWrite(own *Registry, op transfer.WriteOp) (transfer.Desc, error) {
	if op.Src.Kind != transfer.Host || op.Dst.Kind != transfer.Host {
		return transfer.Desc{}, fmt.Errorf("only host memory: %w", transfer.ErrUnsupported)
	}
	if op.Src.Len != op.Dst.Len {
		return transfer.Desc{}, fmt.Errorf("source and destination lengths differ: %w", transfer.ErrOutOfBounds)
	}
	if op.Src.Len == 0 {
		return transfer.Desc{}, nil
	}
	return own.Find(op.Src.Addr, op.Src.Len)
}
