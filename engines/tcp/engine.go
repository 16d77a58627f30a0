package tcp

import (
	"errors"
	"fmt"
	"github.com/bouncekv/bounce/internal/inbox"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// Engine is a transfer.Engine and transfer.Notifier over TCP. See the
// package documentation for the protocol, the connection model and the
// bounds on failure detection.
type Engine struct {
	cfg  Config
	log  *slog.Logger
	ln   net.Listener
	addr string // advertised address

	// memMu orders registration changes against validation and pinning:
	// validators hold it for reading, (de)registration for writing.
	memMu sync.RWMutex
	reg   mem.Registry

	mu       sync.Mutex // guards closed, peers, incoming, forgotten and wg.Add
	closed   bool
	peers    map[string]*peer
	incoming map[*inConn]struct{}
	// forgotten holds the peers ForgetPeer dropped and LoadPeer has not
	// loaded again, each for FenceHold: their HELLO is refused, so no
	// connection of theirs, however far its setup had got, lands a byte
	// while the agent may have granted their regions to others.
	forgotten *fenceSet
	// inc is this engine's incarnation (metadata.inc), random per engine.
	inc uint64
	// lostInc holds, per name whose last incoming connection ended, that
	// connection's incarnation: the one a ForgetPeer after the loss report
	// fences (at most MaxForgotten names; past it one is dropped, and its
	// fence refuses every incarnation).
	lostInc map[string]uint64
	now     func() time.Time  // the fence's clock; time.Now but in tests
	onLost  func(peer string) // SetPeerLost's callback
	wg      sync.WaitGroup

	done      chan struct{} // closed by Close
	closeOnce sync.Once
	closeErr  error
	recvq     chan transfer.Message
	wake      inbox.Wake // ends a RecvNotification's wait (WakeRecvNotification)
	nextID    atomic.Uint64

	pending atomic.Int64 // incoming connections not yet admitted
	guard   atomic.Pointer[transfer.WriteGuard]
	rguard  atomic.Pointer[transfer.ReadGuard] // nil: no read is served
	// authn authenticates connections: Config.Peers' when enabled, or
	// the one SetAuthenticator installed; nil keeps the unauthenticated
	// protocol.
	authn  atomic.Pointer[authBox]
	stats  counters
	stage  *stager // nil unless Config.Device: the device staging rings
	bodies *bodyBudget
	stalls stallGate // StallWrites
	// landHold, when set (by this package's tests, before any read), runs
	// before each piece of a read's response lands, with a channel closed
	// once the connection is given up; it must return by then. It stalls a
	// reader's draining on purpose.
	landHold func(abort <-chan struct{})
}

// counters are the engine's security counters.
type counters struct {
	unauthenticated, refusedConns, slowConns, forbiddenWrites, fenceEvictions, fencedWrites, foreignAddrs atomic.Uint64
	forbiddenReads, fencedReads                                                                           atomic.Uint64
}

// Stats are the engine's cumulative security counters and two gauges
// (Fenced, IncomingConns).
type Stats struct {
	// Unauthenticated counts incoming connections refused for their
	// handshake: no handshake (a plain HELLO), a key that is not admitted,
	// a handshake to another key, or a HELLO naming another agent.
	Unauthenticated uint64
	// RefusedConns counts connections closed to enforce a cap: the oldest
	// connection still in setup when a new one exceeds MaxPendingConns, or
	// one over MaxConnsPerPeer for its peer or over MaxIncomingConns in
	// all.
	RefusedConns uint64
	// SlowConns counts incoming connections cut by a read deadline (a
	// handshake, HELLO or frame that did not arrive in time).
	SlowConns uint64
	// ForbiddenWrites counts incoming writes the write guard refused
	// (NACKed with ErrForbidden; nothing of them landed).
	ForbiddenWrites uint64
	// ForbiddenReads counts incoming reads refused (NACKed with
	// ErrForbidden; nothing of them was sent): the read guard did not
	// allow them, or none was installed.
	ForbiddenReads uint64
	// FencedReads counts read responses cut by FenceReads: their grant
	// ended while they were still being sent.
	FencedReads uint64
	// FenceEvictions counts forgotten peers whose fence was dropped before
	// FenceHold ended because MaxForgotten names were already held.
	FenceEvictions uint64
	// FencedWrites counts incoming frames cut by FenceWrites: their
	// authorization ended while their payload was still arriving.
	FencedWrites uint64
	// ForeignAddrs counts HELLOs of peers not loaded here whose advertised
	// address is on another host than their connection's: such a peer is
	// not dialed back (writes and notifications to it fail).
	ForeignAddrs uint64
	// Fenced is the number of forgotten peers refused now (a gauge).
	Fenced int
	// IncomingConns is the number of connections peers dialed here that
	// their HELLO named (a gauge; connections still in setup excluded).
	IncomingConns int
	// BodyBytes is the memory held by large incoming frame bodies being
	// received (a gauge, at most Config.MaxBodyBytes).
	BodyBytes int64
}

// Stats returns a snapshot of the engine's counters and gauges.
func (e *Engine) Stats() Stats {
	st := Stats{
		Unauthenticated: e.stats.unauthenticated.Load(),
		RefusedConns:    e.stats.refusedConns.Load(),
		SlowConns:       e.stats.slowConns.Load(),
		ForbiddenWrites: e.stats.forbiddenWrites.Load(),
		ForbiddenReads:  e.stats.forbiddenReads.Load(),
		FencedReads:     e.stats.fencedReads.Load(),
		FenceEvictions:  e.stats.fenceEvictions.Load(),
		FencedWrites:    e.stats.fencedWrites.Load(),
		ForeignAddrs:    e.stats.foreignAddrs.Load(),
		BodyBytes:       e.bodies.inUse(),
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.forgotten.prune(e.now())
	st.Fenced = e.forgotten.len()
	for ic := range e.incoming {
		if ic.name.Load() != nil {
			st.IncomingConns++
		}
	}
	return st
}

// Refusals counts what this engine refused from peers, by reason:
// not_admitted (a connection whose handshake or HELLO failed), over_cap
// (closed to keep a connection cap), slow (cut by a read deadline) and
// forbidden_write (a write the write guard refused) and forbidden_read (a
// read the read guard refused).
func (e *Engine) Refusals() map[string]uint64 {
	return map[string]uint64{
		"not_admitted":    e.stats.unauthenticated.Load(),
		"over_cap":        e.stats.refusedConns.Load(),
		"slow":            e.stats.slowConns.Load(),
		"forbidden_write": e.stats.forbiddenWrites.Load(),
		"forbidden_read":  e.stats.forbiddenReads.Load(),
	}
}

// SetWriteGuard installs g; every incoming write is checked against it
// before a byte lands (transfer.WriteGuarded). Nil removes it.
func (e *Engine) SetWriteGuard(g transfer.WriteGuard) {
	if g == nil {
		e.guard.Store(nil)
		return
	}
	e.guard.Store(&g)
}

// authBox holds an Authenticator in an atomic.Pointer.
type authBox struct{ a transfer.Authenticator }

// authenticator returns what authenticates connections, nil for none.
func (e *Engine) authenticator() transfer.Authenticator {
	if b := e.authn.Load(); b != nil {
		return b.a
	}
	return nil
}

// SetAuthenticator makes every connection from now on authenticated with
// a (transfer.Authenticating): the handshake's static key is the one a
// holds (a computes its DH products) and a's admitted set names the peer
// of each incoming connection. It is how an engine in a plugin process,
// which holds no keys, authenticates with the agent's (docs/SECURITY.md).
// Incoming connections accepted before are closed, so no write lands
// under a name only claimed; outgoing ones keep their protocol until they
// break. nil restores Config.Peers (none when it is off).
func (e *Engine) SetAuthenticator(a transfer.Authenticator) {
	if a == nil {
		a = e.cfg.Peers.Authenticator()
	}
	if a == nil {
		e.authn.Store(nil)
	} else {
		e.authn.Store(&authBox{a})
	}
	e.mu.Lock()
	ins := make([]*inConn, 0, len(e.incoming))
	for ic := range e.incoming {
		ic.cut.Store(true)
		ins = append(ins, ic)
	}
	e.mu.Unlock()
	for _, ic := range ins {
		ic.abort()
	}
}

var (
	_ transfer.Engine         = (*Engine)(nil)
	_ transfer.Authenticating = (*Engine)(nil)
	_ transfer.WriteFencer    = (*Engine)(nil)
	_ transfer.Notifier       = (*Engine)(nil)
	_ transfer.Writer         = (*Engine)(nil)
	_ transfer.Fencer         = (*Engine)(nil)
	_ transfer.Connector      = (*Engine)(nil)

	_ transfer.WriteGuarded = (*Engine)(nil)
	_ transfer.Reader       = (*Engine)(nil)
	_ transfer.ReadGuarded  = (*Engine)(nil)
	_ transfer.StagedKinder = (*Engine)(nil)
)

// New validates cfg, listens on cfg.Listen at once and starts accepting
// peer connections. Close releases everything. New owns cfg.Device from
// the call on: Close closes it, and so does New when it fails.
func New(cfg Config) (*Engine, error) {
	e, err := newEngine(cfg)
	if err != nil && cfg.Device != nil {
		if cerr := cfg.Device.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("tcp: close device memory: %w", cerr))
		}
	}
	return e, err
}

