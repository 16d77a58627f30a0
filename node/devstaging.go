package node

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/transfer"
)

// cudaStaging is the tcp engine's tcp.DeviceMemory over one CUDA context:
// one cuMemcpyDtoHAsync / cuMemcpyHtoDAsync per descriptor, queued back to
// back on a stream and waited for once per call (UCX's cuda-copy way), and
// page-locked staging buffers from cuMemHostAlloc. Each call takes a
// stream of its own from a free list (a stream per concurrent caller, at
// most one per staging buffer). It holds a retained primary context,
// released by Close.
type cudaStaging struct {
	c *cuda.Context

	mu      sync.Mutex
	streams []*cuda.Stream // free
}

// newCUDAStaging opens the driver and retains device dev's primary
// context.
func newCUDAStaging(lib *cuda.Lib, dev int) (*cudaStaging, error) {
	if lib == nil {
		return nil, fmt.Errorf("device staging: no driver: %w", cuda.ErrUnavailable)
	}
	drv, err := lib.Open()
	if err != nil {
		return nil, err
	}
	c, err := drv.Primary(dev)
	if err != nil {
		return nil, err
	}
	return &cudaStaging{c: c}, nil
}

// Kind returns transfer.CUDA.
func (*cudaStaging) Kind() transfer.MemKind { return transfer.CUDA }

// CopyToHost copies each device range src[i] into dst[i], one async copy
// each, and waits for them all.
func (s *cudaStaging) CopyToHost(dst [][]byte, src []uint64) error {
	return s.run(len(dst), func(st *cuda.Stream, i int) error {
		if len(dst[i]) == 0 {
			return nil
		}
		return st.CopyDtoH(uintptr(unsafe.Pointer(&dst[i][0])), cuda.DevicePtr(src[i]), uint64(len(dst[i])))
	})
}

// CopyToDevice copies each src[i] to device memory at dst[i], one async
// copy each, and waits for them all.
func (s *cudaStaging) CopyToDevice(dst []uint64, src [][]byte) error {
	return s.run(len(dst), func(st *cuda.Stream, i int) error {
		if len(src[i]) == 0 {
			return nil
		}
		return st.CopyHtoD(cuda.DevicePtr(dst[i]), uintptr(unsafe.Pointer(&src[i][0])), uint64(len(src[i])))
	})
}

// run queues n copies on a free stream and waits for the stream even when
// queuing failed part way, so no copy outlives the call. A stream whose
// wait failed is destroyed, not reused.
func (s *cudaStaging) run(n int, queue func(*cuda.Stream, int) error) error {
	s.mu.Lock()
	var st *cuda.Stream
	if k := len(s.streams); k > 0 {
		st, s.streams = s.streams[k-1], s.streams[:k-1]
	}
	s.mu.Unlock()
	if st == nil {
		var err error
		if st, err = s.c.NewStream(); err != nil {
			return err
		}
	}
	var qerr error
	for i := 0; i < n && qerr == nil; i++ {
		qerr = queue(st, i)
	}
	if err := st.Synchronize(); err != nil {
		_ = st.Destroy()
		return errors.Join(qerr, err)
	}
	s.mu.Lock()
	s.streams = append(s.streams, st)
	s.mu.Unlock()
	return qerr
}

// AllocStaging returns n bytes of page-locked host memory.
func (s *cudaStaging) AllocStaging(n int) ([]byte, error) {
	h, err := s.c.HostAlloc(uint64(n))
	if err != nil {
		return nil, err
	}
	return h.Bytes(), nil
}

// FreeStaging frees a buffer AllocStaging returned.
func (s *cudaStaging) FreeStaging(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return s.c.HostFree(cuda.HostMem{Host: uintptr(unsafe.Pointer(&b[0])), Len: uint64(len(b))})
}

// Close destroys the streams and releases the context (the engine calls
// it after every copy ended).
func (s *cudaStaging) Close() error {
	var errs []error
	for _, st := range s.streams {
		errs = append(errs, st.Destroy())
	}
	s.streams = nil
	return errors.Join(append(errs, s.c.Release())...)
}
