//go:build nixl

package nixl

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// PostWrite validates every op — sources against this engine's registered
// memory, destinations against the ranges in the peer's last loaded
// metadata — and only then creates one NIXL_WRITE transfer request over all
// non-empty ops (createXferReq, no notification) and posts it
// (postXferReq). The Op is Done when NIXL reports the request complete,
// which for UCX includes a flush of the endpoint: the bytes are visible at
// the target. Zero-length ops are allowed and move nothing.
func (e *Engine) PostWrite(name string, ops []transfer.WriteOp) (transfer.Op, error) {
	if len(ops) == 0 {
		return nil, fmt.Errorf("nixl: post write to %q: no ops", name)
	}
	if err := e.lock("post write to " + name); err != nil {
		return nil, err
	}
	defer e.mu.Unlock()
	p := e.peers[name]
	if p == nil || p.forgetting {
		return nil, fmt.Errorf("nixl: post write to %q: %w", name, transfer.ErrUnknownPeer)
	}
	laddr := make([]C.uint64_t, 0, len(ops))
	raddr := make([]C.uint64_t, 0, len(ops))
	lens := make([]C.uint64_t, 0, len(ops))
	var srcs []uint64
	for i, op := range ops {
		bad := func(err error) (transfer.Op, error) {
			return nil, fmt.Errorf("nixl: post write to %q: op %d (src %v, dst %v): %w", name, i, op.Src, op.Dst, err)
		}
		d, err := mem.CheckWrite(&e.reg, op)
		if err != nil {
			return bad(err)
		}
		if op.Src.Len == 0 {
			continue
		}
		if _, err := p.ranges.Find(op.Dst.Addr, op.Dst.Len); err != nil {
			return bad(fmt.Errorf("destination outside the peer's registered memory: %w", err))
		}
		dup := false
		for _, s := range srcs {
			dup = dup || s == d.Addr
		}
		if !dup {
			srcs = append(srcs, d.Addr)
		}
		laddr = append(laddr, C.uint64_t(op.Src.Addr))
		raddr = append(raddr, C.uint64_t(op.Dst.Addr))
		lens = append(lens, C.uint64_t(op.Src.Len))
	}
	w := &writeOp{e: e, peer: name}
	if len(lens) == 0 {
		w.state = transfer.Done
		return w, nil
	}
	var x *C.bnx_xfer
	var posted C.int
	st := C.bnx_write(e.agent, cn0(name), C.size_t(len(name)), &laddr[0], &raddr[0], &lens[0], C.size_t(len(lens)), &x, &posted)
	switch {
	case st == stSuccess || st == stInProg:
	case posted == 0:
		return nil, fmt.Errorf("nixl: post write to %q: createXferReq: %w", name, statusError(st))
	default:
		// NIXL may have started some puts of the request before it failed
		// and does not say which; nothing proves they stopped.
		return nil, fmt.Errorf("nixl: post write to %q: postXferReq: %v: %w", name, statusError(st), transfer.ErrNotQuiescent)
	}
	w.x = x
	w.srcs = srcs
	e.handles[w] = struct{}{}
	if st == stSuccess {
		w.state = transfer.Done
		return w, nil
	}
	for _, s := range srcs {
		e.refs[s]++
	}
	e.inflight[w] = struct{}{}
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return w, nil
}

// writeOp is the transfer.Op of one PostWrite. Its fields are guarded by
// the engine's mutex.
type writeOp struct {
	e        *Engine
	peer     string
	x        *C.bnx_xfer // NIXL request until released
	srcs     []uint64    // registered source ranges it holds in e.refs
	state    transfer.Status
	err      error
	lost     error // set by ForgetPeer/Close: the op fails with it
	released bool
}

// check asks NIXL for the status of a pending write; mu is held.
func (e *Engine) check(w *writeOp) {
	st := C.bnx_xfer_status(e.agent, w.x)
	switch {
	case st == stInProg:
	case st == stSuccess:
		if w.lost != nil {
			e.resolve(w, transfer.Failed, w.lost)
			return
		}
		e.resolve(w, transfer.Done, nil)
	default:
		if st == stNotFound {
			// NIXL 0.1.1 freed the request (its remote was invalidated).
			w.x = nil
			delete(e.handles, w)
		}
		err := fmt.Errorf("nixl: write to %q: getXferStatus: %v; NIXL does not say whether the request's other puts still run: %w", w.peer, statusError(st), transfer.ErrNotQuiescent)
		if w.lost != nil {
			err = fmt.Errorf("%w: %w", err, w.lost)
		}
		e.resolve(w, transfer.Failed, err)
	}
}

// resolve makes w terminal; mu is held.
func (e *Engine) resolve(w *writeOp, s transfer.Status, err error) {
	w.state, w.err = s, err
	delete(e.inflight, w)
	for _, a := range w.srcs {
		if e.refs[a]--; e.refs[a] <= 0 {
			delete(e.refs, a)
		}
	}
	w.srcs = nil
}

// Poll reports the write's state (getXferStatus while it is pending).
func (w *writeOp) Poll() (transfer.Status, error) {
	e := w.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if !w.state.Terminal() {
		e.check(w)
	}
	return w.state, w.err
}

// Release frees the NIXL request (releaseXferReq) after the op is terminal;
// on a pending op it returns ErrInUse.
func (w *writeOp) Release() error {
	e := w.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if !w.state.Terminal() {
		return fmt.Errorf("nixl: release write to %q: still pending: %w", w.peer, transfer.ErrInUse)
	}
	if w.released {
		return fmt.Errorf("nixl: release write to %q: released twice", w.peer)
	}
	w.released = true
	if w.x == nil || e.agent == nil {
		return nil
	}
	st := C.bnx_xfer_release(e.agent, w.x)
	w.x = nil
	delete(e.handles, w)
	if st != stSuccess {
		return fmt.Errorf("nixl: release write to %q: releaseXferReq: %w", w.peer, statusError(st))
	}
	return nil
}
