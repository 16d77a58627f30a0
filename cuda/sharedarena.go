package cuda

import (
	"fmt"
	"sync"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// SharedPinnedArena is a pinned-host arena another process can map: a
// memfd arena (mem.NewArena, which a plugin engine maps by descriptor)
// page-locked and mapped for the device with cuMemHostRegister, so the
// CUDA stages reach it as they reach a PinnedArena.
type SharedPinnedArena struct {
	c    *Context
	a    *mem.Arena
	once sync.Once
}

// NewSharedPinnedArena allocates a memfd arena of size bytes and
// registers it with the driver. As for NewPinnedArena, its device address
// must be its host address.
func (c *Context) NewSharedPinnedArena(name string, size uint64) (*SharedPinnedArena, error) {
	a, err := mem.NewArena(name, size)
	if err != nil {
		return nil, fmt.Errorf("cuda: shared pinned arena: %w", err)
	}
	d := a.Desc()
	m, err := c.HostRegister(uintptr(d.Addr), d.Len)
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("cuda: shared pinned arena: %w", err)
	}
	if uint64(m.Dev) != d.Addr {
		_ = c.HostUnregister(uintptr(d.Addr))
		a.Close()
		return nil, fmt.Errorf("cuda: shared pinned arena: device address %#x differs from host address %#x (no unified addressing)", uint64(m.Dev), d.Addr)
	}
	return &SharedPinnedArena{c: c, a: a}, nil
}

// Desc describes the arena: host memory.
func (s *SharedPinnedArena) Desc() transfer.Desc { return s.a.Desc() }

// Bytes returns the arena's bytes.
func (s *SharedPinnedArena) Bytes() []byte { return s.a.Bytes() }

// Close unregisters and frees the memory; it is idempotent.
func (s *SharedPinnedArena) Close() error {
	var err error
	s.once.Do(func() {
		err = s.c.HostUnregister(uintptr(s.a.Desc().Addr))
		if cerr := s.a.Close(); err == nil {
			err = cerr
		}
	})
	return err
}
