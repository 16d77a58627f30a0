package cuda

import (
	"fmt"
	"sync"

	"github.com/bouncekv/bounce/transfer"
)

// DeviceArena is one cuMemAlloc allocation used as a bounce arena.
type DeviceArena struct {
	c    *Context
	p    DevicePtr
	n    uint64
	once sync.Once
}

// NewDeviceArena allocates size bytes of device memory.
func (c *Context) NewDeviceArena(size uint64) (*DeviceArena, error) {
	p, err := c.MemAlloc(size)
	if err != nil {
		return nil, fmt.Errorf("cuda: device arena: %w", err)
	}
	return &DeviceArena{c: c, p: p, n: size}, nil
}

// Desc describes the arena: CUDA memory of the context's device.
func (a *DeviceArena) Desc() transfer.Desc {
	return transfer.Desc{Addr: uint64(a.p), Len: a.n, Kind: transfer.CUDA, Device: int32(a.c.dev)}
}

// Close frees the memory; it is idempotent.
func (a *DeviceArena) Close() error {
	var err error
	a.once.Do(func() { err = a.c.MemFree(a.p) })
	return err
}

// PinnedArena is pinned host memory mapped for the device (cuMemHostAlloc,
// portable and device-mapped) used as a bounce arena: a kernel on the GPU
// reads and writes it over PCIe, a host engine sends it.
type PinnedArena struct {
	c    *Context
	m    HostMem
	once sync.Once
}

// NewPinnedArena allocates size bytes of pinned, device-mapped host memory.
// Under unified addressing its device address is its host address; an
// arena whose mapping differs is refused (the stages address it by one
// number).
func (c *Context) NewPinnedArena(size uint64) (*PinnedArena, error) {
	m, err := c.HostAlloc(size)
	if err != nil {
		return nil, fmt.Errorf("cuda: pinned arena: %w", err)
	}
	if uint64(m.Dev) != uint64(m.Host) {
		_ = c.HostFree(m)
		return nil, fmt.Errorf("cuda: pinned arena: device address %#x differs from host address %#x (no unified addressing)", uint64(m.Dev), m.Host)
	}
	return &PinnedArena{c: c, m: m}, nil
}

// Desc describes the arena: host memory.
func (a *PinnedArena) Desc() transfer.Desc {
	return transfer.Desc{Addr: uint64(a.m.Host), Len: a.m.Len, Kind: transfer.Host}
}

// Bytes returns the arena's bytes.
func (a *PinnedArena) Bytes() []byte { return a.m.Bytes() }

// Close frees the memory; it is idempotent.
func (a *PinnedArena) Close() error {
	var err error
	a.once.Do(func() { err = a.c.HostFree(a.m) })
	return err
}
