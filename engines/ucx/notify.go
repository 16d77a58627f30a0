package ucx

/*
#include <stdlib.h>
#include <string.h>
#include "shim.h"
*/
import "C"

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"time"
	"unsafe"

	"github.com/bouncekv/bounce/internal/inbox"
	"github.com/bouncekv/bounce/transfer"
)

// Notify sends payload to peer as one active message (eager protocol) whose
// header carries this engine's name. It never blocks: it queues the send for
// the progress goroutine and returns. More than Config.NotifyQueue
// notifications in flight to one peer is ErrQueueFull; an unknown peer is
// ErrUnknownPeer; a lost one ErrPeerLost.
//
// LoadPeer, and the first notification on an endpoint this engine did not
// load, send a hello carrying this engine's UCX worker address, so a
// receiver that never loaded this engine creates an endpoint back and can
// Notify the sender by name (the reverse control path). Such a peer can be notified but not written to until its
// metadata is loaded. Notifications on one endpoint arrive in order.
func (e *Engine) Notify(peerName string, payload []byte) error {
	if len(payload) > e.cfg.MaxNotifySize {
		return fmt.Errorf("ucx: notify %q: payload of %d bytes exceeds MaxNotifySize %d", peerName, len(payload), e.cfg.MaxNotifySize)
	}
	e.nmu.Lock()
	if e.nshut {
		e.nmu.Unlock()
		return fmt.Errorf("ucx: notify %q: engine %q: %w", peerName, e.name, transfer.ErrClosed)
	}
	np := e.notify[peerName]
	switch {
	case np == nil:
		e.nmu.Unlock()
		return fmt.Errorf("ucx: notify %q: %w", peerName, transfer.ErrUnknownPeer)
	case np.lost != nil:
		e.nmu.Unlock()
		return fmt.Errorf("ucx: notify %q: %w", peerName, np.lost)
	case np.outstanding >= e.cfg.NotifyQueue:
		n := np.outstanding
		e.nmu.Unlock()
		return fmt.Errorf("ucx: notify %q: %d notifications in flight: %w", peerName, n, transfer.ErrQueueFull)
	}
	np.outstanding++
	e.nmu.Unlock()
	buf := make([]byte, 0, len(e.msgHdr)+len(payload))
	buf = append(append(buf, e.msgHdr...), payload...)
	if err := e.submit(func() { e.sendNotify(peerName, np, len(e.msgHdr), buf) }); err != nil {
		e.notifyDone(np)
		return fmt.Errorf("ucx: notify %q: engine %q: %w", peerName, e.name, err)
	}
	return nil
}

func (e *Engine) notifyDone(np *notifyPeer) {
	e.nmu.Lock()
	np.outstanding--
	e.nmu.Unlock()
}

// sendNotify runs on the progress goroutine.
func (e *Engine) sendNotify(name string, np *notifyPeer, hlen int, buf []byte) {
	p := e.peers[name]
	if e.shut || p == nil || p.np != np || p.ep == nil {
		e.notifyDone(np)
		e.sendFailed.Add(1)
		return
	}
	p.used = true
	e.sayHello(p)
	e.amSend(p, buf, hlen, func(st C.ucs_status_t) {
		e.notifyDone(np)
		if st != C.UCS_OK {
			e.sendFailed.Add(1)
			level := slog.LevelWarn
			if p.departed || e.shut {
				level = slog.LevelDebug // the peer or this engine is closing
			}
			e.log.Log(context.Background(), level, "notification failed", "peer", name, "status", statusString(st))
		}
	})
}

