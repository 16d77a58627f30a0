// Package loopback is an in-process transfer.Engine and transfer.Notifier.
// Engines made by one Fabric write into each other's registered host memory
// with copy() on a goroutine per posted operation, and exchange
// notifications through bounded in-memory inboxes. It is the simplest
// engine and the one tests use; Options adds fault injection next to the
// real behaviour.
package loopback

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bouncekv/bounce/engines/internal/writeset"
	"github.com/bouncekv/bounce/internal/inbox"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// Inbox limits.
const (
	// DefaultInboxSize is the notification inbox capacity used when
	// Options.InboxSize is zero.
	DefaultInboxSize = 1024
	// MaxInboxSize is the largest accepted Options.InboxSize.
	MaxInboxSize = 1 << 20
)

// Fabric connects the engines created from it. Engines on different fabrics
// cannot load each other. It is safe for concurrent use.
type Fabric struct {
	id uint64

	// mu guards the engine table and every engine's peers, closed flag and
	// in-flight operation sets, so a post checks both sides atomically.
	mu      sync.Mutex
	engines map[string]*Engine
	nextInc uint64
}

// NewFabric returns an empty fabric.
func NewFabric() *Fabric {
	return &Fabric{id: rand.Uint64(), engines: make(map[string]*Engine)}
}

// Options tunes an engine and injects faults for tests.
type Options struct {
	// InboxSize bounds the notifications queued for this engine (default
	// DefaultInboxSize). Notify to a full inbox returns ErrQueueFull.
	InboxSize int
	// MaxNotifySize, when positive, bounds a notification payload the way
	// a real fabric's engine does (Notify refuses a larger one); 0 is no
	// limit.
	MaxNotifySize int
	// OnComplete, when set, is called after each operation this engine
	// posted becomes terminal, on the operation's goroutine. It must not
	// block; it lets a reactor wait for completions instead of polling in a
	// loop.
	OnComplete func()
	// BeforePost, when set, runs at the start of PostWrite; an error
	// rejects the post (wrapped) and nothing is written.
	BeforePost func(peer string, ops []transfer.WriteOp) error
	// BeforeCopy, when set, runs on the operation's goroutine just before
	// the bytes move; an error fails the operation (wrapped) and nothing is
	// written.
	BeforeCopy func(peer string, ops []transfer.WriteOp) error
	// Gate, when set, stalls every posted operation until one value is
	// received from it (closing it releases all). A stalled operation stays
	// pending, still fails on ForgetPeer or Close, and writes nothing.
	Gate <-chan struct{}
	// Hold, when set, runs on the operation's goroutine before the bytes
	// move (after Gate) and may block; abort is closed when the operation
	// is failed by ForgetPeer or Close, and Hold must return by then. A
	// held operation stays pending and writes nothing; one failed while
	// held writes nothing at all. It lets a test stall writes on purpose.
	Hold func(abort <-chan struct{})
}

// Engine is one agent's endpoint on a Fabric. It implements transfer.Engine
// and transfer.Notifier and is safe for concurrent use.
type Engine struct {
	fab  *Fabric
	name string
	inc  uint64
	opts Options
	reg  mem.Registry

	// Guarded by fab.mu.
	closed bool
	peers  map[string]*peer
	out    map[*writeOp]struct{} // posted by this engine, not terminal
	in     map[*writeOp]struct{} // targeting this engine, not terminal
	rout   map[*readOp]struct{}  // reads posted by this engine, not terminal
	rin    map[*readOp]struct{}  // reads of this engine's memory, not terminal
	rguard transfer.ReadGuard    // nil: no read is served
	// forgotten names the engines ForgetPeer fenced off and LoadPeer has
	// not loaded again: their writes into this engine are refused.
	forgotten map[string]struct{}

	inbox     chan transfer.Message
	wake      inbox.Wake    // ends a RecvNotification's wait (WakeRecvNotification)
	done      chan struct{} // closed by Close
	wg        sync.WaitGroup
	closeOnce sync.Once
}

var (
	_ transfer.Engine   = (*Engine)(nil)
	_ transfer.Notifier = (*Engine)(nil)
	_ transfer.Fencer   = (*Engine)(nil)
)

