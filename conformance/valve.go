package conformance

import "sync"

// Valve is a helper for fixtures that offer EnginePair.StallWrites: the
// engine's data path calls Wait before it moves bytes, and the fixture's
// StallWrites is Valve.Stall. The zero Valve is open. It is safe for
// concurrent use.
type Valve struct {
	mu     sync.Mutex
	closed chan struct{} // nil while open; closed to reopen
}

// Stall closes the valve: Wait blocks from now on until the returned
// release is called (idempotent) or its abort channel closes.
func (v *Valve) Stall() (release func()) {
	v.mu.Lock()
	defer v.mu.Unlock()
	ch := v.closed
	if ch == nil {
		ch = make(chan struct{})
		v.closed = ch
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			v.mu.Lock()
			if v.closed == ch {
				v.closed = nil
			}
			v.mu.Unlock()
			close(ch)
		})
	}
}

// Wait returns at once while the valve is open; otherwise when it is
// released or abort closes (nil abort waits for the release only).
func (v *Valve) Wait(abort <-chan struct{}) {
	v.mu.Lock()
	ch := v.closed
	v.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-abort:
	}
}
