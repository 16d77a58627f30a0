package ucx

/*
#include <stdlib.h>
#include <string.h>
#include "shim.h"
*/
import "C"

import (
	"bytes"
	"fmt"
	"sort"
	"unsafe"

	"github.com/bouncekv/bounce/transfer"
)

// epState is shared by one endpoint incarnation and the writes posted on it;
// lost is set (wrapping ErrPeerLost or ErrClosed) once the endpoint is gone.
type epState struct{ lost error }

// peer is a remote engine, owned by the progress goroutine.
type peer struct {
	name      string
	addr      []byte
	explicit  bool // loaded with LoadPeer (not only learned from a hello)
	ep        C.ucp_ep_h
	info      *C.bkv_epinfo
	epID      uint64
	state     *epState
	rs        *rangeSet // nil until LoadPeer
	helloSent bool
	// used is set once a write or notification went out on ep, heard once
	// a hello or notification came from the peer (it holds an endpoint to
	// this engine then). Close says bye to a peer it sent a hello (every
	// loaded one), used or heard, and waits for the ack of one that surely
	// holds an endpoint here (heard, or sent a hello): see sayBye.
	used, heard bool
	// byeWait is set while Close waits for the peer's bye-ack.
	byeWait bool
	// departed is set by the peer's bye: it is closing its engine, so its
	// endpoint failing next is expected (logged at Debug, not Warn).
	departed bool
	np       *notifyPeer
}

// rangeSet is one generation of a peer's registered ranges with their
// unpacked rkeys. Writes hold references; rkeys are destroyed once the set is
// replaced (or the peer dropped) and no write uses it.
type rangeSet struct {
	ranges []rrange // sorted, non-overlapping
	refs   int
	dead   bool
}

type rrange struct {
	addr, len uint64
	rkey      C.ucp_rkey_h
}

func (rs *rangeSet) destroy() {
	for _, r := range rs.ranges {
		C.ucp_rkey_destroy(r.rkey)
	}
	rs.ranges = nil
}

func (rs *rangeSet) unref() {
	rs.refs--
	if rs.dead && rs.refs == 0 {
		rs.destroy()
	}
}

func (rs *rangeSet) kill() {
	if rs.dead {
		return
	}
	rs.dead = true
	if rs.refs == 0 {
		rs.destroy()
	}
}

// find returns the range holding [addr, addr+n).
func (rs *rangeSet) find(addr, n uint64) (*rrange, error) {
	i := sort.Search(len(rs.ranges), func(i int) bool { return rs.ranges[i].addr > addr })
	if i == 0 {
		return nil, transfer.ErrNotRegistered
	}
	r := &rs.ranges[i-1]
	d := transfer.Desc{Addr: r.addr, Len: r.len}
	if !d.Contains(addr, n) {
		if addr >= d.End() {
			return nil, transfer.ErrNotRegistered
		}
		return nil, fmt.Errorf("exceeds peer range [%#x+%d]: %w", r.addr, r.len, transfer.ErrOutOfBounds)
	}
	return r, nil
}

func (p *peer) releaseRanges() {
	if p.rs != nil {
		p.rs.kill()
		p.rs = nil
	}
}

// cbytes copies b into zero-padded C memory, so a malformed UCX address or
// rkey that UCX parses past its end reads zeros rather than foreign memory.
func cbytes(b []byte) unsafe.Pointer {
	const pad = 4096
	p := C.calloc(C.size_t(len(b)+pad), 1)
	if p != nil && len(b) > 0 {
		C.memcpy(p, unsafe.Pointer(&b[0]), C.size_t(len(b)))
	}
	return p
}