func newEngine(cfg Config) (*Engine, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Advertise == "" {
		host, _, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("tcp: engine %q: listen address %q: %w: %w", cfg.Name, cfg.Listen, err, transfer.ErrBadEndpoint)
		}
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			return nil, fmt.Errorf("tcp: engine %q: listen address %q is a wildcard: set Advertise to an address peers can dial: %w", cfg.Name, cfg.Listen, transfer.ErrBadEndpoint)
		}
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("tcp: engine %q: listen %q: %w: %w", cfg.Name, cfg.Listen, err, transfer.ErrBadEndpoint)
	}
	addr := cfg.Advertise
	if addr == "" {
		ta, ok := ln.Addr().(*net.TCPAddr)
		if !ok || ta.IP.IsUnspecified() {
			ln.Close()
			return nil, fmt.Errorf("tcp: engine %q: listening on wildcard %v: set Advertise to an address peers can dial: %w", cfg.Name, ln.Addr(), transfer.ErrBadEndpoint)
		}
		addr = ta.String()
	}
	var st *stager
	if cfg.Device != nil {
		if st, err = newStager(cfg.Device, cfg.StageBuffers, cfg.StageBytes, cfg.FrameTimeout); err != nil {
			ln.Close()
			return nil, fmt.Errorf("tcp: engine %q: %w", cfg.Name, err)
		}
	}
	e := &Engine{
		stage:     st,
		cfg:       cfg,
		log:       cfg.Logger.With("engine", cfg.Name),
		ln:        ln,
		addr:      addr,
		peers:     make(map[string]*peer),
		incoming:  make(map[*inConn]struct{}),
		forgotten: newFenceSet(cfg.FenceHold, cfg.MaxForgotten),
		inc:       rand.Uint64() | 1, // never zero (unknown)
		lostInc:   make(map[string]uint64),
		now:       time.Now,
		done:      make(chan struct{}),
		recvq:     make(chan transfer.Message, cfg.RecvQueue),
		wake:      inbox.NewWake(),
		bodies:    newBodyBudget(int64(cfg.MaxBodyBytes), int64(cfg.MaxBodyBytesPerPeer)),
	}
	if a := cfg.Peers.Authenticator(); a != nil {
		e.authn.Store(&authBox{a})
	}
	e.wg.Add(1)
	go e.acceptLoop()
	return e, nil
}