// peer is a loaded peer: the engine and the memory its metadata listed.
type peer struct {
	eng  *Engine
	view *mem.Registry
}

// NewEngine creates an engine named name on f. Names are unique on a fabric
// while the engine is open; at most one Options may be given.
func (f *Fabric) NewEngine(name string, opts ...Options) (*Engine, error) {
	if err := transfer.CheckName(name); err != nil {
		return nil, fmt.Errorf("loopback: new engine: %w", err)
	}
	if len(opts) > 1 {
		return nil, fmt.Errorf("loopback: new engine %q: %d Options given, want at most one", name, len(opts))
	}
	var o Options
	if len(opts) == 1 {
		o = opts[0]
	}
	switch {
	case o.InboxSize == 0:
		o.InboxSize = DefaultInboxSize
	case o.InboxSize < 0 || o.InboxSize > MaxInboxSize:
		return nil, fmt.Errorf("loopback: new engine %q: InboxSize %d outside [1, %d]", name, o.InboxSize, MaxInboxSize)
	}
	if o.MaxNotifySize < 0 {
		return nil, fmt.Errorf("loopback: new engine %q: MaxNotifySize %d: want 0 (no limit) or positive", name, o.MaxNotifySize)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.engines[name]; ok {
		return nil, fmt.Errorf("loopback: new engine %q: name already in use on this fabric", name)
	}
	f.nextInc++
	e := &Engine{
		fab:       f,
		name:      name,
		inc:       f.nextInc,
		opts:      o,
		peers:     make(map[string]*peer),
		out:       make(map[*writeOp]struct{}),
		in:        make(map[*writeOp]struct{}),
		rout:      make(map[*readOp]struct{}),
		rin:       make(map[*readOp]struct{}),
		forgotten: make(map[string]struct{}),
		inbox:     make(chan transfer.Message, o.InboxSize),
		wake:      inbox.NewWake(),
		done:      make(chan struct{}),
	}
	f.engines[name] = e
	return e, nil
}

// Name returns the engine's name.
func (e *Engine) Name() string { return e.name }

// RouteCosts declares the engine's costs for route auto: a post is a
// memcpy per descriptor on a goroutine, so posting is nearly free and the
// bandwidth is the host's copy bandwidth.
func (e *Engine) RouteCosts() (postPerDesc, perWrite time.Duration, bandwidth float64) {
	return 50 * time.Nanosecond, 5 * time.Microsecond, 5e9
}

// MaxNotifySize returns Options.MaxNotifySize (0 = no limit).
func (e *Engine) MaxNotifySize() int { return e.opts.MaxNotifySize }

// RegisterMemory makes host memory d a valid write source and, once a peer
// reloads this engine's metadata, a valid write destination.
func (e *Engine) RegisterMemory(d transfer.Desc) error {
	e.fab.mu.Lock()
	defer e.fab.mu.Unlock()
	if e.closed {
		return fmt.Errorf("loopback %s: register %v: %w", e.name, d, transfer.ErrClosed)
	}
	if d.Kind != transfer.Host {
		return fmt.Errorf("loopback %s: register %v: only host memory: %w", e.name, d, transfer.ErrUnsupported)
	}
	if err := e.reg.Add(d); err != nil {
		return fmt.Errorf("loopback %s: register: %w", e.name, err)
	}
	return nil
}

// DeregisterMemory removes exactly d. It returns ErrInUse while an
// operation in flight reads from or writes into d.
func (e *Engine) DeregisterMemory(d transfer.Desc) error {
	e.fab.mu.Lock()
	defer e.fab.mu.Unlock()
	if e.closed {
		return fmt.Errorf("loopback %s: deregister %v: %w", e.name, d, transfer.ErrClosed)
	}
	if err := writeset.InUse(d, e.out, e.in); err != nil {
		return fmt.Errorf("loopback %s: deregister %v: %w", e.name, d, err)
	}
	// A read copies from the holder's memory (its Src: rin) into the
	// reader's (its Dst: rout).
	if err := writeset.InUse(d, e.rin, e.rout); err != nil {
		return fmt.Errorf("loopback %s: deregister %v (a read): %w", e.name, d, err)
	}
	if err := e.reg.Remove(d); err != nil {
		return fmt.Errorf("loopback %s: %w", e.name, err)
	}
	return nil
}

// Metadata encodes this engine's fabric, identity and registered ranges.
func (e *Engine) Metadata() ([]byte, error) {
	e.fab.mu.Lock()
	closed := e.closed
	e.fab.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("loopback %s: metadata: %w", e.name, transfer.ErrClosed)
	}
	return encodeMetadata(metadata{
		fabric:      e.fab.id,
		incarnation: e.inc,
		name:        e.name,
		ranges:      e.reg.Ranges(),
	}), nil
}