// sayHello sends p, once per endpoint, a hello carrying this engine's
// worker address: p then holds an endpoint back (the one it loaded, or
// one it makes from the hello), so it can answer by name and ack a bye.
func (e *Engine) sayHello(p *peer) {
	if p.helloSent || p.ep == nil {
		return
	}
	p.helloSent = true
	name, state := p.name, p.state
	hdr := encodeAMHeader(amKindHello, e.name)
	e.amSend(p, append(hdr, e.addr...), len(hdr), func(st C.ucs_status_t) {
		if st != C.UCS_OK {
			level := slog.LevelWarn
			if state.lost != nil || e.shut {
				level = slog.LevelDebug // the endpoint's loss is logged, or this engine closes
			}
			e.log.Log(context.Background(), level, "hello failed", "peer", name, "status", statusString(st))
		}
	})
}

// amSend sends buf (hlen header bytes, then data) on p's endpoint; done runs
// when UCX completed the send.
func (e *Engine) amSend(p *peer, buf []byte, hlen int, done func(C.ucs_status_t)) {
	op, err := e.newOp(func(st C.ucs_status_t, abandoned bool) {
		if abandoned {
			st = C.UCS_ERR_TIMED_OUT
		}
		done(st)
	})
	if err != nil {
		done(C.UCS_ERR_NO_MEMORY)
		return
	}
	op.buf = C.malloc(C.size_t(len(buf) + 1))
	if op.buf == nil {
		op.status = C.UCS_ERR_NO_MEMORY
		C.bkv_op_post_done(op)
		return
	}
	C.memcpy(op.buf, unsafe.Pointer(&buf[0]), C.size_t(len(buf)))
	C.bkv_am_send(p.ep, op, C.size_t(hlen), C.size_t(len(buf)-hlen))
	C.bkv_op_post_done(op)
}

// received handles one active message on the progress goroutine; hdr and
// data point into C memory and are copied before it returns.
func (e *Engine) received(hdr, data []byte) {
	kind, name, err := decodeAMHeader(hdr)
	if err != nil {
		e.recvDropped.Add(1)
		e.log.Warn("dropped malformed active message", "err", err)
		return
	}
	switch kind {
	case amKindHello:
		e.hello(name, data)
		if p := e.peers[name]; p != nil {
			p.heard = true
		}
		return
	case amKindBye:
		e.byeReceived(name)
		return
	case amKindByeAck:
		if p := e.peers[name]; p != nil {
			e.byeDone(p)
		}
		return
	}
	if p := e.peers[name]; p != nil {
		p.heard = true
	}
	m := transfer.Message{Peer: name, Payload: bytes.Clone(data)}
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	select {
	case e.inbox <- m:
	default:
		e.recvDropped.Add(1)
		e.log.Warn("receive queue full, dropped notification", "peer", name, "queue", e.cfg.RecvQueue)
	}
}

// hello makes name reachable for Notify: unless an explicitly loaded,
// healthy peer of that name exists (or one with the same address), it
// creates an endpoint to the sender's worker address.
func (e *Engine) hello(name string, addr []byte) {
	if e.shut {
		return
	}
	if len(addr) == 0 || len(addr) > maxAddrLen {
		e.recvDropped.Add(1)
		e.log.Warn("dropped hello with bad worker address", "peer", name, "len", len(addr))
		return
	}
	p := e.peers[name]
	if p != nil && p.ep != nil && (p.explicit || bytes.Equal(p.addr, addr)) {
		return
	}
	if p != nil {
		e.dropPeer(p, fmt.Errorf("ucx: peer %q introduced a new address: %w", name, transfer.ErrPeerLost))
	}
	p = &peer{name: name, addr: bytes.Clone(addr)}
	if err := e.connect(p); err != nil {
		e.log.Warn("cannot connect back to hello sender", "peer", name, "err", err)
		return
	}
	e.addPeer(p)
}

// RecvNotification returns the next notification, waiting at most timeout
// (no wait when timeout <= 0). It returns ErrTimeout when none arrived and
// ErrClosed once the engine is closed.
func (e *Engine) RecvNotification(timeout time.Duration) (transfer.Message, error) {
	m, err := inbox.Receive(e.inbox, e.closed, timeout)
	if err != nil {
		return m, fmt.Errorf("ucx: receive notification: %w", err)
	}
	return m, nil
}