// LoadPeer decodes a peer's Metadata, creates an endpoint to its worker
// (error-handling mode per Config.ErrMode), unpacks its rkeys and sends the
// peer a hello, so that it holds an endpoint back even if it never loaded
// this engine: Close's bye to it is then acked (see sayBye), and neither
// side's endpoint outlives the other's worker unannounced. Loading a
// known peer with the same worker address refreshes its ranges; a different
// address (a restarted peer) replaces the endpoint and fails the old
// endpoint's in-flight writes with ErrPeerLost. Malformed metadata is
// ErrBadMetadata; an endpoint UCX cannot create is ErrBadEndpoint.
func (e *Engine) LoadPeer(md []byte) (string, error) {
	info, err := decodeMetadata(md)
	if err != nil {
		return "", err
	}
	if err := e.call("load peer "+info.Name, func() error { return e.loadPeer(info) }); err != nil {
		return "", err
	}
	return info.Name, nil
}

func (e *Engine) loadPeer(info peerInfo) error {
	p := e.peers[info.Name]
	if p != nil && (p.ep == nil || !bytes.Equal(p.addr, info.Addr)) {
		e.dropPeer(p, fmt.Errorf("ucx: peer %q replaced by new metadata: %w", info.Name, transfer.ErrPeerLost))
		p = nil
	}
	fresh := p == nil
	if fresh {
		p = &peer{name: info.Name, addr: info.Addr}
		if err := e.connect(p); err != nil {
			return err
		}
	}
	rs, err := e.unpack(p, info.Ranges)
	if err != nil {
		if fresh {
			e.dropPeer(p, fmt.Errorf("ucx: peer %q: load failed: %w", p.name, transfer.ErrPeerLost))
		}
		return err
	}
	p.releaseRanges()
	p.rs = rs
	p.explicit = true
	if fresh {
		e.addPeer(p)
	}
	e.sayHello(p)
	return nil
}

// connect creates p's endpoint.
func (e *Engine) connect(p *peer) error {
	caddr := cbytes(p.addr)
	if caddr == nil {
		return fmt.Errorf("ucx: connect to %q: out of memory", p.name)
	}
	defer C.free(caddr)
	e.nextID++
	id := e.nextID
	var ep C.ucp_ep_h
	var info *C.bkv_epinfo
	peerErrors := C.int(0)
	if e.cfg.ErrMode == PeerErrors {
		peerErrors = 1
	}
	if st := C.bkv_ep_create(e.c, caddr, C.uint64_t(id), peerErrors, &ep, &info); st != C.UCS_OK {
		return fmt.Errorf("ucx: connect to %q (error mode %v): ucp_ep_create: %s: %w", p.name, e.cfg.ErrMode, statusString(st), transfer.ErrBadEndpoint)
	}
	p.ep, p.info, p.epID, p.state, p.helloSent = ep, info, id, &epState{}, false
	e.eps[id] = p
	return nil
}

// unpack unpacks ranges' rkeys on p's endpoint.
func (e *Engine) unpack(p *peer, ranges []remoteRange) (*rangeSet, error) {
	rs := &rangeSet{ranges: make([]rrange, 0, len(ranges))}
	for i, r := range ranges {
		buf := cbytes(r.RKey)
		if buf == nil {
			rs.destroy()
			return nil, fmt.Errorf("ucx: load peer %q: out of memory", p.name)
		}
		var rkey C.ucp_rkey_h
		st := C.ucp_ep_rkey_unpack(p.ep, buf, &rkey)
		C.free(buf)
		if st != C.UCS_OK {
			rs.destroy()
			return nil, fmt.Errorf("ucx: load peer %q: range %d [%#x+%d]: ucp_ep_rkey_unpack: %s: %w", p.name, i, r.Addr, r.Len, statusString(st), transfer.ErrBadMetadata)
		}
		rs.ranges = append(rs.ranges, rrange{addr: r.Addr, len: r.Len, rkey: rkey})
	}
	return rs, nil
}

// addPeer publishes p in the peer tables and the caller-visible notify table.
func (e *Engine) addPeer(p *peer) {
	e.peers[p.name] = p
	p.np = &notifyPeer{}
	e.nmu.Lock()
	e.notify[p.name] = p.np
	e.nmu.Unlock()
}

