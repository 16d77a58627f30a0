package cuda

import (
	"fmt"
	"unsafe"
)

// Stream is a CUDA stream of one context.
type Stream struct {
	c *Context
	h uintptr
}

// StreamNonBlocking is the flag of a stream that does not synchronise with
// the legacy default stream.
const StreamNonBlocking = 0x1

// NewStream creates a non-blocking stream.
func (c *Context) NewStream() (*Stream, error) {
	var h uintptr
	if err := c.call("cuStreamCreate", c.d.fn.streamCreate, uintptr(unsafe.Pointer(&h)), StreamNonBlocking); err != nil {
		return nil, err
	}
	return &Stream{c: c, h: h}, nil
}

// Handle returns the CUstream.
func (s *Stream) Handle() uintptr { return s.h }

// Destroy destroys the stream; work already queued still completes.
func (s *Stream) Destroy() error {
	return s.c.call("cuStreamDestroy", s.c.d.fn.streamDestroy, s.h)
}

// Synchronize waits for the stream's work. It blocks: never call it on a
// reactor goroutine.
func (s *Stream) Synchronize() error {
	return s.c.call("cuStreamSynchronize", s.c.d.fn.streamSynchronize, s.h)
}

// Query reports whether the stream's work is done, without blocking; a
// sticky device error is returned as an error.
func (s *Stream) Query() (bool, error) {
	switch r := s.c.callResult(s.c.d.fn.streamQuery, s.h); r {
	case Success:
		return true, nil
	case NotReady:
		return false, nil
	default:
		return false, s.c.d.check("cuStreamQuery", r)
	}
}

// CopyDtoD queues a copy of n bytes between device addresses.
func (s *Stream) CopyDtoD(dst, src DevicePtr, n uint64) error {
	return s.c.call("cuMemcpyDtoDAsync", s.c.d.fn.memcpyDtoDAsync, uintptr(dst), uintptr(src), uintptr(n), s.h)
}

// Copy queues a copy of n bytes between any two unified addresses (device
// memory, pinned host memory); the driver infers the direction.
func (s *Stream) Copy(dst, src DevicePtr, n uint64) error {
	return s.c.call("cuMemcpyAsync", s.c.d.fn.memcpyAsync, uintptr(dst), uintptr(src), uintptr(n), s.h)
}

// CopyHtoD queues a copy from pinned host address src to device address
// dst. src must stay valid until the copy completes.
func (s *Stream) CopyHtoD(dst DevicePtr, src uintptr, n uint64) error {
	return s.c.call("cuMemcpyHtoDAsync", s.c.d.fn.memcpyHtoDAsync, uintptr(dst), src, uintptr(n), s.h)
}

// CopyDtoH queues a copy from device address src to pinned host address
// dst.
func (s *Stream) CopyDtoH(dst uintptr, src DevicePtr, n uint64) error {
	return s.c.call("cuMemcpyDtoHAsync", s.c.d.fn.memcpyDtoHAsync, dst, uintptr(src), uintptr(n), s.h)
}

// CopyPeer queues a copy of n bytes from src in context srcCtx to dst in
// context dstCtx.
func (s *Stream) CopyPeer(dst DevicePtr, dstCtx *Context, src DevicePtr, srcCtx *Context, n uint64) error {
	return s.c.call("cuMemcpyPeerAsync", s.c.d.fn.memcpyPeerAsync, uintptr(dst), dstCtx.c, uintptr(src), srcCtx.c, uintptr(n), s.h)
}

// Memset queues setting n bytes at p to b.
func (s *Stream) Memset(p DevicePtr, b byte, n uint64) error {
	return s.c.call("cuMemsetD8Async", s.c.d.fn.memsetD8Async, uintptr(p), uintptr(b), uintptr(n), s.h)
}

// BatchCopy is the scratch space of one cuMemcpyBatchAsync call, in
// pinned host memory so the driver never reads Go memory: the dst, src and
// size arrays and one attribute record.
type BatchCopy struct {
	c    *Context
	mem  HostMem
	max  int
	dsts uintptr
	srcs uintptr
	lens uintptr
	attr uintptr
	idx  uintptr
	fail uintptr
}

