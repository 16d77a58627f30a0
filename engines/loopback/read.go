package loopback

import (
	"fmt"
	"slices"

	"github.com/bouncekv/bounce/engines/internal/writeset"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// Reads (transfer.Reader, transfer.ReadGuarded): a read copies the
// holder's memory into the reader's on a goroutine of the reader, after
// asking the holder's read guard (with no guard installed the holder serves
// none). A read is marked asking while its guard is asked and copying
// while it copies, under the fabric's lock, so FenceReads waits for every
// read the guard may have allowed. ForgetPeer and Close fail reads in
// flight on both sides: one not copying yet fails at once and never
// copies; a copy under way is waited for.

var (
	_ transfer.Reader      = (*Engine)(nil)
	_ transfer.ReadGuarded = (*Engine)(nil)
)

// readOp is one posted batch of reads: ops copy holder memory (Src) into
// reader memory (Dst).
type readOp struct {
	reader, holder *Engine
	peer           string // the holder's name, as the reader loaded it
	ops            []transfer.WriteOp

	// Guarded by fab.mu: the holder's guard is being asked; the copy is
	// under way; the op is terminal (finishLocked ran).
	asking, copying, done bool

	opEnd
}

// Writes, From and To make readOp a writeset.Write: a copy from the holder
// (Src) to the reader (Dst).
func (o *readOp) Writes() []transfer.WriteOp { return o.ops }
func (o *readOp) From() string               { return o.holder.name }
func (o *readOp) To() string                 { return o.reader.name }

// abortLocked fails o with err; one not copying yet is terminal at once
// (its goroutine sees done and never copies). fab.mu is held.
func (o *readOp) abortLocked(err error) {
	o.abortOnceLocked(err)
	if !o.copying {
		o.finishLocked(o.abortErr)
	}
}

// finishLocked makes o terminal with err (nil: Done), once. fab.mu is held.
func (o *readOp) finishLocked(err error) {
	if o.done {
		return
	}
	o.done = true
	delete(o.reader.rout, o)
	delete(o.holder.rin, o)
	o.err = err
	if err != nil {
		o.state.Store(uint32(transfer.Failed))
	} else {
		o.state.Store(uint32(transfer.Done))
	}
	close(o.finished)
	if f := o.reader.opts.OnComplete; f != nil {
		f()
	}
}

// Release frees the operation once it is terminal.
func (o *readOp) Release() error {
	if err := o.release(); err != nil {
		return fmt.Errorf("loopback %s: release read from %q: %w", o.reader.name, o.peer, err)
	}
	return nil
}

// SetReadGuard installs g (transfer.ReadGuarded); nil removes it, and with
// none installed no read is served.
func (e *Engine) SetReadGuard(g transfer.ReadGuard) {
	e.fab.mu.Lock()
	e.rguard = g
	e.fab.mu.Unlock()
}

// PostRead checks every read — its destination registered here, its
// source in the peer's loaded metadata and still registered by the peer —
// and starts copying on a new goroutine (transfer.Reader). The peer's read
// guard is asked when the copy starts; a refusal fails the op with
// ErrForbidden and copies nothing. Zero-length reads move nothing.
func (e *Engine) PostRead(peerName string, ops []transfer.ReadOp) (transfer.Op, error) {
	ctx := func(format string, args ...any) string {
		return fmt.Sprintf("loopback %s: post read from %q: ", e.name, peerName) + fmt.Sprintf(format, args...)
	}
	own := make([]transfer.WriteOp, 0, len(ops))
	for i, r := range ops {
		if r.Src.Len != r.Dst.Len {
			return nil, fmt.Errorf("%s: %w", ctx("read %d: source length %d != destination length %d", i, r.Src.Len, r.Dst.Len), transfer.ErrOutOfBounds)
		}
		if r.Src.Len == 0 {
			continue
		}
		if r.Src.Kind != transfer.Host || r.Dst.Kind != transfer.Host {
			return nil, fmt.Errorf("%s: %w", ctx("read %d: host memory only", i), transfer.ErrUnsupported)
		}
		own = append(own, transfer.WriteOp{Src: r.Src, Dst: r.Dst})
	}
	f := e.fab
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := e.targetLocked(peerName, ctx)
	if err != nil {
		return nil, err
	}
	if err := e.checkRangesLocked(p, ctx, own, true, func(i int, side string) string { return fmt.Sprintf("read %d %s", i, side) }); err != nil {
		return nil, err
	}
	t := p.eng
	o := &readOp{reader: e, holder: t, peer: peerName, ops: own, opEnd: opEnd{abortC: make(chan struct{}), finished: make(chan struct{})}}
	e.rout[o] = struct{}{}
	t.rin[o] = struct{}{}
	e.wg.Add(1)
	go e.runRead(o)
	return o, nil
}

// runRead asks the holder's guard, then copies.
func (e *Engine) runRead(o *readOp) {
	defer e.wg.Done()
	e.gate(o.abortC)
	f := e.fab
	f.mu.Lock()
	if o.done {
		f.mu.Unlock()
		return
	}
	g := o.holder.rguard
	o.asking = true
	f.mu.Unlock()
	err := authorize(g, o.holder.name, e.name, o.ops)
	f.mu.Lock()
	o.asking = false
	if o.done || err != nil {
		o.finishLocked(err) // a no-op when aborted meanwhile
		f.mu.Unlock()
		return
	}
	o.copying = true
	f.mu.Unlock()
	// Checked at post time; DeregisterMemory refuses ranges in use and
	// Close waits for this copy, so the memory is still there.
	for _, w := range o.ops {
		copy(mem.Unsafe(w.Dst.Addr, w.Dst.Len), mem.Unsafe(w.Src.Addr, w.Src.Len))
	}
	f.mu.Lock()
	o.copying = false
	o.finishLocked(nil)
	f.mu.Unlock()
}

// authorize asks the holder's read guard g about every read of peer; nil
// guard: nothing is served.
func authorize(g transfer.ReadGuard, holder, peer string, ops []transfer.WriteOp) error {
	if g == nil {
		return fmt.Errorf("loopback %s: read by %q: no read guard is installed, so this engine serves no reads: %w", holder, peer, transfer.ErrForbidden)
	}
	for i, w := range ops {
		a, err := g(peer, w.Src)
		if err == nil && !a.Contains(w.Src.Addr, w.Src.Len) {
			err = fmt.Errorf("guard allowed %v, not the read", a)
		}
		if err != nil {
			return fmt.Errorf("loopback %s: read %d [%#x+%d] by %q: %w: %w", holder, i, w.Src.Addr, w.Src.Len, peer, transfer.ErrForbidden, err)
		}
	}
	return nil
}

// FenceReads returns once no read the guard may have allowed of memory
// overlapping d is copying (transfer.ReadGuarded): it waits for those
// being asked about or copying.
func (e *Engine) FenceReads(d transfer.Desc) {
	e.fab.mu.Lock()
	var busy []*readOp
	for o := range e.rin {
		if (o.asking || o.copying) && slices.ContainsFunc(o.ops, func(w transfer.WriteOp) bool { return writeset.Overlaps(w.Src, d) }) {
			busy = append(busy, o)
		}
	}
	e.fab.mu.Unlock()
	for _, o := range busy {
		<-o.finished
	}
}

// abortReadsLocked fails e's reads from peer and the reads peer posted of
// e's memory (ForgetPeer), or all of them (peer ""), and returns them.
func (e *Engine) abortReadsLocked(peer string, own, served error) []*readOp {
	var pending []*readOp
	for o := range e.rout {
		if peer == "" || o.holder.name == peer {
			o.abortLocked(own)
			pending = append(pending, o)
		}
	}
	for o := range e.rin {
		if peer == "" || o.reader.name == peer {
			o.abortLocked(served)
			pending = append(pending, o)
		}
	}
	return pending
}
