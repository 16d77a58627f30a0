package driver

import (
	"fmt"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// Buffer is memory a workload moves from or into: host memory, or device
// memory the workload reaches through copies. Offsets are from Desc().Addr.
type Buffer interface {
	Desc() transfer.Desc
	// WriteAt copies p into the buffer at off.
	WriteAt(p []byte, off uint64) error
	// ReadAt copies len(p) bytes of the buffer at off into p.
	ReadAt(p []byte, off uint64) error
	// Clear zeroes the buffer.
	Clear() error
	Free() error
}

// HostBytes returns b's bytes when b is host memory the process can
// address (filled and checked in place), else nil.
func HostBytes(b Buffer) []byte {
	if h, ok := b.(hostBuffer); ok {
		return h.b.Bytes()
	}
	return nil
}

// AllocHost allocates n bytes of host memory (mem.Alloc).
func AllocHost(n uint64) (Buffer, error) {
	b, err := mem.Alloc(n)
	if err != nil {
		return nil, err
	}
	return hostBuffer{b}, nil
}

type hostBuffer struct{ b *mem.Buffer }

func (h hostBuffer) Desc() transfer.Desc { return h.b.Desc() }
func (h hostBuffer) Free() error         { return h.b.Free() }
func (h hostBuffer) Clear() error        { clear(h.b.Bytes()); return nil }

func (h hostBuffer) WriteAt(p []byte, off uint64) error {
	s, err := span(h.b.Desc(), off, len(p))
	if err == nil {
		copy(h.b.Bytes()[s:], p)
	}
	return err
}

func (h hostBuffer) ReadAt(p []byte, off uint64) error {
	s, err := span(h.b.Desc(), off, len(p))
	if err == nil {
		copy(p, h.b.Bytes()[s:])
	}
	return err
}

// AllocDevice allocates n bytes of device memory on c (cuMemAlloc), zeroed.
func AllocDevice(c *cuda.Context, n uint64) (Buffer, error) {
	p, err := c.MemAlloc(n)
	if err != nil {
		return nil, fmt.Errorf("driver: device buffer: %w", err)
	}
	d := &deviceBuffer{c: c, p: p, n: n}
	if err := d.Clear(); err != nil {
		_ = c.MemFree(p)
		return nil, err
	}
	return d, nil
}

type deviceBuffer struct {
	c *cuda.Context
	p cuda.DevicePtr
	n uint64
}

func (d *deviceBuffer) Desc() transfer.Desc {
	return transfer.Desc{Addr: uint64(d.p), Len: d.n, Kind: transfer.CUDA, Device: int32(d.c.Device())}
}

func (d *deviceBuffer) Free() error  { return d.c.MemFree(d.p) }
func (d *deviceBuffer) Clear() error { return d.c.Memset(d.p, 0, d.n) }

func (d *deviceBuffer) WriteAt(p []byte, off uint64) error {
	if _, err := span(d.Desc(), off, len(p)); err != nil {
		return err
	}
	return d.c.CopyHtoD(d.p+cuda.DevicePtr(off), p)
}

func (d *deviceBuffer) ReadAt(p []byte, off uint64) error {
	if _, err := span(d.Desc(), off, len(p)); err != nil {
		return err
	}
	return d.c.CopyDtoH(p, d.p+cuda.DevicePtr(off))
}

// span checks [off, off+n) lies in d.
func span(d transfer.Desc, off uint64, n int) (uint64, error) {
	if off > d.Len || uint64(n) > d.Len-off {
		return 0, fmt.Errorf("driver: [%d+%d] outside the %d-byte buffer: %w", off, n, d.Len, transfer.ErrOutOfBounds)
	}
	return off, nil
}
