// Package mem provides host memory for bounce: shareable mmap'd arenas,
// page-aligned buffers for users, and a registry that turns a descriptor into
// a bounds-checked byte slice.
//
// Memory from this package lives outside the Go heap, so its addresses are
// stable and may be handed to engines, stages and other processes.
package mem

import (
	"fmt"
	"math/rand/v2"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/bouncekv/bounce/transfer"
)

// Arena is host memory backed by a memfd and mapped shared, so another
// process (a plugin) can map the same bytes from its file descriptor.
type Arena struct {
	name string
	fd   int
	buf  []byte
	own  bool // mapped by mapShared (NewArena), not unix.Mmap (MapArena)
}

// NewArena creates a shared arena of size bytes named name (the name shows in
// /proc and helps debugging). size must be positive. The pages are faulted in
// now (MAP_POPULATE): an arena is registered once and then sits on the hot
// path, where a first-touch page fault costs microseconds per page. So an
// arena that does not fit in the memory available to this process (see
// ReadBudget; Reserve bytes kept spare) is refused rather than OOM-killed.
func NewArena(name string, size uint64) (*Arena, error) {
	if size == 0 {
		return nil, fmt.Errorf("mem: arena %q: size must be positive", name)
	}
	if b, err := ReadBudget(os.DirFS("/")); err == nil {
		if err := b.Fits(size, Reserve); err != nil {
			return nil, fmt.Errorf("mem: arena %q: %w", name, err)
		}
	}
	fd, err := unix.MemfdCreate("bounce-"+name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("mem: arena %q: memfd_create: %w", name, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mem: arena %q: ftruncate %d bytes: %w", name, size, err)
	}
	buf, err := mapShared(fd, size, unix.MAP_POPULATE)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mem: arena %q: mmap %d bytes: %w", name, size, err)
	}
	return &Arena{name: name, fd: fd, buf: buf, own: true}, nil
}

// Shared mappings are placed at a random address in [shareBase,
// shareBase+shareSpan), a window that Go processes (heap from 0xc000000000,
// other mappings just below the stack, race-detector shadow) leave unused,
// so a plugin process can map the same memfd at the same address without
// finding it taken. The address is only a hint: if it is taken the kernel
// places the mapping elsewhere.
const (
	shareBase  = 0x5000_0000_0000
	shareSpan  = 0x1000_0000_0000
	shareAlign = 2 << 20
)

// mapShared maps size bytes of fd MAP_SHARED (plus flags) read-write.
func mapShared(fd int, size uint64, flags int) ([]byte, error) {
	hint := uint64(shareBase) + rand.Uint64N(shareSpan/shareAlign)*shareAlign
	p, err := unix.MmapPtr(fd, 0, *(*unsafe.Pointer)(unsafe.Pointer(&hint)), uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|flags)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), size), nil
}

// unmapShared undoes mapShared.
func unmapShared(b []byte) error {
	return unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)))
}

// MapArena maps an arena another process created and passed by file
// descriptor. The returned arena owns fd.
func MapArena(name string, fd int, size uint64) (*Arena, error) {
	buf, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mem: map arena %q from fd %d: %w", name, fd, err)
	}
	return &Arena{name: name, fd: fd, buf: buf}, nil
}

// Desc describes the whole arena.
func (a *Arena) Desc() transfer.Desc { return DescOf(a.buf) }

// Bytes returns the arena's bytes.
func (a *Arena) Bytes() []byte { return a.buf }

// Fd returns the memfd backing the arena, for sharing with another process.
func (a *Arena) Fd() int { return a.fd }

// Close unmaps the arena and closes its descriptor. It is idempotent.
func (a *Arena) Close() error {
	if a.buf == nil {
		return nil
	}
	var err error
	if a.own {
		err = unmapShared(a.buf)
	} else {
		err = unix.Munmap(a.buf)
	}
	a.buf = nil
	if cerr := unix.Close(a.fd); err == nil {
		err = cerr
	}
	return err
}

// Buffer is page-aligned, zeroed host memory for user data (KV blocks). Like
// an Arena it is backed by a memfd and mapped shared, so a plugin process can
// map the same bytes (see package plugins); unlike an Arena its pages are
// faulted in on first touch.
type Buffer struct {
	fd  int
	buf []byte
}

// Alloc maps size bytes of zeroed, page-aligned memory backed by a fresh
// memfd (named "bounce-buf" in /proc/<pid>/maps) and mapped MAP_SHARED.
func Alloc(size uint64) (*Buffer, error) {
	if size == 0 {
		return nil, fmt.Errorf("mem: alloc: size must be positive")
	}
	fd, err := unix.MemfdCreate("bounce-buf", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("mem: alloc %d bytes: memfd_create: %w", size, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mem: alloc %d bytes: ftruncate: %w", size, err)
	}
	buf, err := mapShared(fd, size, 0)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mem: alloc %d bytes: mmap: %w", size, err)
	}
	return &Buffer{fd: fd, buf: buf}, nil
}

// Bytes returns the buffer's bytes.
func (b *Buffer) Bytes() []byte { return b.buf }

// Desc describes the whole buffer.
func (b *Buffer) Desc() transfer.Desc { return DescOf(b.buf) }

// Fd returns the memfd backing the buffer, for sharing with another process;
// -1 after Free.
func (b *Buffer) Fd() int {
	if b.buf == nil {
		return -1
	}
	return b.fd
}

// Free unmaps the buffer and closes its memfd. It is idempotent.
func (b *Buffer) Free() error {
	if b.buf == nil {
		return nil
	}
	err := unmapShared(b.buf)
	b.buf = nil
	if cerr := unix.Close(b.fd); err == nil {
		err = cerr
	}
	return err
}

// DescOf returns the host descriptor of b. b must stay alive (and, for Go
// heap memory, referenced) while the descriptor is in use.
func DescOf(b []byte) transfer.Desc {
	if len(b) == 0 {
		return transfer.Desc{Kind: transfer.Host}
	}
	return transfer.Desc{Addr: uint64(uintptr(unsafe.Pointer(&b[0]))), Len: uint64(len(b)), Kind: transfer.Host}
}

// Unsafe returns a slice over n bytes of host memory at addr. The caller must
// have proved that the range is live, registered memory; Registry.Slice is
// the checked way to get one.
func Unsafe(addr, n uint64) []byte {
	if n == 0 {
		return nil
	}
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n)
}