// LoadPeer decodes a peer's Metadata and returns its name. Loading a peer
// again refreshes the memory it may be written to. Errors wrap
// ErrBadMetadata (undecodable, or from another fabric), ErrUnknownPeer (no
// such engine open on this fabric) or ErrPeerLost (the metadata belongs to
// an engine of that name that has since closed). Loading a forgotten peer
// admits its writes into this engine again.
func (e *Engine) LoadPeer(md []byte) (string, error) {
	m, err := decodeMetadata(md)
	if err != nil {
		return "", fmt.Errorf("loopback %s: load peer: %w", e.name, err)
	}
	if m.fabric != e.fab.id {
		return "", fmt.Errorf("loopback %s: load peer %q: metadata from another fabric: %w", e.name, m.name, transfer.ErrBadMetadata)
	}
	view := &mem.Registry{}
	for _, r := range m.ranges {
		if err := view.Add(r); err != nil {
			return "", fmt.Errorf("loopback %s: load peer %q: %v: %w", e.name, m.name, err, transfer.ErrBadMetadata)
		}
	}
	e.fab.mu.Lock()
	defer e.fab.mu.Unlock()
	if e.closed {
		return "", fmt.Errorf("loopback %s: load peer %q: %w", e.name, m.name, transfer.ErrClosed)
	}
	t, ok := e.fab.engines[m.name]
	switch {
	case !ok:
		return "", fmt.Errorf("loopback %s: load peer %q: no such engine on this fabric: %w", e.name, m.name, transfer.ErrUnknownPeer)
	case t.inc != m.incarnation:
		return "", fmt.Errorf("loopback %s: load peer %q: metadata of a closed incarnation: %w", e.name, m.name, transfer.ErrPeerLost)
	}
	e.peers[m.name] = &peer{eng: t, view: view}
	delete(e.forgotten, m.name)
	return m.name, nil
}

// ForgetPeer drops a peer, in both directions. Operations this engine
// posted to it fail with ErrPeerLost, and so do the peer's operations
// writing into this engine; from then on the peer's writes into this
// engine are refused with ErrPeerLost until LoadPeer loads it again.
// ForgetPeer returns once all of those operations are terminal, so no
// byte of the peer lands here after it returns (a copy already under way
// is waited for). A name that is neither loaded nor writing here is
// ErrUnknownPeer, and is refused all the same.
func (e *Engine) ForgetPeer(name string) error {
	f := e.fab
	f.mu.Lock()
	if e.closed {
		f.mu.Unlock()
		return fmt.Errorf("loopback %s: forget peer %q: %w", e.name, name, transfer.ErrClosed)
	}
	p, loaded := e.peers[name]
	delete(e.peers, name)
	e.forgotten[name] = struct{}{}
	var pending []*writeOp
	for o := range e.out {
		if loaded && o.dst == p.eng {
			o.abortLocked(fmt.Errorf("loopback %s: write to %q: peer forgotten: %w", e.name, name, transfer.ErrPeerLost))
			pending = append(pending, o)
		}
	}
	for o := range e.in {
		if o.src.name == name {
			o.abortLocked(fmt.Errorf("loopback %s: write to %q: the target forgot this engine: %w", name, e.name, transfer.ErrPeerLost))
			pending = append(pending, o)
		}
	}
	reads := e.abortReadsLocked(name,
		fmt.Errorf("loopback %s: read from %q: peer forgotten: %w", e.name, name, transfer.ErrPeerLost),
		fmt.Errorf("loopback %s: read by %q: the holder forgot the reader: %w", e.name, name, transfer.ErrPeerLost))
	f.mu.Unlock()
	for _, o := range pending {
		<-o.finished
	}
	for _, o := range reads {
		<-o.finished
	}
	if !loaded && len(pending) == 0 && len(reads) == 0 {
		return fmt.Errorf("loopback %s: forget peer %q: %w", e.name, name, transfer.ErrUnknownPeer)
	}
	return nil
}

