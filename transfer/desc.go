package transfer

import (
	"fmt"
	"unicode/utf8"
)

// MemKind says where the bytes of a descriptor live.
type MemKind uint8

const (
	// Host is ordinary process memory (mmap'd arenas, registered buffers).
	Host MemKind = iota
	// CUDA is device memory allocated through the CUDA driver.
	CUDA
)

// String returns "host" or "cuda".
func (k MemKind) String() string {
	switch k {
	case Host:
		return "host"
	case CUDA:
		return "cuda"
	default:
		return fmt.Sprintf("memkind(%d)", uint8(k))
	}
}

// Desc describes one contiguous piece of memory: Len bytes at Addr on Device.
// Device is the CUDA ordinal for CUDA memory and 0 for host memory.
type Desc struct {
	Addr   uint64
	Len    uint64
	Device int32
	Kind   MemKind
}

// End returns the address one past the last byte.
func (d Desc) End() uint64 { return d.Addr + d.Len }

// Contains reports whether [addr, addr+n) lies inside d, without overflow.
func (d Desc) Contains(addr, n uint64) bool {
	if addr < d.Addr {
		return false
	}
	off := addr - d.Addr
	return off <= d.Len && n <= d.Len-off
}

// String formats the descriptor for logs and errors.
func (d Desc) String() string {
	return fmt.Sprintf("%s:%d[%#x+%d]", d.Kind, d.Device, d.Addr, d.Len)
}

// Run is one coalesced copy between a contiguous region and scattered
// addresses. It stands for Count copies of Len bytes: copy i moves the bytes
// at region offset RegionOff+i*RegionStride to (or from) address
// Addr+i*AddrStride. A run with Count 1 is a single copy and its strides are
// ignored. Gather runs copy Addr -> region; scatter runs copy region -> Addr.
type Run struct {
	RegionOff    uint64
	Addr         uint64
	Len          uint64
	Count        uint64
	RegionStride uint64
	AddrStride   uint64
}

// Bytes returns the payload bytes the run moves (Len × Count).
func (r Run) Bytes() uint64 { return r.Len * r.Count }

// RegionSpan returns the smallest [start, end) range of region offsets the
// run touches, and false if computing it overflows.
func (r Run) RegionSpan() (start, end uint64, ok bool) {
	return span(r.RegionOff, r.RegionStride, r.Len, r.Count)
}

// AddrSpan returns the smallest [start, end) address range the run touches,
// and false if computing it overflows.
func (r Run) AddrSpan() (start, end uint64, ok bool) {
	return span(r.Addr, r.AddrStride, r.Len, r.Count)
}

func span(base, stride, n, count uint64) (uint64, uint64, bool) {
	if count == 0 {
		return base, base, true
	}
	last := count - 1
	if last != 0 && stride != 0 && last > (^uint64(0))/stride {
		return 0, 0, false
	}
	step := last * stride
	if count == 1 {
		step = 0
	}
	if base > ^uint64(0)-step {
		return 0, 0, false
	}
	lastStart := base + step
	if lastStart > ^uint64(0)-n {
		return 0, 0, false
	}
	return base, lastStart + n, true
}

// MaxNameLen is the longest agent name, in bytes.
const MaxNameLen = 255

// CheckName reports why s cannot be an agent's name: names are 1 to
// MaxNameLen bytes of UTF-8 without control characters, so they print
// safely in logs and errors.
func CheckName(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("empty name")
	case len(s) > MaxNameLen:
		return fmt.Errorf("name of %d bytes exceeds %d", len(s), MaxNameLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("name is not valid UTF-8")
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("name %q contains a control character", s)
		}
	}
	return nil
}
