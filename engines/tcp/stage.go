package tcp

import (
	"errors"
	"fmt"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// Defaults of the device staging ring (Config.Device).
const (
	// DefaultStageBytes is the size of one staging buffer, and so the
	// most payload of a WRITE frame with device sources.
	DefaultStageBytes = 1 << 20
	// MaxStageBuffers bounds Config.StageBuffers.
	MaxStageBuffers = 256
)

// DeviceMemory is what the engine needs to carry one kind of device memory
// (CUDA memory) on the direct path, the way UCX's cuda-copy + tcp
// protocols do: synchronous copies between that memory and host bytes,
// and page-locked host buffers to stage them in. Every descriptor is
// copied on its own, once on each side (a device-to-host copy into a
// staging buffer before the bytes go out, a host-to-device copy out of one
// after they arrived): this is the per-descriptor baseline a user without
// bounce has, not a gather.
type DeviceMemory interface {
	// Kind is the memory kind the engine then carries (never Host).
	Kind() transfer.MemKind
	// CopyToHost copies the device memory at each src[i] into dst[i]
	// (len(dst[i]) bytes): one copy per descriptor, issued back to back
	// without waiting in between (cuMemcpyDtoHAsync on a stream), and
	// returns once every copy ended, failed or not, so no copy is still
	// running when it returns.
	CopyToHost(dst [][]byte, src []uint64) error
	// CopyToDevice copies each src[i] to the device memory at dst[i], one
	// copy per descriptor, and returns once every copy ended.
	CopyToDevice(dst []uint64, src [][]byte) error
	// AllocStaging returns n bytes of page-locked host memory.
	AllocStaging(n int) ([]byte, error)
	// FreeStaging frees a buffer AllocStaging returned.
	FreeStaging(b []byte) error
	// Close releases what the DeviceMemory holds (a CUDA context). The
	// engine calls it once, after freeing every staging buffer, at Close
	// (or when New fails).
	Close() error
}

// errStageClosed is a staging buffer asked for after the session to the
// peer stopped (ForgetPeer, the peer lost, the engine closing); nothing of
// the part went out.
var errStageClosed = fmt.Errorf("tcp: device staging: the session to the peer stopped before the part was staged: %w", transfer.ErrPeerLost)

// stager owns the page-locked staging buffers of an engine that carries
// device memory: two fixed rings (out for the session writers' device
// sources, in for the connection readers' device destinations, so a
// writer never waits on a buffer a reader needs to drain the socket it is
// blocked on), allocated by New and freed by Close only after every
// goroutine that could hold one has ended. A buffer is held by exactly one
// goroutine at a time, from get to put; nothing else touches it.
type stager struct {
	dev     DeviceMemory
	size    int
	out, in chan []byte
	all     [][]byte
	wait    time.Duration // the longest get waits for a buffer
	inShare *bodyBudget   // the in buffers each peer holds
}

func newStager(dev DeviceMemory, buffers, size int, wait time.Duration) (*stager, error) {
	s := &stager{dev: dev, size: size, out: make(chan []byte, buffers), in: make(chan []byte, buffers), wait: wait,
		inShare: newBodyBudget(int64(buffers), int64(max(1, buffers/2)))}
	for i := 0; i < 2*buffers; i++ {
		b, err := dev.AllocStaging(size)
		if err == nil && len(b) != size {
			err = fmt.Errorf("got %d bytes", len(b))
			_ = dev.FreeStaging(b)
		}
		if err != nil {
			_ = s.free()
			return nil, fmt.Errorf("tcp: allocate staging buffer %d of %d bytes: %w", i, size, err)
		}
		s.all = append(s.all, b)
		if i < buffers {
			s.out <- b
		} else {
			s.in <- b
		}
	}
	return s, nil
}

// get takes a buffer from ring, waiting at most s.wait, and not past done.
func (s *stager) get(ring chan []byte, done <-chan struct{}) ([]byte, error) {
	return s.getWithin(ring, done, s.wait)
}

// getWithin is get waiting at most wait.
func (s *stager) getWithin(ring chan []byte, done <-chan struct{}, wait time.Duration) ([]byte, error) {
	select {
	case b := <-ring:
		return b, nil
	default:
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case b := <-ring:
		return b, nil
	case <-done:
		return nil, errStageClosed
	case <-t.C:
		return nil, fmt.Errorf("tcp: no device staging buffer free within %v: %w", wait, transfer.ErrTimeout)
	}
}

func (s *stager) put(ring chan []byte, b []byte) { ring <- b }

// free frees every buffer. The caller proved that no goroutine holds one
// (Close after every session and reader ended, or New on failure).
func (s *stager) free() error {
	var errs []error
	for _, b := range s.all {
		if err := s.dev.FreeStaging(b); err != nil {
			errs = append(errs, err)
		}
	}
	s.all = nil
	if len(errs) > 0 {
		return fmt.Errorf("tcp: free staging buffers: %w", errors.Join(errs...))
	}
	return nil
}

// close frees every buffer, then closes the DeviceMemory (Engine.Close,
// after every goroutine that could hold a buffer ended).
func (s *stager) close() error {
	err := s.free()
	if cerr := s.dev.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("tcp: close device memory: %w", cerr))
	}
	return err
}