// FencesForgottenPeers reports true: ForgetPeer fails and waits out the
// peer's writes into this engine and refuses its later ones until the peer
// is loaded again (transfer.Fencer).
func (e *Engine) FencesForgottenPeers() bool { return true }

// PostWrite checks every write and starts copying them on a new goroutine.
// Each source must lie in memory registered here; each destination in
// memory listed by the peer's loaded metadata and still registered by the
// peer. Otherwise the error wraps ErrNotRegistered or ErrOutOfBounds and
// nothing is written. Src.Len must equal Dst.Len and be positive. The
// operation is Done once every byte has been copied.
func (e *Engine) PostWrite(peerName string, ops []transfer.WriteOp) (transfer.Op, error) {
	ctx := func(format string, args ...any) string {
		return fmt.Sprintf("loopback %s: post write to %q: ", e.name, peerName) + fmt.Sprintf(format, args...)
	}
	if err := writeset.CheckPost(e, "loopback", ops); err != nil {
		return nil, fmt.Errorf("%s%w", ctx(""), err)
	}
	if h := e.opts.BeforePost; h != nil {
		if err := h(peerName, ops); err != nil {
			return nil, fmt.Errorf("%s: %w", ctx("injected"), err)
		}
	}
	own := slices.Clone(ops)

	f := e.fab
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := e.targetLocked(peerName, ctx)
	if err != nil {
		return nil, err
	}
	if err := e.checkRangesLocked(p, ctx, own, false, func(i int, side string) string { return fmt.Sprintf("write %d %s", i, side) }); err != nil {
		return nil, err
	}
	return e.startLocked(&writeOp{src: e, dst: p.eng, peer: peerName, ops: own}), nil
}

// startLocked records o in flight and starts its copy (fab.mu held).
func (e *Engine) startLocked(o *writeOp) *writeOp {
	o.abortC, o.finished = make(chan struct{}), make(chan struct{})
	e.out[o] = struct{}{}
	o.dst.in[o] = struct{}{}
	e.wg.Add(1)
	go e.run(o)
	return o
}