// NewBatchCopy allocates room for up to max copies per call. It returns
// an error wrapping ErrUnavailable when the driver has no
// cuMemcpyBatchAsync.
func (c *Context) NewBatchCopy(max int) (*BatchCopy, error) {
	if !c.d.HasBatchCopy() {
		return nil, fmt.Errorf("%w: driver has no cuMemcpyBatchAsync", ErrUnavailable)
	}
	if max <= 0 {
		return nil, fmt.Errorf("cuda: batch of %d copies", max)
	}
	n := uint64(max)*24 + 64
	m, err := c.HostAlloc(n)
	if err != nil {
		return nil, err
	}
	b := &BatchCopy{c: c, mem: m, max: max}
	b.dsts = m.Host
	b.srcs = b.dsts + uintptr(8*max)
	b.lens = b.srcs + uintptr(8*max)
	b.attr = b.lens + uintptr(8*max)
	b.idx = b.attr + 24
	b.fail = b.idx + 8
	// CUmemcpyAttributes: srcAccessOrder STREAM (1), src and dst location
	// hints device 0 (type DEVICE = 1), flags 0.
	a := unsafe.Slice((*uint32)(ptr(b.attr)), 6)
	a[0], a[1], a[2], a[3], a[4], a[5] = 1, 1, uint32(c.dev), 1, uint32(c.dev), 0
	*(*uint64)(ptr(b.idx)) = 0
	return b, nil
}

// Max returns the most copies one Post takes.
func (b *BatchCopy) Max() int { return b.max }

// Set records copy i of the next Post.
func (b *BatchCopy) Set(i int, dst, src DevicePtr, n uint64) {
	*(*uint64)(ptr(b.dsts + uintptr(8*i))) = uint64(dst)
	*(*uint64)(ptr(b.srcs + uintptr(8*i))) = uint64(src)
	*(*uint64)(ptr(b.lens + uintptr(8*i))) = n
}

// Post queues the first n recorded copies on s as one batch.
func (b *BatchCopy) Post(s *Stream, n int) error {
	if n <= 0 || n > b.max {
		return fmt.Errorf("cuda: batch of %d copies outside [1, %d]", n, b.max)
	}
	return b.c.call("cuMemcpyBatchAsync", b.c.d.fn.memcpyBatchAsync,
		b.dsts, b.srcs, b.lens, uintptr(n), b.attr, b.idx, 1, b.fail, s.h)
}

// Free releases the scratch space.
func (b *BatchCopy) Free() error { return b.c.HostFree(b.mem) }

// Event is a CUDA event: recorded on a stream, it completes when the work
// queued before it has.
type Event struct {
	c *Context
	h uintptr
}

// Event flags (CU_EVENT_*).
const (
	EventDefault       = 0x0
	EventDisableTiming = 0x2
)

// NewEvent creates an event; timing is off unless timing is set.
func (c *Context) NewEvent(timing bool) (*Event, error) {
	flags := uintptr(EventDisableTiming)
	if timing {
		flags = EventDefault
	}
	var h uintptr
	if err := c.call("cuEventCreate", c.d.fn.eventCreate, uintptr(unsafe.Pointer(&h)), flags); err != nil {
		return nil, err
	}
	return &Event{c: c, h: h}, nil
}

// Record records the event on s.
func (e *Event) Record(s *Stream) error {
	return e.c.call("cuEventRecord", e.c.d.fn.eventRecord, e.h, s.h)
}

// Query reports whether the work before the event's last record is done,
// without blocking.
func (e *Event) Query() (bool, error) {
	switch r := e.c.callResult(e.c.d.fn.eventQuery, e.h); r {
	case Success:
		return true, nil
	case NotReady:
		return false, nil
	default:
		return false, e.c.d.check("cuEventQuery", r)
	}
}

// Synchronize waits for the event. It blocks.
func (e *Event) Synchronize() error {
	return e.c.call("cuEventSynchronize", e.c.d.fn.eventSynchronize, e.h)
}

// Elapsed returns the milliseconds between two completed timing events.
func (e *Event) Elapsed(start *Event) (float32, error) {
	var ms float32
	if err := e.c.call("cuEventElapsedTime", e.c.d.fn.eventElapsedTime, uintptr(unsafe.Pointer(&ms)), start.h, e.h); err != nil {
		return 0, err
	}
	return ms, nil
}

// Destroy destroys the event.
func (e *Event) Destroy() error {
	return e.c.call("cuEventDestroy", e.c.d.fn.eventDestroy, e.h)
}
