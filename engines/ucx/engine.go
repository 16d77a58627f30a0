package ucx

/*
#cgo pkg-config: ucx
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// ErrMode selects how endpoints handle a failing peer.
type ErrMode uint8

const (
	// PeerErrors creates endpoints with UCP_ERR_HANDLING_MODE_PEER: a dead
	// peer fails in-flight requests and the engine reports ErrPeerLost. On
	// UCX 1.13 this restricts endpoints to transports that support it (tcp
	// here; the shared-memory transports do not).
	PeerErrors ErrMode = iota
	// NoPeerErrors creates endpoints with UCP_ERR_HANDLING_MODE_NONE so the
	// shared-memory transports (sysv/posix/cma) are usable. A peer that dies
	// is not detected: the caller must ForgetPeer it. Loopback and trusted
	// single-host setups only.
	NoPeerErrors
)

// String names the mode.
func (m ErrMode) String() string {
	switch m {
	case PeerErrors:
		return "peer"
	case NoPeerErrors:
		return "none"
	default:
		return fmt.Sprintf("errmode(%d)", uint8(m))
	}
}

// Defaults used for zero Config fields.
const (
	// DefaultFragmentSize is the largest single put; larger writes are split.
	// On UCX 1.13 here every put is emulated in 8 KiB active messages and
	// fragment sizes from 64 KiB to 64 MiB measured alike (doc.go); 1 MiB
	// keeps the request count low and lets concurrent posts interleave.
	DefaultFragmentSize = 1 << 20
	// DefaultMaxNotifySize bounds one notification's payload.
	DefaultMaxNotifySize = 64 << 10
	// DefaultNotifyQueue bounds the notifications in flight to one peer.
	DefaultNotifyQueue = 1024
	// DefaultRecvQueue bounds received notifications not yet taken.
	DefaultRecvQueue = 4096
	// DefaultDrainTimeout bounds how long Close waits for in-flight work
	// before force-closing endpoints.
	DefaultDrainTimeout = 5 * time.Second
	// DefaultCloseTimeout bounds how long Close waits for UCX to complete
	// requests cancelled by the force-close.
	DefaultCloseTimeout = 10 * time.Second
)

// Config configures an Engine. Zero fields take the defaults above.
type Config struct {
	// Name identifies this engine to peers (1..255 bytes of UTF-8).
	Name string
	// FragmentSize splits every write into puts of at most this many bytes
	// (0 = DefaultFragmentSize; otherwise 4 KiB..1 GiB).
	FragmentSize uint64
	// ErrMode is the endpoint error-handling mode (default PeerErrors).
	ErrMode ErrMode
	// MaxNotifySize bounds a notification payload (0 = default; at most 1 MiB).
	MaxNotifySize int
	// NotifyQueue bounds notifications in flight per peer; more is ErrQueueFull.
	NotifyQueue int
	// RecvQueue bounds received notifications waiting for RecvNotification;
	// messages arriving when it is full are dropped and counted.
	RecvQueue int
	// DrainTimeout bounds how long Close lets in-flight writes and sends
	// finish on their own before it force-closes the endpoints (see doc.go
	// for why Close drains first).
	DrainTimeout time.Duration
	// CloseTimeout bounds Close's wait for UCX to complete cancelled requests.
	CloseTimeout time.Duration
	// Logger receives warnings (nil = discard).
	Logger *slog.Logger
}

func (c *Config) setDefaults() error {
	if err := checkName(c.Name); err != nil {
		return fmt.Errorf("ucx: config Name: %v", err)
	}
	switch {
	case c.FragmentSize == 0:
		c.FragmentSize = DefaultFragmentSize
	case c.FragmentSize < 4<<10 || c.FragmentSize > 1<<30:
		return fmt.Errorf("ucx: config FragmentSize %d: want 0 (default %d) or 4096..%d", c.FragmentSize, DefaultFragmentSize, 1<<30)
	}
	if c.ErrMode > NoPeerErrors {
		return fmt.Errorf("ucx: config ErrMode %d: want PeerErrors (0) or NoPeerErrors (1)", c.ErrMode)
	}
	switch {
	case c.MaxNotifySize == 0:
		c.MaxNotifySize = DefaultMaxNotifySize
	case c.MaxNotifySize < 0 || c.MaxNotifySize > 1<<20:
		return fmt.Errorf("ucx: config MaxNotifySize %d: want 0 (default) or 1..%d", c.MaxNotifySize, 1<<20)
	}
	if err := intDefault(&c.NotifyQueue, DefaultNotifyQueue, "NotifyQueue"); err != nil {
		return err
	}
	if err := intDefault(&c.RecvQueue, DefaultRecvQueue, "RecvQueue"); err != nil {
		return err
	}
	if err := durDefault(&c.DrainTimeout, DefaultDrainTimeout, "DrainTimeout"); err != nil {
		return err
	}
	if err := durDefault(&c.CloseTimeout, DefaultCloseTimeout, "CloseTimeout"); err != nil {
		return err
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

func durDefault(v *time.Duration, def time.Duration, key string) error {
	switch {
	case *v == 0:
		*v = def
	case *v < 0:
		return fmt.Errorf("ucx: config %s %v: want 0 (default %v) or positive", key, *v, def)
	}
	return nil
}

func intDefault(v *int, def int, key string) error {
	switch {
	case *v == 0:
		*v = def
	case *v < 0 || *v > 1<<20:
		return fmt.Errorf("ucx: config %s %d: want 0 (default %d) or 1..%d", key, *v, def, 1<<20)
	}
	return nil
}

// Stats are counters of an engine's notification path.
type Stats struct {
	// NotifySendFailed counts notifications UCX failed to deliver.
	NotifySendFailed uint64
	// RecvDropped counts received notifications dropped because the receive
	// queue was full, UCX offered them by rendezvous, or they were malformed.
	RecvDropped uint64
}

// Engine is a transfer.Engine and transfer.Notifier over UCX. All UCX objects
// belong to one progress goroutine locked to its OS thread; every method hands
// it a command and, except Notify, waits for the answer.
type Engine struct {
	cfg  Config
	log  *slog.Logger
	name string
	reg  mem.Registry

	qmu     sync.Mutex
	queue   []func()
	stopped bool
	wakefd  int
	epfd    int

	nmu    sync.Mutex
	notify map[string]*notifyPeer
	nshut  bool
	inbox  chan transfer.Message

	closeOnce sync.Once
	closeErr  error
	closed    chan struct{}
	exited    chan struct{}

	sendFailed  atomic.Uint64
	recvDropped atomic.Uint64

	// msgHdr is the active-message header of every notification this
	// engine sends; it depends only on the name.
	msgHdr []byte

	// Owned by the progress goroutine.
	c        *C.bkv_ctx
	addr     []byte
	regions  map[uint64]*region
	peers    map[string]*peer
	eps      map[uint64]*peer
	handlers map[uint64]opHandler
	nextID   uint64
	shut     bool // Close began: no new work is accepted
	draining bool // Close lets in-flight work finish until deadline
	byeWaits int  // peers whose bye-ack Close still waits for (peer.byeWait)
	deadline time.Time
}

// opHandler finishes one C-side op: st is its first error (UCS_OK if none);
// abandoned means UCX never completed it and may still touch its memory.
type opHandler func(st C.ucs_status_t, abandoned bool)

// notifyPeer is the caller-visible notification state of one peer.
type notifyPeer struct {
	outstanding int
	lost        error
}

var _ transfer.Engine = (*Engine)(nil)
var _ transfer.Notifier = (*Engine)(nil)

// spinRounds is how many empty progress rounds the progress goroutine spins
// through while requests are outstanding before it sleeps on the event fd.
const spinRounds = 256

// New creates an engine: a UCP context (RMA and active messages), one worker
// and its progress goroutine. UCX reads its usual environment (UCX_TLS,
// UCX_NET_DEVICES, ...).
func New(cfg Config) (*Engine, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	e := &Engine{
		cfg:      cfg,
		log:      cfg.Logger.With("engine", "ucx", "name", cfg.Name),
		name:     cfg.Name,
		msgHdr:   encodeAMHeader(amKindMsg, cfg.Name),
		notify:   make(map[string]*notifyPeer),
		inbox:    make(chan transfer.Message, cfg.RecvQueue),
		closed:   make(chan struct{}),
		exited:   make(chan struct{}),
		regions:  make(map[uint64]*region),
		peers:    make(map[string]*peer),
		eps:      make(map[uint64]*peer),
		handlers: make(map[uint64]opHandler),
	}
	var err error
	if e.wakefd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("ucx: new %q: eventfd: %w", cfg.Name, err)
	}
	if e.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		unix.Close(e.wakefd)
		return nil, fmt.Errorf("ucx: new %q: epoll: %w", cfg.Name, err)
	}
	ready := make(chan error, 1)
	go e.loop(ready)
	if err := <-ready; err != nil {
		<-e.exited
		unix.Close(e.epfd)
		unix.Close(e.wakefd)
		return nil, err
	}
	return e, nil
}

// Name returns the engine's name.
func (e *Engine) Name() string { return e.name }

// RouteCosts declares the engine's costs for route auto: one ucp_put_nbx
// per descriptor (~1 µs with its bookkeeping), a flush per write (~30 µs)
// and a few GB/s on one host's transports. The agent refines them from
// observed transfers.
func (e *Engine) RouteCosts() (postPerDesc, perWrite time.Duration, bandwidth float64) {
	return time.Microsecond, 30 * time.Microsecond, 3e9
}

// MaxNotifySize returns the largest payload Notify accepts
// (Config.MaxNotifySize).
func (e *Engine) MaxNotifySize() int { return e.cfg.MaxNotifySize }

// Stats returns the notification counters.
func (e *Engine) Stats() Stats {
	return Stats{NotifySendFailed: e.sendFailed.Load(), RecvDropped: e.recvDropped.Load()}
}

func statusString(st C.ucs_status_t) string { return C.GoString(C.ucs_status_string(st)) }

// initUCX runs on the progress thread.
func (e *Engine) initUCX() error {
	var efd C.int
	var maxHdr C.size_t
	if st := C.bkv_init(&e.c, &efd, &maxHdr); st != C.UCS_OK {
		return fmt.Errorf("ucx: new %q: init UCP: %s", e.name, statusString(st))
	}
	maxAMHdr := int(maxHdr)
	fail := func(err error) error {
		C.bkv_destroy(e.c)
		e.c = nil
		return err
	}
	if maxAMHdr < 5+maxNameLen {
		return fail(fmt.Errorf("ucx: new %q: UCX allows %d-byte active-message headers, need %d", e.name, maxAMHdr, 5+maxNameLen))
	}
	var p unsafe.Pointer
	var n C.size_t
	if st := C.bkv_worker_address(e.c, &p, &n); st != C.UCS_OK {
		return fail(fmt.Errorf("ucx: new %q: worker address: %s", e.name, statusString(st)))
	}
	e.addr = C.GoBytes(p, C.int(n))
	C.free(p)
	if len(e.addr) > maxAddrLen {
		return fail(fmt.Errorf("ucx: new %q: worker address of %d bytes exceeds %d", e.name, len(e.addr), maxAddrLen))
	}
	for _, fd := range []int{int(efd), e.wakefd} {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
		if err := unix.EpollCtl(e.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return fail(fmt.Errorf("ucx: new %q: epoll add fd %d: %w", e.name, fd, err))
		}
	}
	return nil
}

// loop is the progress goroutine: it runs commands, progresses the worker,
// reaps completions and sleeps on the worker's event fd when nothing is
// outstanding (or after spinRounds empty rounds when something is).
func (e *Engine) loop(ready chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(e.exited)
	if err := e.initUCX(); err != nil {
		ready <- err
		return
	}
	ready <- nil
	events := make([]unix.EpollEvent, 4)
	idle := 0
	for {
		e.runQueue()
		if e.shut && e.shutdownStep() {
			break
		}
		n := C.bkv_progress(e.c)
		e.reap()
		if n > 0 {
			idle = 0
			continue
		}
		timeout := 100 // ms; a periodic progress also runs UCX keepalive
		if len(e.handlers) > 0 {
			if idle < spinRounds {
				idle++
				continue
			}
			timeout = 1
		}
		if C.ucp_worker_arm(e.c.worker) == C.UCS_ERR_BUSY {
			continue
		}
		nev, err := unix.EpollWait(e.epfd, events, timeout)
		if err != nil && !errors.Is(err, unix.EINTR) {
			e.log.Error("epoll_wait failed", "err", err)
		}
		for i := 0; i < nev; i++ {
			if int(events[i].Fd) == e.wakefd {
				var buf [8]byte
				unix.Read(e.wakefd, buf[:])
			}
		}
	}
	e.qmu.Lock()
	e.stopped = true
	q := e.queue
	e.queue = nil
	e.qmu.Unlock()
	for _, f := range q {
		f() // every command checks e.shut and answers ErrClosed
	}
}

func (e *Engine) runQueue() {
	e.qmu.Lock()
	q := e.queue
	e.queue = nil
	e.qmu.Unlock()
	for _, f := range q {
		f()
	}
}

// submit queues f for the progress goroutine.
func (e *Engine) submit(f func()) error {
	e.qmu.Lock()
	if e.stopped {
		e.qmu.Unlock()
		return transfer.ErrClosed
	}
	wake := len(e.queue) == 0
	e.queue = append(e.queue, f)
	e.qmu.Unlock()
	if wake {
		one := [8]byte{1}
		unix.Write(e.wakefd, one[:])
	}
	return nil
}

// call runs f on the progress goroutine and returns its error; once the
// engine is shut down it returns ErrClosed without running f.
func (e *Engine) call(what string, f func() error) error {
	ch := make(chan error, 1)
	err := e.submit(func() {
		if e.shut {
			ch <- fmt.Errorf("ucx: %s: engine %q: %w", what, e.name, transfer.ErrClosed)
			return
		}
		ch <- f()
	})
	if err != nil {
		return fmt.Errorf("ucx: %s: engine %q: %w", what, e.name, err)
	}
	return <-ch
}

// newOp starts a C-side op whose completion runs h on the progress thread.
// The caller posts requests against it and then calls C.bkv_op_post_done.
func (e *Engine) newOp(h opHandler) (*C.bkv_op, error) {
	e.nextID++
	op := C.bkv_op_new(e.c, C.uint64_t(e.nextID))
	if op == nil {
		return nil, errors.New("out of memory for an op")
	}
	e.handlers[e.nextID] = h
	return op, nil
}

// reap drains what the UCX callbacks recorded: endpoint errors first (so the
// ops they fail see the peer as lost), then finished ops, then messages.
func (e *Engine) reap() {
	for er := C.bkv_take_errs(e.c); er != nil; {
		next := er.next
		if p := e.eps[uint64(er.ep_id)]; p != nil {
			e.peerFailed(p, er.status)
		}
		C.free(unsafe.Pointer(er))
		er = next
	}
	for op := C.bkv_take_done(e.c); op != nil; {
		next := op.next
		id, st := uint64(op.id), op.status
		C.bkv_op_free(op)
		if h := e.handlers[id]; h != nil {
			delete(e.handlers, id)
			h(st, false)
		}
		op = next
	}
	for m := C.bkv_take_msgs(e.c); m != nil; {
		next := m.next
		all := unsafe.Slice((*byte)(unsafe.Pointer(C.bkv_msg_bytes(m))), int(m.hlen+m.dlen))
		e.received(all[:m.hlen], all[m.hlen:])
		C.free(unsafe.Pointer(m))
		m = next
	}
	if d := uint64(e.c.am_dropped); d != 0 {
		e.c.am_dropped = 0
		e.recvDropped.Add(d)
		e.log.Warn("dropped active messages in the UCX handler (rendezvous or out of memory)", "count", d)
	}
}

// Close shuts the engine down; it is idempotent. New calls fail with
// ErrClosed at once. In-flight writes and notifications get up to
// DrainTimeout to finish on their own (a write that completes then is Done);
// then every endpoint is force-closed, whatever is left fails with
// ErrClosed once UCX has completed its cancelled requests (up to
// CloseTimeout), and memory is unmapped and the worker and context are
// destroyed. If UCX does not complete every request in time, the affected
// ops fail with ErrNotQuiescent, UCX objects are leaked rather than
// destroyed under live requests, and Close returns an error wrapping
// ErrNotQuiescent.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		e.nmu.Lock()
		e.nshut = true
		e.nmu.Unlock()
		if err := e.submit(e.beginShutdown); err != nil {
			e.closeErr = err
		}
		<-e.exited
		unix.Close(e.epfd)
		unix.Close(e.wakefd)
		close(e.closed)
	})
	return e.closeErr
}

func (e *Engine) beginShutdown() {
	if e.shut {
		return
	}
	e.shut = true
	e.draining = true
	e.deadline = time.Now().Add(e.cfg.DrainTimeout)
	e.sayBye()
}

// sayBye tells every peer this engine loaded, wrote to, notified or heard
// from that it is closing, and has Close wait (within DrainTimeout) for
// the ack of each one that surely holds an endpoint to this engine: one
// that sent a hello or notification here, or was sent a hello (LoadPeer
// sends one, so a peer only loaded, with nothing exchanged yet, is waited
// for too). The peer marks this engine departed before it acks, and this
// engine's worker goes only after the ack, so the peer's endpoint failing
// then is logged as the expected end (Debug), never as a fault; a bye
// alone would race the peer's endpoint error callback. A peer that fails
// meanwhile, or never acks, ends the wait (its endpoint error, or
// DrainTimeout). An engine that is killed says nothing, so its peers
// still log the loss as a warning.
func (e *Engine) sayBye() {
	hdr := encodeAMHeader(amKindBye, e.name)
	for _, p := range e.peers {
		if p.ep == nil || p.state.lost != nil || !p.used && !p.heard && !p.helloSent {
			continue
		}
		name := p.name
		e.amSend(p, hdr, len(hdr), func(st C.ucs_status_t) {
			if st != C.UCS_OK {
				e.log.Debug("bye not delivered", "peer", name, "status", statusString(st))
			}
		})
		if p.heard || p.helloSent {
			p.byeWait = true
			e.byeWaits++
		}
	}
}

// byeReceived handles a peer's bye: it is closing its engine, so its
// endpoint failing next is its end. The ack goes back on this engine's
// endpoint to it, after departed is set.
func (e *Engine) byeReceived(name string) {
	p := e.peers[name]
	if p == nil {
		return
	}
	p.departed = true
	e.nmu.Lock()
	if p.np != nil && p.np.lost == nil {
		p.np.lost = departedErr(name)
	}
	e.nmu.Unlock()
	if p.ep == nil || p.state.lost != nil {
		return
	}
	hdr := encodeAMHeader(amKindByeAck, e.name)
	e.amSend(p, hdr, len(hdr), func(st C.ucs_status_t) {
		if st != C.UCS_OK {
			e.log.Debug("bye-ack not delivered", "peer", name, "status", statusString(st))
		}
	})
}

// departedErr is the error of a write or notification to a peer that said
// bye: it is closing its engine.
func departedErr(name string) error {
	return fmt.Errorf("ucx: peer %q closed its engine (it said bye): %w", name, transfer.ErrPeerLost)
}

// byeDone ends Close's wait for p's bye-ack: it came, or p's endpoint is
// gone.
func (e *Engine) byeDone(p *peer) {
	if p.byeWait {
		p.byeWait = false
		e.byeWaits--
	}
}

// shutdownStep advances Close on the progress thread and reports whether
// the engine is finished. It first lets in-flight requests complete on their
// own (until DrainTimeout), then force-closes every endpoint and waits for
// UCX to complete what that cancelled (until CloseTimeout).
func (e *Engine) shutdownStep() bool {
	now := time.Now()
	if e.draining && (len(e.handlers) == 0 && e.byeWaits == 0 || now.After(e.deadline)) {
		e.draining = false
		e.deadline = now.Add(e.cfg.CloseTimeout)
		for _, p := range e.peers {
			e.dropPeer(p, fmt.Errorf("ucx: engine %q closed: %w", e.name, transfer.ErrClosed))
		}
	}
	if !e.draining && (len(e.handlers) == 0 || now.After(e.deadline)) {
		e.finish()
		return true
	}
	return false
}

// finish runs on the progress thread once shutdown drained or timed out.
func (e *Engine) finish() {
	if n := len(e.handlers); n > 0 {
		for id, h := range e.handlers {
			delete(e.handlers, id)
			h(C.UCS_ERR_TIMED_OUT, true)
		}
		e.closeErr = fmt.Errorf("ucx: close %q: %d requests still pending after %v; UCX objects leaked: %w", e.name, n, e.cfg.CloseTimeout, transfer.ErrNotQuiescent)
		e.log.Error("close left UCX requests pending", "count", n)
		return
	}
	for _, p := range e.peers {
		p.releaseRanges()
	}
	for _, r := range e.regions {
		C.ucp_mem_unmap(e.c.context, r.memh)
	}
	e.regions = nil
	C.bkv_destroy(e.c)
	e.c = nil
}