// PostBlocks posts a block-table write (transfer.BlockPoster): piece q of
// w.Src to piece q of w.Dst for q in [w.First, w.First+w.Count). It checks
// once per id the range touches (below each pool's block count) and once
// per pool region it touches (the source region's span registered here,
// the destination's in the peer's loaded metadata and still registered by
// the peer), never per piece; errors as PostWrite's. The hooks
// (Options.BeforePost, BeforeCopy) see one write per touched region: its
// source and destination spans.
func (e *Engine) PostBlocks(peerName string, w transfer.BlockWrite) (transfer.Op, error) {
	ctx := func(format string, args ...any) string {
		return fmt.Sprintf("loopback %s: post blocks to %q: ", e.name, peerName) + fmt.Sprintf(format, args...)
	}
	// The copy reads its own ids: what is checked is what is copied, even
	// if the caller changes its slices meanwhile.
	w.Src.IDs, w.Dst.IDs = slices.Clone(w.Src.IDs), slices.Clone(w.Dst.IDs)
	for _, p := range []transfer.Pool{w.Src.Pool, w.Dst.Pool} {
		if err := p.CheckGeometry(); err != nil {
			return nil, fmt.Errorf("%s: %w", ctx("pool %v: %v", p, err), transfer.ErrOutOfBounds)
		}
	}
	switch {
	case w.Count == 0:
		return nil, fmt.Errorf("%s: %w", ctx("no pieces"), transfer.ErrOutOfBounds)
	case w.Src.Pool.BlockLen != w.Dst.Pool.BlockLen:
		return nil, fmt.Errorf("%s: %w", ctx("blocks of %d and %d bytes", w.Src.Pool.BlockLen, w.Dst.Pool.BlockLen), transfer.ErrOutOfBounds)
	case len(w.Src.Pool.Regions) != len(w.Dst.Pool.Regions) || len(w.Src.IDs) != len(w.Dst.IDs):
		// Piece q lies in region q/len(IDs) of each table: only tables of
		// one shape copy region to region (what the pipeline sends).
		return nil, fmt.Errorf("%s: %w", ctx("from %d regions x %d ids to %d regions x %d ids: tables of different shapes", len(w.Src.Pool.Regions), len(w.Src.IDs), len(w.Dst.Pool.Regions), len(w.Dst.IDs)), transfer.ErrUnsupported)
	}
	for _, side := range []struct {
		what string
		b    transfer.Blocks
	}{{"source", w.Src}, {"destination", w.Dst}} {
		if err := side.b.CheckRange(w.First, w.Count); err != nil {
			return nil, fmt.Errorf("%s: %v: %w", ctx("%s", side.what), err, transfer.ErrOutOfBounds)
		}
	}
	lo, hi := w.Src.RegionsTouched(w.First, w.Count)
	spans := make([]transfer.WriteOp, 0, hi-lo)
	for r := lo; r < hi; r++ {
		spans = append(spans, transfer.WriteOp{Src: w.Src.Pool.Span(r), Dst: w.Dst.Pool.Span(r)})
	}
	for i, sp := range spans {
		if err := transfer.CheckKinds(e, "loopback", []transfer.Desc{sp.Src, sp.Dst}); err != nil {
			return nil, fmt.Errorf("%s%w", ctx("region %d: ", lo+i), err)
		}
	}
	if h := e.opts.BeforePost; h != nil {
		if err := h(peerName, spans); err != nil {
			return nil, fmt.Errorf("%s: %w", ctx("injected"), err)
		}
	}
	f := e.fab
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := e.targetLocked(peerName, ctx)
	if err != nil {
		return nil, err
	}
	if err := e.checkRangesLocked(p, ctx, spans, false, func(i int, side string) string { return fmt.Sprintf("%s region %d", side, lo+i) }); err != nil {
		return nil, err
	}
	return e.startLocked(&writeOp{src: e, dst: p.eng, peer: peerName, ops: spans, blk: &w}), nil
}

// checkRangesLocked checks ops against both ends' memory before a post to
// p: each op's local range (the source of a write, the destination of a
// read) must lie in memory registered here, its remote range in p's loaded
// metadata and in memory p still registers. name(i, side) names op i's
// side ("source" or "destination") in the error, which wraps
// ErrNotRegistered or ErrOutOfBounds.
func (e *Engine) checkRangesLocked(p *peer, ctx func(string, ...any) string, ops []transfer.WriteOp, read bool, name func(i int, side string) string) error {
	localSide, remoteSide := "source", "destination"
	if read {
		localSide, remoteSide = remoteSide, localSide
	}
	for i, w := range ops {
		local, remote := w.Src, w.Dst
		if read {
			local, remote = w.Dst, w.Src
		}
		if _, err := e.reg.Find(local.Addr, local.Len); err != nil {
			return fmt.Errorf("%s: %w", ctx("%s", name(i, localSide)), err)
		}
		if _, err := p.view.Find(remote.Addr, remote.Len); err != nil {
			return fmt.Errorf("%s: %w", ctx("%s outside the peer's loaded metadata (reload it after the peer registers memory)", name(i, remoteSide)), err)
		}
		if _, err := p.eng.reg.Find(remote.Addr, remote.Len); err != nil {
			return fmt.Errorf("%s: %w", ctx("%s no longer registered by the peer", name(i, remoteSide)), err)
		}
	}
	return nil
}

// InFlight returns the number of operations this engine posted that are not
// yet terminal.
func (e *Engine) InFlight() int {
	e.fab.mu.Lock()
	defer e.fab.mu.Unlock()
	return len(e.out)
}

// gate holds an op's goroutine, before it copies, at Options.Gate and then
// Options.Hold until they let it go or abort (the op's) is closed.
func (e *Engine) gate(abort <-chan struct{}) {
	if g := e.opts.Gate; g != nil {
		select {
		case <-g:
		case <-abort:
		}
	}
	if h := e.opts.Hold; h != nil {
		h(abort)
	}
}