// Name returns the configured engine name.
func (e *Engine) Name() string { return e.cfg.Name }

// RouteCosts declares the engine's costs for route auto: a descriptor
// costs a segment header on the sender and a read into its destination on
// the receiver (~1 µs together, measured on a 2-vCPU box: 36,864 x 2 KiB
// direct in 97 ms against ~37 ms for the same bytes in one descriptor), one
// write costs a frame round trip (~50 µs on loopback) and the bulk
// bandwidth is a few GB/s. The agent refines them from observed transfers.
func (e *Engine) RouteCosts() (postPerDesc, perWrite time.Duration, bandwidth float64) {
	return time.Microsecond, 50 * time.Microsecond, 2e9
}

// StagedMemoryKinds lists the device memory kind Config.Device carries
// (transfer.StagedKinder): the direct path moves it with a copy per
// descriptor through the staging buffers on each side. None without it.
func (e *Engine) StagedMemoryKinds() []transfer.MemKind {
	if e.stage == nil {
		return nil
	}
	return []transfer.MemKind{e.stage.dev.Kind()}
}

// carries reports whether the engine moves memory of kind k.
func (e *Engine) carries(k transfer.MemKind) bool {
	return k == transfer.Host || e.stage != nil && k == e.stage.dev.Kind()
}

