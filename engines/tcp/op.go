package tcp

import (
	"errors"
	"fmt"
	"sync"

	"github.com/bouncekv/bounce/transfer"
)

// writeOp is the transfer.Op returned by PostWrite (and PostRead). It is terminal once every
// part is resolved: acknowledged, rejected, or failed after the goroutine
// writing it stopped touching the source memory.
type writeOp struct {
	e    *Engine
	peer string
	what string        // "write to" or "read from", for errors
	pins []uint64      // starts of the registered ranges the sources use
	done chan struct{} // closed when terminal

	mu       sync.Mutex
	pending  int
	status   transfer.Status
	err      error
	released bool
}

func newWriteOp(e *Engine, peer string, parts int, pins []uint64) *writeOp {
	o := &writeOp{e: e, peer: peer, what: "write to", pins: pins, pending: parts, done: make(chan struct{})}
	if parts == 0 {
		o.finish()
	}
	return o
}

// partDone resolves one part; err nil means acknowledged. The op keeps the
// first error, unless a later part failed without proof of quiescence: the
// op as a whole then says ErrNotQuiescent, whichever part ended first.
func (o *writeOp) partDone(err error) {
	o.mu.Lock()
	if err != nil && (o.err == nil || errors.Is(err, transfer.ErrNotQuiescent) && !errors.Is(o.err, transfer.ErrNotQuiescent)) {
		o.err = err
	}
	o.pending--
	last := o.pending == 0
	o.mu.Unlock()
	if last {
		o.finish()
	}
}

// finish unpins the source ranges, then publishes the terminal status, so a
// caller that sees Done can deregister the memory at once.
func (o *writeOp) finish() {
	o.e.reg.Unpin(o.pins)
	o.mu.Lock()
	o.status = transfer.Done
	if o.err != nil {
		o.status = transfer.Failed
	}
	o.mu.Unlock()
	close(o.done)
	if f := o.e.cfg.OnComplete; f != nil {
		f()
	}
}

// Done returns a channel closed once the op is terminal.
func (o *writeOp) Done() <-chan struct{} { return o.done }

// Poll reports the status; Failed comes with the first error of any part
// (one without proof of quiescence first, see partDone).
func (o *writeOp) Poll() (transfer.Status, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.status == transfer.Failed {
		return o.status, fmt.Errorf("tcp: %s %q: %w", o.what, o.peer, o.err)
	}
	return o.status, nil
}

// Release frees the operation; it fails with ErrInUse while pending.
func (o *writeOp) Release() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case !o.status.Terminal():
		return fmt.Errorf("tcp: release %s %q: still pending: %w", o.what, o.peer, transfer.ErrInUse)
	case o.released:
		return fmt.Errorf("tcp: release %s %q: already released", o.what, o.peer)
	}
	o.released = true
	return nil
}