func (e *Engine) run(o *writeOp) {
	defer e.wg.Done()
	e.gate(o.abortC)
	e.fab.mu.Lock()
	err := o.abortErr
	e.fab.mu.Unlock()
	if err == nil && e.opts.BeforeCopy != nil {
		if herr := e.opts.BeforeCopy(o.peer, o.ops); herr != nil {
			err = fmt.Errorf("loopback %s: write to %q: injected: %w", e.name, o.peer, herr)
		}
	}
	if err == nil {
		// Checked at post time; DeregisterMemory refuses ranges in use and
		// Close waits for this copy, so the memory is still there.
		if b := o.blk; b != nil {
			for q := b.First; q < b.First+b.Count; q++ {
				s, d := b.Src.Piece(q), b.Dst.Piece(q)
				copy(mem.Unsafe(d.Addr, d.Len), mem.Unsafe(s.Addr, s.Len))
			}
		} else {
			for _, w := range o.ops {
				copy(mem.Unsafe(w.Dst.Addr, w.Dst.Len), mem.Unsafe(w.Src.Addr, w.Src.Len))
			}
		}
	}
	e.fab.mu.Lock()
	delete(o.src.out, o)
	delete(o.dst.in, o)
	e.fab.mu.Unlock()
	o.err = err
	if err != nil {
		o.state.Store(uint32(transfer.Failed))
	} else {
		o.state.Store(uint32(transfer.Done))
	}
	close(o.finished)
	if e.opts.OnComplete != nil {
		e.opts.OnComplete()
	}
}

// Notify queues payload (copied) in the peer's inbox without blocking. It
// returns ErrQueueFull when the inbox is full, ErrUnknownPeer when the peer
// is not loaded and ErrPeerLost when it has closed or forgot this engine. Notifications to one
// peer arrive in the order they were sent.
func (e *Engine) Notify(peerName string, payload []byte) error {
	if m := e.opts.MaxNotifySize; m > 0 && len(payload) > m {
		return fmt.Errorf("loopback %s: notify %q: payload of %d bytes exceeds MaxNotifySize %d", e.name, peerName, len(payload), m)
	}
	e.fab.mu.Lock()
	defer e.fab.mu.Unlock()
	if e.closed {
		return fmt.Errorf("loopback %s: notify %q: %w", e.name, peerName, transfer.ErrClosed)
	}
	p, ok := e.peers[peerName]
	if !ok {
		return fmt.Errorf("loopback %s: notify %q: %w", e.name, peerName, transfer.ErrUnknownPeer)
	}
	if _, forgotten := p.eng.forgotten[e.name]; p.eng.closed || forgotten {
		return fmt.Errorf("loopback %s: notify %q: %w", e.name, peerName, transfer.ErrPeerLost)
	}
	select {
	case p.eng.inbox <- transfer.Message{Peer: e.name, Payload: bytes.Clone(payload)}:
		return nil
	default:
		return fmt.Errorf("loopback %s: notify %q: inbox of %d full: %w", e.name, peerName, cap(p.eng.inbox), transfer.ErrQueueFull)
	}
}

// WakeRecvNotification makes a RecvNotification in progress, or else the
// next one that waits, return ErrTimeout at once: the agent's notification
// pump, told to stop, then stops without waiting out its timeout.
func (e *Engine) WakeRecvNotification() { e.wake.Wake() }

// RecvNotification returns the next notification, with the sender's name
// in Message.Peer. It waits at most timeout (not at all when timeout <= 0)
// and returns ErrTimeout when nothing arrived, ErrClosed once the engine is
// closed.
func (e *Engine) RecvNotification(timeout time.Duration) (transfer.Message, error) {
	m, err := inbox.ReceiveWake(e.inbox, e.done, e.wake, timeout)
	if err != nil {
		return m, fmt.Errorf("loopback %s: recv notification: %w", e.name, err)
	}
	return m, nil
}

