package conformance

import (
	"fmt"
	"unsafe"

	"github.com/bouncekv/bounce/transfer"
)

// Memory is the memory a fixture's rules move bytes in. The zero value is
// host memory (from the fixture's Alloc, or mem.Alloc). A fixture over an
// implementation that touches device memory names it here; the suite then
// labels every descriptor it builds with Kind and Device, so registration,
// routing and the copies themselves see that kind.
type Memory struct {
	// Kind and Device label the suite's descriptors.
	Kind   transfer.MemKind
	Device int32
	// Alloc provides the buffers, replacing the fixture's Alloc. The suite
	// fills and checks them through the slice, so memory of another kind
	// must also be mapped in this process (CUDA managed memory is).
	Alloc AllocFunc
	// Unavailable, when not empty, says why memory of this kind cannot be
	// had here (no GPU, no driver): every rule is then skipped with that
	// reason in its result.
	Unavailable string
}

// String names the memory in results: "host", "cuda:0".
func (m Memory) String() string {
	if m.Kind == transfer.Host {
		return m.Kind.String()
	}
	return fmt.Sprintf("%s:%d", m.Kind, m.Device)
}

// desc is mem.DescOf for the rule's memory: b labelled with its kind and
// device.
func (c *rc) desc(b []byte) transfer.Desc {
	d := transfer.Desc{Kind: c.memory.Kind, Device: c.memory.Device}
	if len(b) > 0 {
		d.Addr, d.Len = uint64(uintptr(unsafe.Pointer(&b[0]))), uint64(len(b))
	}
	return d
}