// MaxNotifySize returns the largest payload Notify accepts (MaxNotification).
func (e *Engine) MaxNotifySize() int { return MaxNotification }

// Addr returns the address advertised in Metadata.
func (e *Engine) Addr() string { return e.addr }

// spawn runs f on a goroutine tracked by Close, unless the engine is closed.
func (e *Engine) spawn(f func()) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		f()
	}()
	return true
}

func (e *Engine) isClosed() bool {
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}

// RegisterMemory makes host memory d usable as a write source and as a
// destination peers may write. Non-host memory is ErrUnsupported.
func (e *Engine) RegisterMemory(d transfer.Desc) error {
	if e.isClosed() {
		return fmt.Errorf("tcp: register %v: %w", d, transfer.ErrClosed)
	}
	if !e.carries(d.Kind) {
		return fmt.Errorf("tcp: register %v: only host memory (and device memory with Config.Device): %w", d, transfer.ErrUnsupported)
	}
	e.memMu.Lock()
	defer e.memMu.Unlock()
	if len(e.reg.Ranges()) >= MaxRanges {
		return fmt.Errorf("tcp: register %v: %d ranges already registered", d, MaxRanges)
	}
	if err := e.reg.Add(d); err != nil {
		return fmt.Errorf("tcp: register: %w", err)
	}
	return nil
}

// DeregisterMemory removes exactly the registered range d. It returns
// ErrInUse while an outgoing write reads from it or an incoming write is
// landing in it.
func (e *Engine) DeregisterMemory(d transfer.Desc) error {
	e.memMu.Lock()
	defer e.memMu.Unlock()
	if err := e.reg.Remove(d); err != nil { // refuses ranges pinned by transfers in flight
		return fmt.Errorf("tcp: deregister: %w", err)
	}
	return nil
}

// Metadata returns the versioned blob a peer passes to LoadPeer: this
// engine's name, advertised address and registered ranges.
func (e *Engine) Metadata() ([]byte, error) {
	if e.isClosed() {
		return nil, fmt.Errorf("tcp: metadata of %q: %w", e.cfg.Name, transfer.ErrClosed)
	}
	return e.metadata(), nil
}

func (e *Engine) metadata() []byte {
	return encodeMetadata(metadata{name: e.cfg.Name, addr: e.addr, ranges: e.reg.Ranges(), inc: e.inc})
}