// devSeg is a device source of a part: bufs[idx] is filled from device
// address src (n bytes) just before the frame is written.
type devSeg struct {
	idx int
	src uint64
	n   uint64
}

// stageOut copies each device source of pt into buf, one copy per
// segment, and points pt's payload at the copies.
func (s *stager) stageOut(pt *part, buf []byte) error {
	dsts := make([][]byte, len(pt.dev))
	srcs := make([]uint64, len(pt.dev))
	off := uint64(0)
	for i, d := range pt.dev {
		dsts[i], srcs[i] = buf[off:off+d.n], d.src
		off += d.n
	}
	if err := s.dev.CopyToHost(dsts, srcs); err != nil {
		return fmt.Errorf("tcp: copy %d device sources to staging: %w: %w", len(srcs), err, transfer.ErrDeviceFault)
	}
	for i, d := range pt.dev {
		pt.bufs[d.idx] = dsts[i]
	}
	return nil
}

// inSeg is one piece of an incoming frame: host memory read in place
// (dev false) or device memory at addr read into staging and copied.
type inSeg struct {
	dev  bool
	addr uint64
	n    uint64
	host []byte
}

// landStaged reads a frame whose destinations include device memory: host
// destinations are read in place, device ones through the in ring's
// buffer, filled with as many segments (or pieces of one) as fit, then
// copied out, one copy per segment piece, before the buffer is refilled.
// A failed device copy does not stop the read (the frame is consumed so
// the connection stays usable); its error is returned as copyErr for the
// NACK. readErr is a broken connection.
//
// One peer holds at most its share of the in ring (inShare: half of it, at
// least one buffer); past it its frame waits like one that finds the ring
// empty, so a peer trickling many device frames cannot starve the others.
func (s *stager) landStaged(r *inReader, peer string, segs []inSeg, stop, done <-chan struct{}) (copyErr, readErr error) {
	var total uint64
	for _, sg := range segs {
		total += sg.n
	}
	// The frame's clock runs while we wait: wait at most half of what is
	// left of it, so that a refused part can still be read to its end and
	// only it fails, not the connection.
	wait := s.wait
	if !r.frameEnd.IsZero() {
		wait = min(wait, time.Until(r.frameEnd)/2)
	}
	wait = max(wait, 0)
	start := time.Now()
	if err := s.inShare.take(peer, 1, start.Add(wait), stop, done); err != nil {
		return fmt.Errorf("tcp: no device staging buffer free within %v for %q, which holds its share (%d of %d): %w", wait, peer, s.inShare.perPeer, cap(s.in), err), r.discard(total)
	}
	defer s.inShare.give(peer, 1)
	buf, err := s.getWithin(s.in, done, max(wait-time.Since(start), 0))
	if err != nil {
		return err, r.discard(total)
	}
	defer s.put(s.in, buf)
	var bufs, pieces [][]byte // what is read; the staged pieces of it
	var addrs []uint64        // each piece's device address
	used := 0
	flush := func() error {
		if err := r.fullv(bufs); err != nil {
			return err
		}
		if copyErr == nil && len(pieces) > 0 {
			if err := s.dev.CopyToDevice(addrs, pieces); err != nil {
				copyErr = fmt.Errorf("tcp: copy %d staged pieces to device memory: %w: %w", len(pieces), err, transfer.ErrDeviceFault)
			}
		}
		bufs, pieces, addrs, used = bufs[:0], pieces[:0], addrs[:0], 0
		return nil
	}
	for _, sg := range segs {
		if !sg.dev {
			bufs = append(bufs, sg.host)
			continue
		}
		for off := uint64(0); off < sg.n; {
			if used == len(buf) {
				if err := flush(); err != nil {
					return copyErr, err
				}
			}
			k := min(sg.n-off, uint64(len(buf)-used))
			b := buf[used : used+int(k)]
			bufs, pieces, addrs = append(bufs, b), append(pieces, b), append(addrs, sg.addr+off)
			used += int(k)
			off += k
		}
	}
	if len(bufs) > 0 {
		if err := flush(); err != nil {
			return copyErr, err
		}
	}
	return copyErr, nil
}