// closeEP force-closes p's endpoint: UCX completes its outstanding requests
// with UCS_ERR_CANCELED.
func (e *Engine) closeEP(p *peer) {
	if p.ep == nil {
		return
	}
	ep, info := p.ep, p.info
	p.ep, p.info = nil, nil
	delete(e.eps, p.epID)
	op, err := e.newOp(func(_ C.ucs_status_t, abandoned bool) {
		if !abandoned {
			C.free(unsafe.Pointer(info))
		}
	})
	if err != nil {
		e.log.Error("cannot close endpoint", "peer", p.name, "err", err)
		return
	}
	C.bkv_ep_close(ep, op)
	C.bkv_op_post_done(op)
}

// peerFailed handles UCX's error callback for p's endpoint. The peer stays
// known (writes and notifications to it fail with ErrPeerLost) until
// ForgetPeer or a new LoadPeer.
func (e *Engine) peerFailed(p *peer, st C.ucs_status_t) {
	cause := fmt.Errorf("ucx: peer %q: endpoint failed: %s: %w", p.name, statusString(st), transfer.ErrPeerLost)
	switch {
	case p.departed:
		cause = fmt.Errorf("ucx: peer %q closed its engine (endpoint: %s): %w", p.name, statusString(st), transfer.ErrPeerLost)
		e.log.Debug("peer endpoint closed: the peer closed its engine", "peer", p.name, "status", statusString(st))
	case e.shut:
		e.log.Debug("peer endpoint failed while this engine closes", "peer", p.name, "status", statusString(st))
	default:
		e.log.Warn("peer endpoint failed", "peer", p.name, "status", statusString(st))
	}
	e.byeDone(p)
	if p.state.lost == nil {
		p.state.lost = cause
	}
	e.closeEP(p)
	p.releaseRanges()
	e.nmu.Lock()
	if p.np != nil {
		p.np.lost = cause
	}
	e.nmu.Unlock()
}

// dropPeer forgets p: its endpoint is closed, its pending writes fail with
// cause and it leaves every table.
func (e *Engine) dropPeer(p *peer, cause error) {
	if p.state != nil && p.state.lost == nil {
		p.state.lost = cause
	}
	e.byeDone(p)
	e.closeEP(p)
	p.releaseRanges()
	if e.peers[p.name] == p {
		delete(e.peers, p.name)
	}
	e.nmu.Lock()
	if p.np != nil {
		p.np.lost = cause
		if e.notify[p.name] == p.np {
			delete(e.notify, p.name)
		}
	}
	e.nmu.Unlock()
}

// ForgetPeer force-closes the endpoint to peer and forgets it. Its in-flight
// writes fail with ErrPeerLost once UCX has completed (cancelled) every
// request they made, so their terminal state is still quiescent.
func (e *Engine) ForgetPeer(name string) error {
	return e.call("forget peer "+name, func() error {
		p := e.peers[name]
		if p == nil {
			return fmt.Errorf("ucx: forget peer %q: %w", name, transfer.ErrUnknownPeer)
		}
		e.dropPeer(p, fmt.Errorf("ucx: peer %q forgotten: %w", name, transfer.ErrPeerLost))
		return nil
	})
}

// EndpointInfo returns UCX's description of the endpoint to peer (its lanes
// and transports, from ucp_ep_print_info), for diagnostics.
func (e *Engine) EndpointInfo(name string) (string, error) {
	var s string
	err := e.call("endpoint info "+name, func() error {
		p := e.peers[name]
		if p == nil || p.ep == nil {
			return fmt.Errorf("ucx: endpoint info %q: %w", name, transfer.ErrUnknownPeer)
		}
		c := C.bkv_ep_info(p.ep)
		if c == nil {
			return fmt.Errorf("ucx: endpoint info %q: out of memory", name)
		}
		s = C.GoString(c)
		C.free(unsafe.Pointer(c))
		return nil
	})
	return s, err
}
