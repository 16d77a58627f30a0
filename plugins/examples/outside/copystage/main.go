// Command copystage is an example third-party stage plugin built on the
// bounce SDK alone (packages transfer, mem and plugins): one binary that
// serves a gather stage and a scatter stage doing plain memory copies.
//
// The host shares the memory each copy names with the plugin process (a
// memfd mapped at the same address) and adds it to reg before the first
// copy that uses it; the stage validates every run against reg and the
// region before a byte moves, as transfer.Gatherer requires.
package main

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/plugins"
	"github.com/bouncekv/bounce/transfer"
)

func main() {
	plugins.Serve(plugins.ServeOpts{
		Gatherer: func(_ string, opts map[string]string, reg *mem.Registry) (transfer.Gatherer, error) {
			s, err := newStage(opts, reg, true)
			if err != nil {
				return nil, err
			}
			return gatherer{s}, nil
		},
		Scatterer: func(_ string, opts map[string]string, reg *mem.Registry) (transfer.Scatterer, error) {
			s, err := newStage(opts, reg, false)
			if err != nil {
				return nil, err
			}
			return scatterer{s}, nil
		},
	})
}

type gatherer struct{ *stage }

func (g gatherer) Gather(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	return g.copy(region, runs)
}

type scatterer struct{ *stage }

func (s scatterer) Scatter(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	return s.copy(region, runs)
}

// stage copies between a region and run addresses on its own goroutines,
// at most len(slots) operations at once (beyond that, ErrBusy).
type stage struct {
	reg    *mem.Registry
	gather bool
	slots  chan struct{}
	wg     sync.WaitGroup
}

// newStage reads the options the host passes: copy_contexts (the bound
// on operations in flight, default 8) and copy_workers (ignored here).
func newStage(opts map[string]string, reg *mem.Registry, gather bool) (*stage, error) {
	contexts := 8
	for k, v := range opts {
		switch k {
		case "copy_contexts":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("copystage: copy_contexts %q: want a whole number >= 1", v)
			}
			contexts = n
		case "copy_workers":
		default:
			return nil, fmt.Errorf("copystage: unknown option %q; accepted: copy_contexts, copy_workers", k)
		}
	}
	return &stage{reg: reg, gather: gather, slots: make(chan struct{}, contexts)}, nil
}

// copy checks everything, then starts the copy and returns at once.
func (s *stage) copy(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	if region.Kind != transfer.Host {
		return nil, fmt.Errorf("copystage: region %v: host memory only: %w", region, transfer.ErrUnsupported)
	}
	regionRange, err := s.reg.Find(region.Addr, region.Len)
	if err != nil {
		return nil, fmt.Errorf("copystage: region %v: %w", region, err)
	}
	pins := []uint64{regionRange.Addr}
	for i, r := range runs {
		if r.Count == 0 || r.Len == 0 {
			continue
		}
		lo, hi, ok := r.RegionSpan()
		if !ok || hi > region.Len || lo > hi {
			return nil, fmt.Errorf("copystage: run %d leaves the region (%d bytes): %w", i, region.Len, transfer.ErrOutOfBounds)
		}
		for k := uint64(0); k < r.Count; k++ {
			d, err := s.reg.Find(r.Addr+k*r.AddrStride, r.Len)
			if err != nil {
				return nil, fmt.Errorf("copystage: run %d copy %d: %w", i, k, err)
			}
			if d.Addr != pins[len(pins)-1] {
				pins = append(pins, d.Addr)
			}
		}
		if _, _, ok := r.AddrSpan(); !ok {
			return nil, fmt.Errorf("copystage: run %d: address span overflows: %w", i, transfer.ErrOutOfBounds)
		}
	}
	select {
	case s.slots <- struct{}{}:
	default:
		return nil, fmt.Errorf("copystage: %d operations in flight: %w", cap(s.slots), transfer.ErrBusy)
	}
	// Pinned ranges cannot be deregistered while the copy runs.
	if err := s.reg.Pin(pins); err != nil {
		<-s.slots
		return nil, fmt.Errorf("copystage: %w", err)
	}
	o := &op{s: s, done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(o.done)
		defer s.reg.Unpin(pins)
		for _, r := range runs {
			for k := uint64(0); k < r.Count; k++ {
				reg := mem.Unsafe(region.Addr+r.RegionOff+k*r.RegionStride, r.Len)
				addr := mem.Unsafe(r.Addr+k*r.AddrStride, r.Len)
				if s.gather {
					copy(reg, addr)
				} else {
					copy(addr, reg)
				}
			}
		}
	}()
	return o, nil
}

// Close waits for copies in flight.
func (s *stage) Close() error {
	s.wg.Wait()
	return nil
}

// op is one copy: Done once its goroutine finished.
type op struct {
	s        *stage
	done     chan struct{}
	mu       sync.Mutex
	released bool
}

// Poll never blocks.
func (o *op) Poll() (transfer.Status, error) {
	select {
	case <-o.done:
		return transfer.Done, nil
	default:
		return transfer.Pending, nil
	}
}

// Release frees the op's slot once it is terminal.
func (o *op) Release() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.released {
		return fmt.Errorf("copystage: op already released")
	}
	select {
	case <-o.done:
	default:
		return fmt.Errorf("copystage: release of a pending op: %w", transfer.ErrInUse)
	}
	o.released = true
	<-o.s.slots
	return nil
}
