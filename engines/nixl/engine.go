//go:build nixl

package nixl

/*
#cgo CXXFLAGS: -std=c++17
#cgo LDFLAGS: -lnixl -lnixl_build -lstdc++
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/bouncekv/bounce/internal/inbox"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// NIXL status codes (nixl_types.h); their values are stable across releases.
const (
	stSuccess   = 0
	stInProg    = 1
	stNotFound  = -4
	stException = C.BNX_EXCEPTION
)

var statusNames = [...]string{
	"NIXL_ERR_NOT_POSTED", "NIXL_ERR_INVALID_PARAM", "NIXL_ERR_BACKEND", "NIXL_ERR_NOT_FOUND",
	"NIXL_ERR_MISMATCH", "NIXL_ERR_NOT_ALLOWED", "NIXL_ERR_REPOST_ACTIVE", "NIXL_ERR_UNKNOWN",
	"NIXL_ERR_NOT_SUPPORTED",
}

// statusError turns a negative NIXL status into an error naming it.
func statusError(st C.int) error {
	switch {
	case st == stException:
		return errors.New("NIXL threw a C++ exception")
	case st < 0 && int(-st) <= len(statusNames):
		return errors.New(statusNames[-st-1])
	default:
		return fmt.Errorf("NIXL status %d", int(st))
	}
}

// Engine is a transfer.Engine and transfer.Notifier over one NIXL agent with
// a UCX backend. One mutex serialises every NIXL call and guards the state
// below it; a background goroutine progresses the agent and collects
// notifications.
type Engine struct {
	cfg  Config
	log  *slog.Logger
	name string

	inbox  chan transfer.Message
	closed chan struct{} // closed once Close began
	stop   chan struct{} // stops the background goroutine
	exited chan struct{} // closed when it returned
	wake   chan struct{}

	notifyFailed atomic.Uint64
	recvDropped  atomic.Uint64

	closeOnce sync.Once
	closeErr  error

	mu       sync.Mutex
	agent    *C.bnx_agent // nil after Close (or leaked when not quiescent)
	shut     bool
	reg      mem.Registry
	refs     map[uint64]int // registered range address -> in-flight writes
	peers    map[string]*peer
	inflight map[*writeOp]struct{} // posted, not yet terminal
	handles  map[*writeOp]struct{} // holding a NIXL request not yet released
}

// peer is a loaded remote agent.
type peer struct {
	ranges     mem.Registry // from its last loaded metadata
	forgetting bool         // ForgetPeer is draining its writes
}

var _ transfer.Engine = (*Engine)(nil)
var _ transfer.Notifier = (*Engine)(nil)

// New creates a NIXL agent named cfg.Name with a UCX backend and starts the
// background goroutine that progresses it. NIXL finds its UCX plugin through
// the NIXL_PLUGIN_DIR environment variable; UCX reads its usual environment
// (UCX_TLS, UCX_NET_DEVICES, ...).
func New(cfg Config) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	keys := make([]*C.char, 0, len(cfg.Backend))
	vals := make([]*C.char, 0, len(cfg.Backend))
	defer func() {
		for i := range keys {
			C.free(unsafe.Pointer(keys[i]))
			C.free(unsafe.Pointer(vals[i]))
		}
	}()
	for k, v := range cfg.Backend {
		keys = append(keys, C.CString(k))
		vals = append(vals, C.CString(v))
	}
	var kp, vp **C.char
	if len(keys) > 0 {
		// C-allocated arrays: cgo forbids passing Go pointers to Go pointers.
		sz := C.size_t(len(keys)) * C.size_t(unsafe.Sizeof(kp))
		ka, va := C.malloc(sz), C.malloc(sz)
		defer C.free(ka)
		defer C.free(va)
		copy(unsafe.Slice((**C.char)(ka), len(keys)), keys)
		copy(unsafe.Slice((**C.char)(va), len(vals)), vals)
		kp, vp = (**C.char)(ka), (**C.char)(va)
	}
	cname := C.CString(cfg.Name)
	defer C.free(unsafe.Pointer(cname))
	prog := C.int(0)
	if cfg.ProgressThread {
		prog = 1
	}
	var a *C.bnx_agent
	var what *C.char
	st := C.bnx_agent_new(cname, C.size_t(len(cfg.Name)), prog, kp, vp, C.size_t(len(keys)), &a, &what)
	if st != stSuccess {
		err := statusError(st)
		if what != nil {
			err = fmt.Errorf("%v: %s", err, C.GoString(what))
			C.free(unsafe.Pointer(what))
		}
		hint := ""
		if st == stNotFound {
			hint = " (is NIXL_PLUGIN_DIR set to the directory holding libplugin_UCX.so?)"
		}
		return nil, fmt.Errorf("nixl: new %q: create agent with UCX backend: %w%s", cfg.Name, err, hint)
	}
	e := &Engine{
		cfg:      cfg,
		log:      cfg.Logger.With("engine", "nixl", "name", cfg.Name),
		name:     cfg.Name,
		inbox:    make(chan transfer.Message, cfg.RecvQueue),
		closed:   make(chan struct{}),
		stop:     make(chan struct{}),
		exited:   make(chan struct{}),
		wake:     make(chan struct{}, 1),
		agent:    a,
		refs:     make(map[uint64]int),
		peers:    make(map[string]*peer),
		inflight: make(map[*writeOp]struct{}),
		handles:  make(map[*writeOp]struct{}),
	}
	go e.loop()
	return e, nil
}

// Name returns the agent name.
func (e *Engine) Name() string { return e.name }

// RouteCosts declares the engine's costs for route auto: NIXL builds a
// descriptor list and posts each descriptor through its backend (~2 µs
// each over UCX), a request costs a createXferReq/postXferReq round
// (~50 µs) and the bandwidth is UCX's. The agent refines them from
// observed transfers.
func (e *Engine) RouteCosts() (postPerDesc, perWrite time.Duration, bandwidth float64) {
	return 2 * time.Microsecond, 50 * time.Microsecond, 3e9
}

// MaxNotifySize returns the largest payload Notify accepts
// (Config.MaxNotifySize).
func (e *Engine) MaxNotifySize() int { return e.cfg.MaxNotifySize }

// Stats returns the notification counters.
func (e *Engine) Stats() Stats {
	return Stats{NotifyFailed: e.notifyFailed.Load(), RecvDropped: e.recvDropped.Load()}
}

// lock takes the mutex and reports ErrClosed once the engine is shut.
func (e *Engine) lock(what string) error {
	e.mu.Lock()
	if e.shut {
		e.mu.Unlock()
		return fmt.Errorf("nixl: %s: engine %q: %w", what, e.name, transfer.ErrClosed)
	}
	return nil
}

// RegisterMemory registers host memory with the agent (registerMem of one
// DRAM descriptor). Registering exactly the same range again is a no-op;
// overlapping ranges are an error.
func (e *Engine) RegisterMemory(d transfer.Desc) error {
	if d.Kind != transfer.Host {
		return fmt.Errorf("nixl: register %v: only host memory: %w", d, transfer.ErrUnsupported)
	}
	if err := e.lock("register"); err != nil {
		return err
	}
	defer e.mu.Unlock()
	for _, r := range e.reg.Ranges() {
		if r == d {
			return nil
		}
	}
	if err := e.reg.Add(d); err != nil {
		return fmt.Errorf("nixl: register: %w", err)
	}
	if st := C.bnx_register(e.agent, C.uint64_t(d.Addr), C.uint64_t(d.Len)); st != stSuccess {
		e.reg.Remove(d)
		return fmt.Errorf("nixl: register %v: registerMem: %w", d, statusError(st))
	}
	return nil
}

// DeregisterMemory deregisters exactly a range given to RegisterMemory. It
// returns ErrInUse while a write from that range is in flight and
// ErrNotRegistered for a range never registered.
func (e *Engine) DeregisterMemory(d transfer.Desc) error {
	if err := e.lock("deregister"); err != nil {
		return err
	}
	defer e.mu.Unlock()
	found := false
	for _, r := range e.reg.Ranges() {
		found = found || (r.Addr == d.Addr && r.Len == d.Len)
	}
	if !found {
		return fmt.Errorf("nixl: deregister %v: %w", d, transfer.ErrNotRegistered)
	}
	if n := e.refs[d.Addr]; n > 0 {
		return fmt.Errorf("nixl: deregister %v: %d writes in flight: %w", d, n, transfer.ErrInUse)
	}
	if st := C.bnx_deregister(e.agent, C.uint64_t(d.Addr), C.uint64_t(d.Len)); st != stSuccess {
		return fmt.Errorf("nixl: deregister %v: deregisterMem: %w", d, statusError(st))
	}
	return e.reg.Remove(d)
}

// Metadata returns NIXL's agent metadata (getLocalMD) in an envelope with
// the agent name and the registered ranges.
func (e *Engine) Metadata() ([]byte, error) {
	if err := e.lock("metadata"); err != nil {
		return nil, err
	}
	defer e.mu.Unlock()
	var p unsafe.Pointer
	var n C.size_t
	if st := C.bnx_local_md(e.agent, &p, &n); st != stSuccess {
		return nil, fmt.Errorf("nixl: metadata of %q: getLocalMD: %w", e.name, statusError(st))
	}
	md := C.GoBytes(p, C.int(n))
	C.free(p)
	return encodeMetadata(metadata{name: e.name, ranges: e.reg.Ranges(), nixlMD: md}), nil
}

// LoadPeer loads a peer's metadata (loadRemoteMD) and returns its name.
// Loading a known peer again refreshes its registered ranges; NIXL 0.1.1
// keeps the connection it already has, so a peer that restarted under the
// same name must be forgotten first. NIXL parses its part of the blob
// without defending against hostile input: load metadata from trusted peers
// only.
func (e *Engine) LoadPeer(md []byte) (string, error) {
	m, err := decodeMetadata(md)
	if err != nil {
		return "", fmt.Errorf("nixl: load peer: %w", err)
	}
	if m.name == e.name {
		return "", fmt.Errorf("nixl: load peer %q: that is this engine's own name: %w", m.name, transfer.ErrBadMetadata)
	}
	p := &peer{}
	for _, r := range m.ranges {
		if err := p.ranges.Add(r); err != nil {
			return "", fmt.Errorf("nixl: load peer %q: range %v: %v: %w", m.name, r, err, transfer.ErrBadMetadata)
		}
	}
	if err := e.lock("load peer " + m.name); err != nil {
		return "", err
	}
	defer e.mu.Unlock()
	old := e.peers[m.name]
	if old != nil && old.forgetting {
		return "", fmt.Errorf("nixl: load peer %q: ForgetPeer is still draining it: %w", m.name, transfer.ErrBusy)
	}
	var cn *C.char
	var cl C.size_t
	st := C.bnx_load_md(e.agent, unsafe.Pointer(unsafe.SliceData(m.nixlMD)), C.size_t(len(m.nixlMD)), &cn, &cl)
	if st != stSuccess {
		return "", fmt.Errorf("nixl: load peer %q: loadRemoteMD: %v: %w", m.name, statusError(st), transfer.ErrBadMetadata)
	}
	got := C.GoStringN(cn, C.int(cl))
	C.free(unsafe.Pointer(cn))
	if got != m.name {
		if old == nil {
			if _, known := e.peers[got]; !known {
				C.bnx_invalidate(e.agent, cn0(got), C.size_t(len(got)))
			}
		}
		return "", fmt.Errorf("nixl: load peer %q: NIXL metadata names agent %q: %w", m.name, got, transfer.ErrBadMetadata)
	}
	e.peers[m.name] = p
	return m.name, nil
}

// cn0 returns a pointer to s's bytes for a (pointer, length) C argument; the
// C side copies them before returning.
func cn0(s string) *C.char {
	if s == "" {
		return nil
	}
	return (*C.char)(unsafe.Pointer(unsafe.StringData(s)))
}

// ForgetPeer drops a peer: no new writes or notifications reach it, its
// in-flight writes fail with ErrPeerLost, and its metadata is invalidated
// (invalidateRemoteMD, which disconnects). Before invalidating, it waits up
// to DrainTimeout for NIXL to complete the peer's in-flight requests, so
// that each failed op is quiescent; a request still running then is
// released (cancelled) and its op fails with an error wrapping both
// ErrPeerLost and ErrNotQuiescent.
func (e *Engine) ForgetPeer(name string) error {
	if err := e.lock("forget peer " + name); err != nil {
		return err
	}
	p := e.peers[name]
	if p == nil || p.forgetting {
		e.mu.Unlock()
		return fmt.Errorf("nixl: forget peer %q: %w", name, transfer.ErrUnknownPeer)
	}
	p.forgetting = true
	lost := fmt.Errorf("nixl: write to %q: peer forgotten: %w", name, transfer.ErrPeerLost)
	var ops []*writeOp
	for w := range e.inflight {
		if w.peer == name {
			w.lost = lost
			ops = append(ops, w)
		}
	}
	e.mu.Unlock()
	e.drain(ops)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.agent != nil {
		if st := C.bnx_invalidate(e.agent, cn0(name), C.size_t(len(name))); st != stSuccess {
			e.log.Warn("invalidateRemoteMD failed", "peer", name, "err", statusError(st))
		}
	}
	if e.peers[name] == p {
		delete(e.peers, name)
	}
	return nil
}

// drain polls ops until each is terminal or DrainTimeout passed, then gives
// up on the rest: it releases their NIXL requests (which cancels them) and
// fails them as not quiescent.
func (e *Engine) drain(ops []*writeOp) {
	deadline := time.Now().Add(e.cfg.DrainTimeout)
	for len(ops) > 0 {
		e.mu.Lock()
		rest := ops[:0]
		for _, w := range ops {
			if !w.state.Terminal() {
				e.check(w)
			}
			if !w.state.Terminal() {
				rest = append(rest, w)
			}
		}
		ops = rest
		if len(ops) > 0 && time.Now().After(deadline) {
			for _, w := range ops {
				e.giveUp(w)
			}
			ops = nil
		}
		e.mu.Unlock()
		if len(ops) > 0 {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// giveUp fails a write NIXL did not complete in time; mu is held.
func (e *Engine) giveUp(w *writeOp) {
	if e.agent != nil && w.x != nil {
		if st := C.bnx_xfer_release(e.agent, w.x); st != stSuccess {
			e.log.Warn("releaseXferReq of a running write failed; request leaked", "peer", w.peer, "err", statusError(st))
		}
		w.x = nil
		delete(e.handles, w)
	}
	cause := w.lost
	if cause == nil {
		cause = transfer.ErrPeerLost
	}
	e.resolve(w, transfer.Failed, fmt.Errorf("nixl: write to %q: NIXL did not complete it within %v, released while running: %w: %w", w.peer, e.cfg.DrainTimeout, cause, transfer.ErrNotQuiescent))
}

// Close shuts the engine down; it is idempotent. New calls fail with
// ErrClosed at once. In-flight writes get up to DrainTimeout to complete
// and then fail with ErrClosed (wrapping ErrNotQuiescent too when NIXL did
// not complete them). Every peer is invalidated, every NIXL request released
// and the agent destroyed, unless a write was not quiescent: then the agent
// is leaked rather than destroyed under a live request and Close returns an
// error wrapping ErrNotQuiescent.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		e.mu.Lock()
		e.shut = true
		close(e.closed)
		lost := fmt.Errorf("nixl: engine %q closed: %w", e.name, transfer.ErrClosed)
		var ops []*writeOp
		for w := range e.inflight {
			if w.lost == nil {
				w.lost = lost
			}
			ops = append(ops, w)
		}
		e.mu.Unlock()
		close(e.stop)
		<-e.exited
		e.drain(ops)
		e.mu.Lock()
		defer e.mu.Unlock()
		leak := false
		for _, w := range ops {
			if w.err != nil && errors.Is(w.err, transfer.ErrNotQuiescent) {
				leak = true
			}
		}
		for w := range e.handles {
			C.bnx_xfer_release(e.agent, w.x)
			w.x = nil
			delete(e.handles, w)
		}
		e.settle() // let endpoints still wiring up finish before they are closed
		for name := range e.peers {
			C.bnx_invalidate(e.agent, cn0(name), C.size_t(len(name)))
			delete(e.peers, name)
		}
		e.settle() // and let the disconnects run before the worker goes
		if leak {
			e.closeErr = fmt.Errorf("nixl: close %q: writes were not quiescent; NIXL agent leaked: %w", e.name, transfer.ErrNotQuiescent)
			e.log.Error("close left NIXL writes running; agent leaked")
		} else {
			C.bnx_agent_free(e.agent)
		}
		e.agent = nil
	})
	return e.closeErr
}

// closeSettle is how long Close progresses the agent before destroying it.
// UCX 1.13 trips an assertion ("got REP message", fixed in 1.14) when a
// worker is destroyed while one of its endpoints is still wiring up, which
// a peer loaded moments before Close can be; progressing lets the
// handshake finish; Close settles before invalidating its peers and again
// before destroying the agent. (Issue #18 measured 4 of 28 whole-package
// runs aborting without settling; here one 20 ms settle after the
// invalidations still aborted 1 of 20 runs on a loaded 2-vCPU box.)
const closeSettle = 30 * time.Millisecond

// settle progresses the agent for closeSettle, discarding notifications
// that still arrive; mu is held and the background goroutine has exited.
func (e *Engine) settle() {
	for end := time.Now().Add(closeSettle); time.Now().Before(end); {
		var buf unsafe.Pointer
		var n, count C.size_t
		C.bnx_get_notifs(e.agent, &buf, &n, &count)
		if buf != nil {
			C.free(buf)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// loop is the background goroutine: getNotifs (which also progresses the
// UCX worker when NIXL's progress thread is off), handing notifications to
// the inbox. It polls at once while something arrived or writes are in
// flight and backs off to PollInterval when idle.
func (e *Engine) loop() {
	defer close(e.exited)
	const minSleep = 10 * time.Microsecond
	sleep := minSleep
	t := time.NewTimer(sleep)
	defer t.Stop()
	for {
		e.mu.Lock()
		var buf unsafe.Pointer
		var n, count C.size_t
		st := C.bnx_get_notifs(e.agent, &buf, &n, &count)
		busy := len(e.inflight) > 0
		e.mu.Unlock()
		if st < 0 {
			e.log.Warn("getNotifs failed", "err", statusError(st))
		}
		if count > 0 {
			e.deliver(C.GoBytes(buf, C.int(n)))
			C.free(buf)
			busy = true
		}
		if busy {
			sleep = minSleep
		} else {
			sleep = min(2*sleep, e.cfg.PollInterval)
		}
		t.Reset(sleep)
		select {
		case <-e.stop:
			return
		case <-e.wake:
		case <-t.C:
		}
	}
}

// deliver parses bnx_get_notifs records into the inbox.
func (e *Engine) deliver(b []byte) {
	for len(b) >= 4 {
		nl := binary.LittleEndian.Uint32(b)
		if uint64(nl)+8 > uint64(len(b)) {
			break
		}
		name := string(b[4 : 4+nl])
		b = b[4+nl:]
		ml := binary.LittleEndian.Uint32(b)
		if uint64(ml)+4 > uint64(len(b)) {
			break
		}
		m := transfer.Message{Peer: name, Payload: append([]byte{}, b[4:4+ml]...)}
		b = b[4+ml:]
		select {
		case e.inbox <- m:
		default:
			e.recvDropped.Add(1)
			e.log.Warn("receive queue full, dropped notification", "peer", name, "queue", e.cfg.RecvQueue)
		}
	}
}

// Notify sends payload to a loaded peer with genNotif. It does not block:
// NIXL sends it as one eager UCX active message. Notifications to one peer
// arrive in order; the receiver sees this engine's name as the sender. An
// unknown (or forgotten) peer is ErrUnknownPeer.
func (e *Engine) Notify(name string, payload []byte) error {
	if len(payload) > e.cfg.MaxNotifySize {
		return fmt.Errorf("nixl: notify %q: payload of %d bytes exceeds MaxNotifySize %d", name, len(payload), e.cfg.MaxNotifySize)
	}
	if err := e.lock("notify " + name); err != nil {
		return err
	}
	defer e.mu.Unlock()
	if p := e.peers[name]; p == nil || p.forgetting {
		return fmt.Errorf("nixl: notify %q: %w", name, transfer.ErrUnknownPeer)
	}
	if st := C.bnx_notify(e.agent, cn0(name), C.size_t(len(name)), unsafe.Pointer(unsafe.SliceData(payload)), C.size_t(len(payload))); st != stSuccess {
		e.notifyFailed.Add(1)
		return fmt.Errorf("nixl: notify %q: genNotif: %w", name, statusError(st))
	}
	return nil
}

// RecvNotification returns the next notification, waiting at most timeout
// (no wait when timeout <= 0). It returns ErrTimeout when none arrived and
// ErrClosed once the engine is closed.
func (e *Engine) RecvNotification(timeout time.Duration) (transfer.Message, error) {
	m, err := inbox.Receive(e.inbox, e.closed, timeout)
	if err != nil {
		return m, fmt.Errorf("nixl: receive notification: %w", err)
	}
	return m, nil
}
