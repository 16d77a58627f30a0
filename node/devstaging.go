package node

import (
	"fmt"
	"unsafe"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/transfer"
)

// cudaStaging is the tcp engine's tcp.DeviceMemory over one CUDA context:
// synchronous cuMemcpyDtoH / cuMemcpyHtoD per descriptor and page-locked
// staging buffers from cuMemHostAlloc. It holds a retained primary
// context, released by Close.
type cudaStaging struct {
	c *cuda.Context
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

// CopyToHost copies device memory at src into dst and waits.
func (s *cudaStaging) CopyToHost(dst []byte, src uint64) error {
	return s.c.CopyDtoH(dst, cuda.DevicePtr(src))
}

// CopyToDevice copies src to device memory at dst and waits.
func (s *cudaStaging) CopyToDevice(dst uint64, src []byte) error {
	return s.c.CopyHtoD(cuda.DevicePtr(dst), src)
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

// Close releases the context.
func (s *cudaStaging) Close() error { return s.c.Release() }
