package ucx

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// PostWrite validates every op — sources against this engine's registered
// memory, destinations against the peer's ranges from its last loaded
// metadata — and only then posts one ucp_put_nbx per fragment (at most
// Config.FragmentSize bytes) followed by one ucp_ep_flush_nbx. The returned
// Op is Done when every put and the flush completed, i.e. the bytes are
// visible at the target; it is terminal only after UCX completed every
// request it made, so a terminal Op no longer reads the sources. Zero-length
// ops are allowed and move nothing.
func (e *Engine) PostWrite(peerName string, ops []transfer.WriteOp) (transfer.Op, error) {
	if len(ops) == 0 {
		return nil, fmt.Errorf("ucx: post write to %q: no ops", peerName)
	}
	var w *writeOp
	err := e.call("post write to "+peerName, func() error {
		var err error
		w, err = e.postWrite(peerName, ops)
		return err
	})
	if err != nil {
		return nil, err
	}
	return w, nil
}

func (e *Engine) postWrite(name string, ops []transfer.WriteOp) (*writeOp, error) {
	p := e.peers[name]
	if p == nil {
		return nil, fmt.Errorf("ucx: post write to %q: %w", name, transfer.ErrUnknownPeer)
	}
	if p.ep == nil {
		return nil, fmt.Errorf("ucx: post write to %q: %w", name, p.state.lost)
	}
	if p.departed {
		return nil, fmt.Errorf("ucx: post write to %q: %w", name, departedErr(name))
	}
	rs := p.rs
	if rs == nil {
		return nil, fmt.Errorf("ucx: post write to %q: peer is known only from its notifications, LoadPeer its metadata first: %w", name, transfer.ErrNotRegistered)
	}
	frag := e.cfg.FragmentSize
	n := 0
	for _, op := range ops {
		n += int((op.Src.Len + frag - 1) / frag)
	}
	puts := make([]C.bkv_put, 0, n)
	var srcs []*region
	var last *region
	for i, op := range ops {
		bad := func(err error) (*writeOp, error) {
			return nil, fmt.Errorf("ucx: post write to %q: op %d (src %v, dst %v): %w", name, i, op.Src, op.Dst, err)
		}
		d, err := mem.CheckWrite(&e.reg, op)
		if err != nil {
			return bad(err)
		}
		if op.Src.Len == 0 {
			continue
		}
		r := e.regions[d.Addr]
		if r == nil {
			return bad(transfer.ErrNotRegistered)
		}
		rr, err := rs.find(op.Dst.Addr, op.Dst.Len)
		if err != nil {
			if errors.Is(err, transfer.ErrNotRegistered) {
				return bad(fmt.Errorf("destination not in the peer's registered memory: %w", err))
			}
			return bad(err)
		}
		if r != last {
			last = r
			dup := false
			for _, s := range srcs {
				dup = dup || s == r
			}
			if !dup {
				srcs = append(srcs, r)
			}
		}
		for off := uint64(0); off < op.Src.Len; off += frag {
			l := min(frag, op.Src.Len-off)
			puts = append(puts, C.bkv_put{
				laddr: C.uint64_t(op.Src.Addr + off),
				raddr: C.uint64_t(op.Dst.Addr + off),
				len:   C.uint64_t(l),
				rkey:  rr.rkey,
				memh:  r.memh,
			})
		}
	}
	w := &writeOp{peer: name}
	st := p.state
	cop, err := e.newOp(func(s C.ucs_status_t, abandoned bool) {
		for _, r := range srcs {
			r.inflight--
		}
		rs.unref()
		w.finish(name, st, s, abandoned)
	})
	if err != nil {
		return nil, fmt.Errorf("ucx: post write to %q: %w", name, err)
	}
	for _, r := range srcs {
		r.inflight++
	}
	rs.refs++
	var first *C.bkv_put
	if len(puts) > 0 {
		first = &puts[0]
	}
	p.used = true
	C.bkv_put_many(p.ep, cop, first, C.size_t(len(puts)))
	C.bkv_op_post_done(cop)
	return w, nil
}

// writeOp is the transfer.Op of one PostWrite.
type writeOp struct {
	peer     string
	state    atomic.Uint32 // transfer.Status; err is written before it
	err      error
	released atomic.Bool
}

// finish runs on the progress goroutine once UCX completed every request of
// the write (or, abandoned, gave up on them at Close).
func (w *writeOp) finish(name string, ep *epState, s C.ucs_status_t, abandoned bool) {
	switch {
	case abandoned:
		w.err = fmt.Errorf("ucx: write to %q: UCX did not complete its requests before close: %w", name, transfer.ErrNotQuiescent)
	case ep.lost != nil:
		// The endpoint failed before this completion was reaped (reap
		// takes endpoint errors first). UCX completes the requests of a
		// failed endpoint, the flush included, with UCS_OK or an error
		// alike, without the target's acknowledgement: OK proves nothing
		// landed, so the write is not Done.
		w.err = fmt.Errorf("ucx: write to %q: %s: %w", name, statusString(s), ep.lost)
	case s == C.UCS_OK:
		w.state.Store(uint32(transfer.Done))
		return
	case C.bkv_status_is_peer(s) != 0:
		w.err = fmt.Errorf("ucx: write to %q: %s: %w", name, statusString(s), transfer.ErrPeerLost)
	default:
		w.err = fmt.Errorf("ucx: write to %q: %s", name, statusString(s))
	}
	w.state.Store(uint32(transfer.Failed))
}

// Poll reports the write's state without blocking.
func (w *writeOp) Poll() (transfer.Status, error) {
	s := transfer.Status(w.state.Load())
	if s == transfer.Failed {
		return s, w.err
	}
	return s, nil
}

// Release frees the op after it is terminal; a pending op is ErrInUse.
func (w *writeOp) Release() error {
	if !transfer.Status(w.state.Load()).Terminal() {
		return fmt.Errorf("ucx: release write to %q: still pending: %w", w.peer, transfer.ErrInUse)
	}
	if w.released.Swap(true) {
		return fmt.Errorf("ucx: release write to %q: released twice", w.peer)
	}
	return nil
}
