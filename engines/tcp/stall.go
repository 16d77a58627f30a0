package tcp

import (
	"sync"
	"sync/atomic"
)

// stallGate holds the parts of writes before they go out while a stall is
// on (transfer.WriteStaller). The zero gate is open.
type stallGate struct {
	mu    sync.Mutex
	n     int                           // stalls not yet released
	block atomic.Pointer[chan struct{}] // nil while open; closed to reopen
}

// stall closes the gate until the returned release (idempotent) is
// called; nested stalls reopen it once every one was released.
func (g *stallGate) stall() (release func()) {
	g.mu.Lock()
	if g.n++; g.n == 1 {
		ch := make(chan struct{})
		g.block.Store(&ch)
	}
	g.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.n--; g.n == 0 {
				close(*g.block.Swap(nil))
			}
		})
	}
}

// wait returns at once while the gate is open; otherwise once it reopens
// or abort closes.
func (g *stallGate) wait(abort <-chan struct{}) {
	ch := g.block.Load()
	if ch == nil {
		return
	}
	select {
	case <-*ch:
	case <-abort:
	}
}

// StallWrites holds every part of a write that has not gone out yet, on
// every connection, until release is called (transfer.WriteStaller): such
// writes stay pending, and a connection given up meanwhile (ForgetPeer,
// Close, a broken connection) fails them with nothing of a held part sent.
// It is for tests (the conformance suite); the agent never calls it.
func (e *Engine) StallWrites() (release func(), err error) { return e.stalls.stall(), nil }