// LoadPeer decodes a peer's metadata and records the peer. Loading a known
// peer again with the same address refreshes its ranges and keeps its
// connections; a new address replaces the peer (its in-flight writes fail
// with ErrPeerLost). Connections are dialed lazily, on the first write or
// notification. Loading a forgotten peer admits its connections again.
// Bad metadata is ErrBadMetadata with the reason.
func (e *Engine) LoadPeer(md []byte) (string, error) {
	m, err := decodeMetadata(md)
	if err != nil {
		return "", err
	}
	old, err := e.addPeer(m)
	if err != nil {
		return "", err
	}
	if old != nil {
		old.shutdown(fmt.Errorf("tcp: peer %q moved from %s to %s: %w", m.name, old.addr, m.addr, transfer.ErrPeerLost))
	}
	return m.name, nil
}

// Connect opens the first connection to a loaded peer now rather than at
// the first write (transfer.Connector): the peer then learns at once, from
// that connection ending, when this process dies (SetPeerLost), even if it
// never wrote. LoadPeer does not dial: the peer may not admit this engine
// yet, and a refused handshake counts as Unauthenticated there. A dial
// that fails fails nothing; the first write dials again.
func (e *Engine) Connect(name string) {
	e.mu.Lock()
	p := e.peers[name]
	e.mu.Unlock()
	if p == nil || len(p.slots) == 0 {
		return
	}
	s := p.slots[0]
	s.mu.Lock()
	idle := s.sess == nil
	s.mu.Unlock()
	if idle {
		s.push(nil)
	}
}

// addPeer records m, which a caller loaded, and admits the peer again if
// it was forgotten. It returns a replaced peer for the caller to shut down
// outside the lock.
func (e *Engine) addPeer(m metadata) (*peer, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, fmt.Errorf("tcp: load peer %q: %w", m.name, transfer.ErrClosed)
	}
	e.forgotten.remove(m.name)
	old := e.peers[m.name]
	if old != nil && old.addr == m.addr {
		old.setRanges(m.ranges)
		old.learned = false
		return nil, nil
	}
	e.peers[m.name] = newPeer(e, m)
	return old, nil
}

// ForgetPeer drops the peer, closes its connections (both directions) and
// fails its in-flight writes with ErrPeerLost. It is a fence on the target
// side too: from the moment it takes effect the peer is refused — a
// connection of the peer not yet named by its HELLO (still dialing, or
// accepted with its HELLO unread) is closed when the HELLO names it, and
// every named one is cut before its next frame — until LoadPeer loads the
// peer again or FenceHold passed (the fence holds at most MaxForgotten
// names; see Config). It returns once the peer's writes are terminal and its named
// connections have stopped serving (a read into local memory in progress
// included), so no byte the peer sent, or sends later, lands in registered
// memory after it returns. A peer that only wrote to us (never loaded
// here) is forgotten the same way; a name this engine never heard of is
// ErrUnknownPeer, and is refused all the same.
func (e *Engine) ForgetPeer(name string) error {
	e.mu.Lock()
	p := e.peers[name]
	delete(e.peers, name)
	// The fence refuses the incarnations of the peer this engine knew: its
	// loaded or learned entry, its connections, the one whose connections
	// ended (the loss that led here). A new incarnation (the process
	// restarted with its key) is admitted at once.
	var incs []uint64
	if p != nil {
		incs = append(incs, p.inc)
	}
	if inc, ok := e.lostInc[name]; ok {
		incs = append(incs, inc)
		delete(e.lostInc, name)
	}
	for ic := range e.incoming {
		if n := ic.name.Load(); n != nil && *n == name {
			incs = append(incs, ic.inc)
		}
	}
	if n := e.forgotten.add(name, incs, e.now()); n > 0 {
		total := e.stats.fenceEvictions.Add(uint64(n))
		if total&(total-1) == 0 {
			e.log.Warn("tcp: forgotten peers unfenced before their hold ended: too many forgotten at once",
				"max_forgotten", e.cfg.MaxForgotten, "fence_hold", e.cfg.FenceHold, "evicted_total", total)
		}
	}
	var ins []*inConn
	for ic := range e.incoming {
		if n := ic.name.Load(); n != nil && *n == name {
			ic.cut.Store(true)
			ins = append(ins, ic)
		}
	}
	e.mu.Unlock()
	for _, ic := range ins {
		ic.abort()
	}
	for _, ic := range ins {
		<-ic.served
	}
	if p != nil {
		p.shutdown(fmt.Errorf("tcp: peer %q forgotten: %w", name, transfer.ErrPeerLost))
	}
	if p == nil && len(ins) == 0 {
		return fmt.Errorf("tcp: forget peer %q: %w", name, transfer.ErrUnknownPeer)
	}
	return nil
}

