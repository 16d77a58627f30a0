// Package ctxpool is the bounded free list of copy contexts that the host
// and CUDA copy engines (stages/hostcopy, stages/gpucopy) share: Get
// borrows a context without blocking, Put gives it back, Close ends the
// pool. The pool is guarded by its engine's own mutex, so an engine whose
// workers wait on that mutex (a sync.Cond over a queue of shares) sees the
// pool's closed flag and its own state change together: CloseWith runs the
// engine's part of closing under the same lock, and ClosedLocked reads the
// flag where the engine already holds it.
package ctxpool

import (
	"fmt"
	"sync"

	"github.com/bouncekv/bounce/transfer"
)

// Pool is a free list of contexts of type C. The zero value is not usable:
// make one with New. It is safe for concurrent use.
type Pool[C any] struct {
	name string

	mu     sync.Locker // the engine's; guards closed and free
	closed bool
	free   []C
}

// New returns a pool holding free, guarded by mu (the engine's mutex),
// whose errors name the engine name.
func New[C any](name string, mu sync.Locker, free []C) *Pool[C] {
	return &Pool[C]{name: name, mu: mu, free: free}
}

// Get borrows a free context. It never blocks: the error wraps ErrClosed
// after Close and ErrBusy when every context is borrowed.
func (p *Pool[C]) Get() (C, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var zero C
	if p.closed {
		return zero, fmt.Errorf("%s: submit: %w", p.name, transfer.ErrClosed)
	}
	n := len(p.free)
	if n == 0 {
		return zero, fmt.Errorf("%s: submit: all copy contexts in use: %w", p.name, transfer.ErrBusy)
	}
	c := p.free[n-1]
	var none C
	p.free[n-1] = none
	p.free = p.free[:n-1]
	return c, nil
}

// Put gives c back. After Close it keeps nothing and returns false: the
// caller then frees c itself.
func (p *Pool[C]) Put(c C) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.free = append(p.free, c)
	return true
}

// Idle returns the number of free contexts.
func (p *Pool[C]) Idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free)
}

// ClosedLocked reports whether Close has run; the caller holds the
// engine's mutex.
func (p *Pool[C]) ClosedLocked() bool { return p.closed }

// Close ends the pool and returns its free contexts (nil on a second
// call); a context borrowed now is freed by its Put's caller.
func (p *Pool[C]) Close() []C { return p.CloseWith(nil) }

// CloseWith is Close that runs fn (when not nil, on the first call only)
// under the engine's mutex, right after the pool is marked closed: the
// engine stops its own queued work there, atomically with the pool. fn
// must not call the pool's locking methods.
func (p *Pool[C]) CloseWith(fn func()) []C {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if fn != nil {
		fn()
	}
	free := p.free
	p.free = nil
	return free
}