// Close shuts the engine: its in-flight operations fail with ErrClosed,
// operations peers posted into it fail with ErrPeerLost, pending
// notifications are dropped and the name is freed on the fabric. Close
// returns once none of those operations touches memory any more. It is
// idempotent.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		f := e.fab
		f.mu.Lock()
		e.closed = true
		if f.engines[e.name] == e {
			delete(f.engines, e.name)
		}
		var inbound []*writeOp
		for o := range e.out {
			o.abortLocked(fmt.Errorf("loopback %s: write to %q: engine closed: %w", e.name, o.peer, transfer.ErrClosed))
		}
		for o := range e.in {
			o.abortLocked(fmt.Errorf("loopback %s: write to %q: peer closed: %w", o.src.name, o.peer, transfer.ErrPeerLost))
			inbound = append(inbound, o)
		}
		reads := e.abortReadsLocked("",
			fmt.Errorf("loopback %s: read: engine closed: %w", e.name, transfer.ErrClosed),
			fmt.Errorf("loopback %s: read: the holder closed: %w", e.name, transfer.ErrPeerLost))
		clear(e.peers)
		close(e.done)
		f.mu.Unlock()
		for _, o := range inbound {
			<-o.finished
		}
		for _, o := range reads {
			<-o.finished
		}
		e.wg.Wait()
	})
	return nil
}

// writeOp is one posted batch of writes.
type writeOp struct {
	src, dst *Engine
	peer     string
	ops      []transfer.WriteOp
	// blk, when set, is a block write (PostBlocks); ops then holds the
	// spans of the pool regions it touches (for InUse and the hooks).
	blk *transfer.BlockWrite

	opEnd
}

// opEnd is how a write or read operation ends: aborted (abortC closes once
// abortErr is set), terminal (state, err), released.
type opEnd struct {
	abortC   chan struct{}
	abortErr error // guarded by fab.mu; set once, then abortC closes

	finished chan struct{}
	state    atomic.Uint32 // transfer.Status
	err      error         // written before state becomes terminal
	released atomic.Bool
}

// abortOnceLocked records err as the abort cause, once. fab.mu is held.
func (o *opEnd) abortOnceLocked(err error) {
	if o.abortErr == nil {
		o.abortErr = err
		close(o.abortC)
	}
}

// Poll reports the operation's status without blocking.
func (o *opEnd) Poll() (transfer.Status, error) {
	s := transfer.Status(o.state.Load())
	if s == transfer.Pending {
		return s, nil
	}
	return s, o.err
}

// release marks a terminal operation released: ErrInUse while pending,
// ErrClosed the second time.
func (o *opEnd) release() error {
	if transfer.Status(o.state.Load()) == transfer.Pending {
		return transfer.ErrInUse
	}
	if o.released.Swap(true) {
		return fmt.Errorf("already released: %w", transfer.ErrClosed)
	}
	return nil
}

var _ transfer.BlockPoster = (*Engine)(nil)

// Writes, From and To make writeOp a writeset.Write.
func (o *writeOp) Writes() []transfer.WriteOp { return o.ops }
func (o *writeOp) From() string               { return o.src.name }
func (o *writeOp) To() string                 { return o.peer }

func (o *writeOp) abortLocked(err error) { o.abortOnceLocked(err) }

// Release frees the operation once it is terminal.
func (o *writeOp) Release() error {
	if err := o.release(); err != nil {
		return fmt.Errorf("loopback %s: release write to %q: %w", o.src.name, o.peer, err)
	}
	return nil
}

// targetLocked returns the loaded peer a post goes to, or why none may be
// written (this engine closed, the peer unknown, closed, or fencing this
// engine); ctx prefixes the error. The caller holds the fabric's lock.
func (e *Engine) targetLocked(peerName string, ctx func(string, ...any) string) (*peer, error) {
	if e.closed {
		return nil, fmt.Errorf("%s: %w", ctx("engine"), transfer.ErrClosed)
	}
	p, ok := e.peers[peerName]
	if !ok {
		return nil, fmt.Errorf("%s: %w", ctx("peer not loaded"), transfer.ErrUnknownPeer)
	}
	if p.eng.closed {
		return nil, fmt.Errorf("%s: %w", ctx("peer closed"), transfer.ErrPeerLost)
	}
	if _, ok := p.eng.forgotten[e.name]; ok {
		return nil, fmt.Errorf("%s: %w", ctx("the peer forgot this engine (it must load it again)"), transfer.ErrPeerLost)
	}
	return p, nil
}