// SetPeerLost registers fn, called with a peer's name when the last
// connection that peer dialed to this engine ended without ForgetPeer
// (closed, reset, or timed out), or when the last connection this engine
// dialed to the peer broke by itself (transfer.PeerLossReporter).
func (e *Engine) SetPeerLost(fn func(peer string)) {
	e.mu.Lock()
	e.onLost = fn
	e.mu.Unlock()
}

// FencesForgottenPeers reports true: ForgetPeer cuts every connection of
// the peer, refuses the ones still being set up and keeps refusing the
// peer until it is loaded again or Config.FenceHold (the agent's
// quarantine) passed (transfer.Fencer).
func (e *Engine) FencesForgottenPeers() bool { return true }

func (e *Engine) peer(name string) (*peer, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, transfer.ErrClosed
	}
	p := e.peers[name]
	if p == nil {
		return nil, transfer.ErrUnknownPeer
	}
	return p, nil
}

// Write posts a single write; it implements transfer.Writer.
func (e *Engine) Write(peer string, src, dst transfer.Desc) (transfer.Op, error) {
	return e.PostWrite(peer, []transfer.WriteOp{{Src: src, Dst: dst}})
}

// PostWrite checks every source against this engine's registered memory and
// every destination against the ranges the peer advertised, then sends the
// writes as one operation, striped over the peer's connections when large.
// Zero-length writes are allowed and move nothing.
func (e *Engine) PostWrite(peerName string, ops []transfer.WriteOp) (transfer.Op, error) {
	p, err := e.peer(peerName)
	if err != nil {
		return nil, fmt.Errorf("tcp: post write to %q: %w", peerName, err)
	}
	var total uint64
	staged := false // a source in device memory: parts are staged
	for i, op := range ops {
		if op.Src.Len != op.Dst.Len {
			return nil, fmt.Errorf("tcp: post write to %q: op %d: source length %d != destination length %d: %w", peerName, i, op.Src.Len, op.Dst.Len, transfer.ErrOutOfBounds)
		}
		if op.Src.Len == 0 {
			continue
		}
		if !e.carries(op.Src.Kind) || !e.carries(op.Dst.Kind) {
			return nil, fmt.Errorf("tcp: post write to %q: op %d: %v -> %v: only host memory (and device memory with Config.Device): %w", peerName, i, op.Src, op.Dst, transfer.ErrUnsupported)
		}
		total += op.Src.Len
		staged = staged || op.Src.Kind != transfer.Host
	}
	if err := checkRemote(p, ops, writeDst, "destination"); err != nil {
		return nil, fmt.Errorf("tcp: post write to %q: %w", peerName, err)
	}
	pins, err := pinLocal(e, ops, writeSrc, "source")
	if err != nil {
		return nil, fmt.Errorf("tcp: post write to %q: %w", peerName, err)
	}
	parts := e.split(ops, total, p, staged)
	o := newWriteOp(e, peerName, len(parts), pins)
	for _, pt := range parts {
		pt.op = o
	}
	p.enqueue(parts)
	return o, nil
}

// pinLocal checks every op's local range (side(op): a write's source, a
// read's destination; named by what) against the registry and pins the
// ranges they use, atomically with respect to DeregisterMemory.
func pinLocal[Op any](e *Engine, ops []Op, side func(Op) transfer.Desc, what string) ([]uint64, error) {
	e.memMu.RLock()
	defer e.memMu.RUnlock()
	var pins []uint64
	var last transfer.Desc
	for i, op := range ops {
		d := side(op)
		if d.Len == 0 || last.Len > 0 && last.Contains(d.Addr, d.Len) {
			continue
		}
		r, err := e.reg.FindKind(d.Kind, d.Device, d.Addr, d.Len)
		if err != nil {
			return nil, fmt.Errorf("op %d %s: %w", i, what, err)
		}
		last = r
		if !slices.Contains(pins, r.Addr) {
			pins = append(pins, r.Addr)
		}
	}
	if err := e.reg.Pin(pins); err != nil {
		return nil, err
	}
	return pins, nil
}

func writeSrc(op transfer.WriteOp) transfer.Desc { return op.Src }
func writeDst(op transfer.WriteOp) transfer.Desc { return op.Dst }

// split cuts ops into parts of at most the stripe budget and MaxSegments
// (and StageBytes when staged: a part with device sources is staged in one
// buffer).
func (e *Engine) split(ops []transfer.WriteOp, total uint64, p *peer, staged bool) []*part {
	n := uint64(len(p.slots))
	budget := (total + n - 1) / max(n, 1)
	budget = max(budget, uint64(e.cfg.StripeBytes))
	budget = min(budget, MaxFramePayload)
	if staged {
		budget = min(budget, uint64(e.cfg.StageBytes))
	}
	// Size segment tables for an even spread of ops over the parts.
	hint := int(min(uint64(len(ops))/max(total/budget, 1)+2, MaxSegments))
	var parts []*part
	var cur *part
	for _, op := range ops {
		var src []byte
		if op.Src.Kind == transfer.Host {
			src = mem.Unsafe(op.Src.Addr, op.Src.Len)
		}
		off := uint64(0)
		for off < op.Src.Len {
			if cur == nil || cur.bytes == budget || cur.nseg == MaxSegments {
				if cur != nil {
					cur.seal()
				}
				cur = newPart(e.nextID.Add(1), hint)
				parts = append(parts, cur)
			}
			k := min(op.Src.Len-off, budget-cur.bytes)
			if src == nil {
				cur.addDev(op.Dst.Addr+off, op.Src.Addr+off, k)
			} else {
				cur.add(op.Dst.Addr+off, src[off:off+k])
			}
			off += k
		}
	}
	if cur != nil {
		cur.seal()
	}
	return parts
}

// Close stops listening, closes every connection, fails in-flight writes
// with ErrClosed and waits for all goroutines. It is idempotent.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		e.mu.Lock()
		e.closed = true
		peers := make([]*peer, 0, len(e.peers))
		for _, p := range e.peers {
			peers = append(peers, p)
		}
		ins := make([]*inConn, 0, len(e.incoming))
		for ic := range e.incoming {
			ins = append(ins, ic)
		}
		e.mu.Unlock()
		close(e.done)
		if err := e.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			e.closeErr = fmt.Errorf("tcp: close %q: %w", e.cfg.Name, err)
		}
		for _, ic := range ins {
			ic.close()
		}
		// Every peer's sessions are stopped first, then waited for
		// together: Close waits one FenceTimeout, not one per peer.
		var wait []chan struct{}
		for _, p := range peers {
			wait = append(wait, p.stop(fmt.Errorf("tcp: engine %q: %w", e.cfg.Name, transfer.ErrClosed))...)
		}
		for _, w := range wait {
			<-w
		}
		e.wg.Wait()
		if e.stage != nil {
			// Every session writer and connection reader has ended:
			// no staging buffer is held any more.
			if err := e.stage.close(); err != nil && e.closeErr == nil {
				e.closeErr = err
			}
		}
	})
	return e.closeErr
}
