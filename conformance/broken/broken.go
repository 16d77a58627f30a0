// Package broken holds deliberately broken implementations of the bounce
// interfaces, each violating one conformance rule on top of a correct
// in-tree implementation (engines/loopback, controlplane/inproc). They exist
// to show that the conformance suite rejects what it must; never use them
// for anything else.
package broken

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/controlplane/inproc"
	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// Fault selects how the A engine of an Engines pair is broken.
type Fault int

// Faults, with the rule each one breaks.
const (
	// CorruptByte flips one destination byte of every write before
	// reporting Done (engine/byte-exact).
	CorruptByte Fault = iota + 1
	// EarlyDone reports Done at once and copies a little later
	// (engine/done-means-landed).
	EarlyDone
	// NeverComplete copies but never reports anything but Pending
	// (engine/byte-exact: did not complete within OpTimeout).
	NeverComplete
	// SwallowFailure turns a refused or failed write into Done
	// (engine/failure-reported).
	SwallowFailure
	// LateWrite reports Done once the bytes landed but copies the source
	// over the destination again shortly after (engine/quiescent-after-done).
	LateWrite
	// LeakGoroutine starts a goroutine per engine that Close does not stop
	// (engine/no-goroutine-leak).
	LeakGoroutine
	// IgnoreTargetForget gives B a ForgetPeer that returns nil and does
	// nothing, while B claims transfer.Fencer (engine/target-forget).
	IgnoreTargetForget
	// LandAfterLost makes A.ForgetPeer report the peer's in-flight writes
	// failed with ErrPeerLost at once, and their bytes land a little later
	// all the same (engine/source-forget).
	LandAfterLost
	// UnstableStatus forgets every terminal status when any op is
	// released: such ops poll Pending again (engine/terminal-stable).
	UnstableStatus
	// UnprovenGiveUp gives up on a write pending for long (a stalled one)
	// with ErrTimeout, not ErrNotQuiescent, and the write lands once the
	// stall ends (engine/not-quiescent).
	UnprovenGiveUp
	// ReorderLarge delivers notifications above 4 KiB a little late, so
	// smaller ones sent after them overtake them
	// (engine/notify-order-sizes).
	ReorderLarge
	// CorruptLarge flips a byte of every write above 1 MiB
	// (engine/byte-exact, whatever Config.Sizes says).
	CorruptLarge
	// CorruptAboveFragment declares EnginePair.FragmentSize 2 MiB and flips
	// a byte of every write above it (engine/byte-exact, whatever
	// Config.Sizes says).
	CorruptAboveFragment
	// SyncPost makes PostWrite wait for the write to finish before it
	// returns (engine/post-async).
	SyncPost
	// LateRefusedWrite refuses a write from unregistered source memory as
	// it should, then copies it a little later (engine/failure-reported,
	// which must blame that case and no other).
	LateRefusedWrite
	// IgnoreGuard gives B a SetWriteGuard that keeps the guard and never
	// asks it (engine/write-guard).
	IgnoreGuard
	// LapsingFence gives B a ForgetPeer whose fence lapses: 50ms after
	// it returned B loads the forgotten peer again by itself
	// (engine/target-forget, its post a while later).
	LapsingFence
	// ReplayAfterReload keeps the writes A's post had refused because B
	// forgot A, and lands them with A's next accepted write, once B loaded
	// A again (engine/target-forget, its re-check after the reload).
	ReplayAfterReload
	// ForgetFailsDone makes A.ForgetPeer fail every op of the peer not
	// yet released, Done ones included (engine/terminal-after-forget).
	ForgetFailsDone
	// SerialPost makes PostWrite wait until the previous write is terminal
	// (a window of one write): one write in flight is asynchronous, the
	// second post blocks (engine/post-async).
	SerialPost
	// Retransmit copies every write's source over its destination again
	// 120ms after Done, later than Settle (engine/quiescent-after-done).
	Retransmit
	// HastyGiveUp gives up on a write pending for 200ms (a stalled one)
	// with ErrTimeout, claiming quiescence, and re-sends it 120ms after the
	// stall ends (engine/not-quiescent).
	HastyGiveUp
	// EndExclusive refuses, with ErrOutOfBounds, a write whose source ends
	// exactly at the end of registered memory (engine/bounds-edges).
	EndExclusive
	// Drop4G lands only the part of a destination below a 4 GiB-aligned
	// address it crosses, and reports Done (engine/bounds-edges).
	Drop4G
	// StaleDeregister gives B a DeregisterMemory that returns nil and
	// leaves the memory writable (engine/deregister-idle).
	StaleDeregister
	// RedeliverOnReload makes B deliver again, each time it loads a peer
	// it knew, the notifications it received from that peer
	// (engine/notify-after-write).
	RedeliverOnReload
	// AckBeforeApply reports writes of 128 KiB to 1 MiB Done at once and
	// lands them 5ms later, a size no data rule moves with the defaults
	// (engine/notify-after-write).
	AckBeforeApply
	// BlockingConnect gives A a Connect that returns at once but holds,
	// for 1.5s, a lock PostWrite takes (engine/connect).
	BlockingConnect
	// GuardCached gives B (tcp) a guard wrapper that remembers every range
	// the guard allowed and admits it again unasked, after a revocation too
	// (engine/write-guard).
	GuardCached
	// GuardStartOnly gives B (tcp) a guard wrapper that asks the guard
	// about a write's first byte only (engine/write-guard).
	GuardStartOnly
	// ReadUnguarded gives B (tcp) a SetReadGuard that drops the guard and
	// serves every read of registered memory unasked (engine/read-guarded).
	ReadUnguarded
)

// String names the fault.
func (f Fault) String() string {
	switch f {
	case CorruptByte:
		return "corrupt-byte"
	case EarlyDone:
		return "early-done"
	case NeverComplete:
		return "never-complete"
	case SwallowFailure:
		return "swallow-failure"
	case LateWrite:
		return "late-write"
	case LeakGoroutine:
		return "leak-goroutine"
	case IgnoreTargetForget:
		return "ignore-target-forget"
	case LandAfterLost:
		return "land-after-lost"
	case UnstableStatus:
		return "unstable-status"
	case UnprovenGiveUp:
		return "unproven-give-up"
	case ReorderLarge:
		return "reorder-large"
	case CorruptLarge:
		return "corrupt-large"
	case CorruptAboveFragment:
		return "corrupt-above-fragment"
	case SyncPost:
		return "sync-post"
	case LateRefusedWrite:
		return "late-refused-write"
	case IgnoreGuard:
		return "ignore-guard"
	case LapsingFence:
		return "lapsing-fence"
	case ReplayAfterReload:
		return "replay-after-reload"
	case ForgetFailsDone:
		return "forget-fails-done"
	case SerialPost:
		return "serial-post"
	case Retransmit:
		return "retransmit"
	case HastyGiveUp:
		return "hasty-give-up"
	case EndExclusive:
		return "end-exclusive"
	case Drop4G:
		return "drop-4g"
	case StaleDeregister:
		return "stale-deregister"
	case RedeliverOnReload:
		return "redeliver-on-reload"
	case AckBeforeApply:
		return "ack-before-apply"
	case BlockingConnect:
		return "blocking-connect"
	case GuardCached:
		return "guard-cached"
	case GuardStartOnly:
		return "guard-start-only"
	case ReadUnguarded:
		return "read-unguarded"
	default:
		return fmt.Sprintf("fault(%d)", int(f))
	}
}

// How long EarlyDone waits before it copies, and LateWrite before it
// copies again.
const (
	earlyDelay = 20 * time.Millisecond
	lateDelay  = 5 * time.Millisecond
	// giveUpAfter is how long UnprovenGiveUp lets a write stay pending.
	giveUpAfter = 50 * time.Millisecond
	// reorderAbove is the payload size above which ReorderLarge delays.
	reorderAbove = 4 << 10
	// lostDelay is how long after ForgetPeer LandAfterLost lands bytes.
	lostDelay = 50 * time.Millisecond
	// fragmentSize is what CorruptAboveFragment declares.
	fragmentSize = 2 << 20
	// lapseAfter is how long LapsingFence's fence holds.
	lapseAfter = 50 * time.Millisecond
	// resendDelay is how late Retransmit and HastyGiveUp send again.
	resendDelay = 120 * time.Millisecond
	// hastyAfter is how long HastyGiveUp lets a write stay pending.
	hastyAfter = 200 * time.Millisecond
	// ackBelow and ackAbove bound the sizes AckBeforeApply acknowledges
	// early, and ackDelay is how late it lands them.
	ackAbove = 128 << 10
	ackBelow = 1 << 20
	ackDelay = 5 * time.Millisecond
	// connectHold is how long BlockingConnect holds the post lock.
	connectHold = 1500 * time.Millisecond
)

// Engines returns an EngineFactory of loopback pairs whose A engine (or,
// for IgnoreTargetForget, IgnoreGuard, LapsingFence, StaleDeregister and
// RedeliverOnReload, B) has fault f — tcp pairs (TCPEngines) for
// GuardCached, GuardStartOnly and ReadUnguarded — and stop, which ends any goroutine the
// fault leaked; call it when done with the factory. Every pair offers
// EnginePair.StallWrites. Fault zero breaks nothing: its pairs certify.
func Engines(f Fault) (newPair conformance.EngineFactory, stop func()) {
	quit := make(chan struct{})
	var once sync.Once
	stop = func() { once.Do(func() { close(quit) }) }
	newPair = func() (conformance.EnginePair, error) {
		if f == GuardCached || f == GuardStartOnly || f == ReadUnguarded {
			return tcpGuardPair(f)
		}
		fab := loopback.NewFabric()
		valve := &conformance.Valve{}
		a, err := fab.NewEngine("a", loopback.Options{Hold: valve.Wait})
		if err != nil {
			return conformance.EnginePair{}, err
		}
		b, err := fab.NewEngine("b")
		if err != nil {
			a.Close()
			return conformance.EnginePair{}, err
		}
		ea := &engine{Engine: a, note: a, fault: f, valve: valve}
		var eb transfer.Engine = b
		switch f {
		case IgnoreTargetForget, LapsingFence, StaleDeregister, RedeliverOnReload:
			ea.fault = 0
			eb = &engine{Engine: b, note: b, fault: f}
		case IgnoreGuard:
			ea.fault = 0
			eb = &unguarded{b}
		}
		if f == LeakGoroutine {
			go func() { <-quit }()
		}
		p := conformance.EnginePair{
			A:           ea,
			B:           eb,
			KillB:       func() { b.Close() },
			Cleanup:     func() { ea.Close(); eb.Close() },
			StallWrites: valve.Stall,
		}
		if f == CorruptAboveFragment {
			p.FragmentSize = fragmentSize
		}
		return p, nil
	}
	return newPair, stop
}

// unguarded claims transfer.WriteGuarded and lands every write unasked.
type unguarded struct{ transfer.Engine }

// SetWriteGuard drops g: the IgnoreGuard fault.
func (unguarded) SetWriteGuard(transfer.WriteGuard) {}

// engine wraps a correct engine and breaks it as its fault says.
type engine struct {
	transfer.Engine
	note  transfer.Notifier
	fault Fault
	wg    sync.WaitGroup // goroutines writing or notifying late

	releases atomic.Uint64 // UnstableStatus: ops released so far

	valve *conformance.Valve // HastyGiveUp: the stall A's writes wait on
	post  sync.Mutex         // BlockingConnect: taken by PostWrite

	mu        sync.Mutex
	closing   bool                          // Close has begun: no more late goroutines
	live      []*lostOp                     // LandAfterLost: ops not seen terminal
	regs      []transfer.Desc               // LateRefusedWrite: memory registered here
	mds       map[string][]byte             // LapsingFence: metadata loaded, by peer
	queued    []transfer.WriteOp            // ReplayAfterReload: refused writes kept
	held      map[*heldOp]struct{}          // ForgetFailsDone: ops not released
	prev      transfer.Op                   // SerialPost: the last write posted
	delivered map[string][]transfer.Message // RedeliverOnReload: received, by peer
	replay    []transfer.Message            // RedeliverOnReload: to deliver again
}

// Notify forwards to the wrapped engine; ReorderLarge delays large ones.
func (e *engine) Notify(peer string, payload []byte) error {
	if e.fault == ReorderLarge && len(payload) > reorderAbove {
		p := append([]byte(nil), payload...)
		e.late(func() {
			time.Sleep(2 * time.Millisecond)
			_ = e.note.Notify(peer, p)
		})
		return nil
	}
	return e.note.Notify(peer, payload)
}

// RecvNotification forwards to the wrapped engine; RedeliverOnReload
// serves its replay first and remembers what it delivered.
func (e *engine) RecvNotification(timeout time.Duration) (transfer.Message, error) {
	if e.fault != RedeliverOnReload {
		return e.note.RecvNotification(timeout)
	}
	e.mu.Lock()
	if len(e.replay) > 0 {
		m := e.replay[0]
		e.replay = e.replay[1:]
		e.mu.Unlock()
		return m, nil
	}
	e.mu.Unlock()
	m, err := e.note.RecvNotification(timeout)
	if err == nil {
		e.mu.Lock()
		if e.delivered == nil {
			e.delivered = map[string][]transfer.Message{}
		}
		e.delivered[m.Peer] = append(e.delivered[m.Peer], transfer.Message{Peer: m.Peer, Payload: slices.Clone(m.Payload)})
		e.mu.Unlock()
	}
	return m, err
}

// LoadPeer forwards; LapsingFence remembers the metadata and
// RedeliverOnReload queues what the peer sent before for delivery again.
func (e *engine) LoadPeer(md []byte) (string, error) {
	name, err := e.Engine.LoadPeer(md)
	if err != nil {
		return name, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch e.fault {
	case LapsingFence:
		if e.mds == nil {
			e.mds = map[string][]byte{}
		}
		e.mds[name] = slices.Clone(md)
	case RedeliverOnReload:
		e.replay = append(e.replay, e.delivered[name]...)
	}
	return name, nil
}

// Connect is transfer.Connector: nothing to open on a loopback fabric,
// except that BlockingConnect holds the post lock for a while.
func (e *engine) Connect(peer string) {
	if e.fault == BlockingConnect {
		e.post.Lock() // the dial's lock, taken before it starts
		e.late(func() {
			time.Sleep(connectHold)
			e.post.Unlock()
		})
	}
}

// FencesForgottenPeers claims the fence (the wrapped loopback engine keeps
// it, unless the fault is IgnoreTargetForget).
func (e *engine) FencesForgottenPeers() bool { return true }

// RegisterMemory forwards, remembering the range for LateRefusedWrite.
func (e *engine) RegisterMemory(d transfer.Desc) error {
	if err := e.Engine.RegisterMemory(d); err != nil {
		return err
	}
	e.mu.Lock()
	e.regs = append(e.regs, d)
	e.mu.Unlock()
	return nil
}

// DeregisterMemory forwards, forgetting the range; StaleDeregister
// forwards nothing.
func (e *engine) DeregisterMemory(d transfer.Desc) error {
	if e.fault == StaleDeregister {
		return nil
	}
	if err := e.Engine.DeregisterMemory(d); err != nil {
		return err
	}
	e.mu.Lock()
	e.regs = slices.DeleteFunc(e.regs, func(r transfer.Desc) bool { return r == d })
	e.mu.Unlock()
	return nil
}

// ForgetPeer forwards, except as IgnoreTargetForget, LandAfterLost,
// LapsingFence and ForgetFailsDone say.
func (e *engine) ForgetPeer(peer string) error {
	switch e.fault {
	case IgnoreTargetForget:
		return nil
	case LapsingFence:
		err := e.Engine.ForgetPeer(peer)
		e.mu.Lock()
		md := e.mds[peer]
		e.mu.Unlock()
		if md != nil {
			e.late(func() {
				time.Sleep(lapseAfter)
				_, _ = e.Engine.LoadPeer(md)
			})
		}
		return err
	case ForgetFailsDone:
		e.mu.Lock()
		for o := range e.held {
			if o.peer == peer {
				o.mu.Lock()
				o.lost = fmt.Errorf("broken: write to %q: peer forgotten: %w", peer, transfer.ErrPeerLost)
				o.mu.Unlock()
			}
		}
		e.mu.Unlock()
		return e.Engine.ForgetPeer(peer)
	case LandAfterLost:
		e.mu.Lock()
		var late []transfer.WriteOp
		for _, o := range e.live {
			if st, _ := o.Op.Poll(); o.peer == peer && !st.Terminal() {
				o.mu.Lock()
				o.lost = fmt.Errorf("broken: write to %q: peer forgotten: %w", peer, transfer.ErrPeerLost)
				o.mu.Unlock()
				late = append(late, o.ops...)
			}
		}
		e.live = nil
		e.mu.Unlock()
		err := e.Engine.ForgetPeer(peer)
		e.late(func() {
			time.Sleep(lostDelay)
			for _, w := range late {
				copy(mem.Unsafe(w.Dst.Addr, w.Dst.Len), mem.Unsafe(w.Src.Addr, w.Src.Len))
			}
		})
		return err
	}
	return e.Engine.ForgetPeer(peer)
}

// late runs f on a goroutine Close waits for, unless Close has begun.
func (e *engine) late(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		return
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		f()
	}()
}

// Close waits for the late writers, then closes the wrapped engine.
func (e *engine) Close() error {
	e.mu.Lock()
	e.closing = true
	e.mu.Unlock()
	e.wg.Wait()
	return e.Engine.Close()
}

// registered reports whether d overlaps memory registered here.
func (e *engine) registered(d transfer.Desc) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range e.regs {
		if d.Addr < r.Addr+r.Len && r.Addr < d.Addr+d.Len {
			return true
		}
	}
	return false
}

// registeredEnd reports whether d ends exactly where memory registered
// here ends.
func (e *engine) registeredEnd(d transfer.Desc) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range e.regs {
		if r.Contains(d.Addr, d.Len) && d.End() == r.End() {
			return true
		}
	}
	return false
}

// PostWrite posts through the wrapped engine and breaks the result.
func (e *engine) PostWrite(peer string, ops []transfer.WriteOp) (transfer.Op, error) {
	ops = append([]transfer.WriteOp(nil), ops...)
	var total uint64
	for _, w := range ops {
		total += w.Dst.Len
	}
	switch e.fault {
	case BlockingConnect:
		e.post.Lock()
		e.post.Unlock()
	case EndExclusive:
		for i, w := range ops {
			if e.registeredEnd(w.Src) {
				return nil, fmt.Errorf("broken: write %d: source %v ends at the end of registered memory: %w", i, w.Src, transfer.ErrOutOfBounds)
			}
		}
	case Drop4G:
		for i, w := range ops {
			if b := (w.Dst.Addr>>32 + 1) << 32; w.Dst.Addr < b && w.Dst.End() > b {
				ops[i].Src.Len, ops[i].Dst.Len = b-w.Dst.Addr, b-w.Dst.Addr // a 32-bit offset wrapped
			}
		}
	case SerialPost:
		e.mu.Lock()
		prev := e.prev
		e.mu.Unlock()
		for prev != nil {
			if st, _ := prev.Poll(); st.Terminal() {
				break
			}
			time.Sleep(50 * time.Microsecond)
		}
	case HastyGiveUp:
		return e.hasty(peer, ops), nil
	case AckBeforeApply:
		if total > ackAbove && total < ackBelow {
			e.late(func() {
				time.Sleep(ackDelay)
				if op, err := e.Engine.PostWrite(peer, ops); err == nil {
					waitOp(op)
				}
			})
			return doneOp{}, nil
		}
	}
	switch e.fault {
	case EarlyDone:
		e.late(func() {
			time.Sleep(earlyDelay)
			if op, err := e.Engine.PostWrite(peer, ops); err == nil {
				waitOp(op)
			}
		})
		return doneOp{}, nil
	case SwallowFailure:
		op, err := e.Engine.PostWrite(peer, ops)
		if err != nil {
			return doneOp{}, nil
		}
		return &swallowOp{Op: op}, nil
	}
	op, err := e.Engine.PostWrite(peer, ops)
	if e.fault == ReplayAfterReload {
		e.mu.Lock()
		var replay []transfer.WriteOp
		switch {
		case errors.Is(err, transfer.ErrPeerLost):
			e.queued = append(e.queued, ops...) // kept to be sent again
		case err == nil:
			replay, e.queued = e.queued, nil
		}
		e.mu.Unlock()
		for _, w := range replay {
			copy(mem.Unsafe(w.Dst.Addr, w.Dst.Len), mem.Unsafe(w.Src.Addr, w.Src.Len))
		}
	}
	if err != nil {
		if w := ops[0]; e.fault == LateRefusedWrite && len(ops) == 1 && w.Src.Len == w.Dst.Len && w.Src.Len > 0 && !e.registered(w.Src) {
			e.late(func() {
				time.Sleep(lateDelay)
				copy(mem.Unsafe(w.Dst.Addr, w.Dst.Len), mem.Unsafe(w.Src.Addr, w.Src.Len))
			})
		}
		return nil, err
	}
	switch e.fault {
	case SerialPost:
		e.mu.Lock()
		e.prev = op
		e.mu.Unlock()
	case Retransmit:
		return &lateOp{Op: op, e: e, ops: ops, delay: resendDelay}, nil
	case ForgetFailsDone:
		o := &heldOp{Op: op, e: e, peer: peer}
		e.mu.Lock()
		if e.held == nil {
			e.held = map[*heldOp]struct{}{}
		}
		e.held[o] = struct{}{}
		e.mu.Unlock()
		return o, nil
	case CorruptByte:
		return &corruptOp{Op: op, dst: ops[0].Dst}, nil
	case CorruptLarge, CorruptAboveFragment:
		limit := uint64(1 << 20)
		if e.fault == CorruptAboveFragment {
			limit = fragmentSize
		}
		if total > limit {
			return &corruptOp{Op: op, dst: ops[0].Dst}, nil
		}
	case NeverComplete:
		return pendingOp{}, nil
	case LateWrite:
		return &lateOp{Op: op, e: e, ops: ops, delay: lateDelay}, nil
	case LandAfterLost:
		o := &lostOp{Op: op, peer: peer, ops: ops}
		e.mu.Lock()
		e.live = append(e.live, o)
		e.mu.Unlock()
		return o, nil
	case UnstableStatus:
		return &unstableOp{Op: op, e: e}, nil
	case UnprovenGiveUp:
		return &giveUpOp{Op: op, posted: time.Now()}, nil
	case SyncPost:
		for {
			if st, _ := op.Poll(); st.Terminal() {
				break
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	return op, nil
}

// lostOp reports ErrPeerLost once its engine's ForgetPeer said so.
type lostOp struct {
	transfer.Op
	peer string
	ops  []transfer.WriteOp
	mu   sync.Mutex
	lost error
}

func (o *lostOp) Poll() (transfer.Status, error) {
	o.mu.Lock()
	lost := o.lost
	o.mu.Unlock()
	if lost != nil {
		return transfer.Failed, lost
	}
	return o.Op.Poll()
}

func (o *lostOp) Release() error {
	o.mu.Lock()
	lost := o.lost
	o.mu.Unlock()
	if lost != nil {
		_ = o.Op.Release() // may still be pending: the lie of this fault
		return nil
	}
	return o.Op.Release()
}

// unstableOp forgets its terminal status once any op of its engine was
// released after it.
type unstableOp struct {
	transfer.Op
	e    *engine
	seen bool
	gen  uint64
}

func (o *unstableOp) Poll() (transfer.Status, error) {
	st, err := o.Op.Poll()
	if !st.Terminal() {
		return st, err
	}
	if !o.seen {
		o.seen, o.gen = true, o.e.releases.Load()
	}
	if o.e.releases.Load() != o.gen {
		return transfer.Pending, nil
	}
	return st, err
}

func (o *unstableOp) Release() error {
	o.e.releases.Add(1)
	return o.Op.Release()
}

// giveUpOp fails a write pending for longer than giveUpAfter with a plain
// timeout, although the write may still land. It is safe for concurrent
// use (a plugin polls an op from several calls at once).
type giveUpOp struct {
	transfer.Op
	posted time.Time
	mu     sync.Mutex
	gaveUp bool
}

func (o *giveUpOp) Poll() (transfer.Status, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.gaveUp {
		st, err := o.Op.Poll()
		if st != transfer.Pending || time.Since(o.posted) <= giveUpAfter {
			return st, err
		}
		o.gaveUp = true
	}
	return transfer.Failed, fmt.Errorf("broken: write gave up after %v: %w", giveUpAfter, transfer.ErrTimeout)
}

func (o *giveUpOp) Release() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.gaveUp {
		_ = o.Op.Release() // may still be pending: the give-up's lie
		return nil
	}
	return o.Op.Release()
}

func waitOp(op transfer.Op) {
	for {
		if st, _ := op.Poll(); st.Terminal() {
			_ = op.Release()
			return
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// doneOp is Done from the start.
type doneOp struct{}

func (doneOp) Poll() (transfer.Status, error) { return transfer.Done, nil }
func (doneOp) Release() error                 { return nil }

// pendingOp is never terminal.
type pendingOp struct{}

func (pendingOp) Poll() (transfer.Status, error) { return transfer.Pending, nil }
func (pendingOp) Release() error                 { return fmt.Errorf("broken: release: %w", transfer.ErrInUse) }

// swallowOp reports a failure as Done.
type swallowOp struct{ transfer.Op }

func (o *swallowOp) Poll() (transfer.Status, error) {
	st, _ := o.Op.Poll()
	if st == transfer.Failed {
		return transfer.Done, nil
	}
	return st, nil
}

// corruptOp flips a destination byte when the write is done.
type corruptOp struct {
	transfer.Op
	dst       transfer.Desc
	corrupted bool
}

func (o *corruptOp) Poll() (transfer.Status, error) {
	st, err := o.Op.Poll()
	if st == transfer.Done && !o.corrupted {
		o.corrupted = true
		k := min(17, o.dst.Len-1)
		mem.Unsafe(o.dst.Addr+k, 1)[0] ^= 0x5a
	}
	return st, err
}

// lateOp copies the sources over the destinations again, delay after
// Done.
type lateOp struct {
	transfer.Op
	e     *engine
	ops   []transfer.WriteOp
	delay time.Duration
	again bool
}

func (o *lateOp) Poll() (transfer.Status, error) {
	st, err := o.Op.Poll()
	if st == transfer.Done && !o.again {
		o.again = true
		ops := o.ops
		delay := o.delay
		o.e.late(func() {
			time.Sleep(delay)
			for _, w := range ops {
				copy(mem.Unsafe(w.Dst.Addr, w.Dst.Len), mem.Unsafe(w.Src.Addr, w.Src.Len))
			}
		})
	}
	return st, err
}

// CrosstalkChannels returns a ControlFactory of inproc channels that report
// every received message as coming from the first peer they were given: a
// channel with two peers mislabels the second one's messages
// (control/no-crosstalk).
func CrosstalkChannels() conformance.ControlFactory {
	return func() (conformance.ControlSet, error) {
		n := inproc.NewNetwork()
		var chans [3]transfer.ControlChannel
		for i, name := range []string{"a", "b", "c"} {
			ch, err := n.NewChannel(name, inproc.Options{})
			if err != nil {
				return conformance.ControlSet{}, err
			}
			chans[i] = &firstPeer{ControlChannel: ch}
		}
		return conformance.ControlSet{A: chans[0], B: chans[1], C: chans[2]}, nil
	}
}

// firstPeer labels every message with the first peer added.
type firstPeer struct {
	transfer.ControlChannel
	mu    sync.Mutex
	first string
}

func (c *firstPeer) AddPeer(peer, endpoint string) error {
	if err := c.ControlChannel.AddPeer(peer, endpoint); err != nil {
		return err
	}
	c.mu.Lock()
	if c.first == "" {
		c.first = peer
	}
	c.mu.Unlock()
	return nil
}

func (c *firstPeer) Recv(timeout time.Duration) (transfer.Message, error) {
	m, err := c.ControlChannel.Recv(timeout)
	if err == nil {
		c.mu.Lock()
		m.Peer = c.first
		c.mu.Unlock()
	}
	return m, err
}

// PartialGatherers returns a GathererFactory of synchronous host gatherers
// that check each run just before copying it, so a request whose last run
// is out of bounds is refused after the earlier runs were written
// (gather/failure-reported).
func PartialGatherers() conformance.GathererFactory {
	return func() (conformance.GathererFixture, error) {
		reg := &mem.Registry{}
		return conformance.GathererFixture{Gatherer: &partialGatherer{reg: reg}, Register: reg.Add}, nil
	}
}

type partialGatherer struct{ reg *mem.Registry }

func (g *partialGatherer) Gather(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	if _, err := g.reg.Find(region.Addr, region.Len); err != nil {
		return nil, fmt.Errorf("broken gather: region: %w", err)
	}
	for i, r := range runs {
		for k := range r.Count {
			ro, ao := r.RegionOff+k*r.RegionStride, r.Addr+k*r.AddrStride
			if !region.Contains(region.Addr+ro, r.Len) || region.Addr+ro < region.Addr {
				return nil, fmt.Errorf("broken gather: run %d copy %d: %w", i, k, transfer.ErrOutOfBounds)
			}
			src, err := g.reg.Slice(ao, r.Len)
			if err != nil {
				return nil, fmt.Errorf("broken gather: run %d copy %d: %w", i, k, err)
			}
			copy(mem.Unsafe(region.Addr+ro, r.Len), src)
		}
	}
	return doneOp{}, nil
}

func (g *partialGatherer) Close() error { return nil }

// heldOp fails once its engine's ForgetPeer said so, whatever it reported
// before: the ForgetFailsDone fault.
type heldOp struct {
	transfer.Op
	e    *engine
	peer string
	mu   sync.Mutex
	lost error
}

func (o *heldOp) Poll() (transfer.Status, error) {
	o.mu.Lock()
	lost := o.lost
	o.mu.Unlock()
	if lost != nil {
		return transfer.Failed, lost
	}
	return o.Op.Poll()
}

func (o *heldOp) Release() error {
	o.e.mu.Lock()
	delete(o.e.held, o)
	o.e.mu.Unlock()
	return o.Op.Release()
}

// hasty posts ops once A's stall lets it, and gives up on them after
// hastyAfter claiming quiescence; given up, it sends them again
// resendDelay after the stall ended.
func (e *engine) hasty(peer string, ops []transfer.WriteOp) transfer.Op {
	o := &hastyOp{posted: time.Now()}
	e.late(func() {
		e.valve.Wait(nil)
		if o.givenUp() {
			time.Sleep(resendDelay)
		}
		op, err := e.Engine.PostWrite(peer, ops)
		if err == nil {
			for {
				st, perr := op.Poll()
				if st.Terminal() {
					err = perr
					_ = op.Release()
					break
				}
				time.Sleep(100 * time.Microsecond)
			}
		}
		o.mu.Lock()
		o.done, o.err = true, err
		o.mu.Unlock()
	})
	return o
}

// hastyOp is a HastyGiveUp write.
type hastyOp struct {
	posted time.Time
	mu     sync.Mutex
	gaveUp bool
	done   bool
	err    error
}

func (o *hastyOp) givenUp() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.gaveUp
}

func (o *hastyOp) Poll() (transfer.Status, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case o.gaveUp:
		return transfer.Failed, fmt.Errorf("broken: write gave up after %v: %w", hastyAfter, transfer.ErrTimeout)
	case o.done && o.err != nil:
		return transfer.Failed, o.err
	case o.done:
		return transfer.Done, nil
	case time.Since(o.posted) > hastyAfter:
		o.gaveUp = true
		return transfer.Failed, fmt.Errorf("broken: write gave up after %v: %w", hastyAfter, transfer.ErrTimeout)
	}
	return transfer.Pending, nil
}

func (o *hastyOp) Release() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.gaveUp && !o.done {
		return fmt.Errorf("broken: release: %w", transfer.ErrInUse)
	}
	return nil
}

// TCPEngines returns an EngineFactory of tcp pairs (A's writes stalled by
// EnginePair.StallWrites through tcp.Config.Hold) whose B wraps the write
// or read guard as f says: GuardCached, GuardStartOnly or ReadUnguarded;
// zero wraps nothing, so the pair certifies.
func TCPEngines(f Fault) conformance.EngineFactory {
	return func() (conformance.EnginePair, error) { return tcpGuardPair(f) }
}

// tcpGuardPair is a pair of tcp engines whose B wraps the write guard as
// fault f says.
func tcpGuardPair(f Fault) (conformance.EnginePair, error) {
	valve := &conformance.Valve{}
	a, err := tcp.New(tcp.Config{Name: "a", Hold: valve.Wait})
	if err != nil {
		return conformance.EnginePair{}, err
	}
	b, err := tcp.New(tcp.Config{Name: "b"})
	if err != nil {
		a.Close()
		return conformance.EnginePair{}, err
	}
	eb := &guardWrap{Engine: b, fault: f}
	return conformance.EnginePair{
		A: a, B: eb,
		KillB:        func() { b.Close() },
		Cleanup:      func() { a.Close(); b.Close() },
		StallWrites:  valve.Stall,
		FragmentSize: tcp.MaxFramePayload,
	}, nil
}

// guardWrap is a tcp engine whose SetWriteGuard (or SetReadGuard) wraps
// the guard badly.
type guardWrap struct {
	*tcp.Engine
	fault Fault
}

// SetReadGuard installs g, or for ReadUnguarded a guard that allows every
// read whatever g says.
func (w *guardWrap) SetReadGuard(g transfer.ReadGuard) {
	if w.fault == ReadUnguarded {
		w.Engine.SetReadGuard(func(peer string, d transfer.Desc) (transfer.Desc, error) { return d, nil })
		return
	}
	w.Engine.SetReadGuard(g)
}

// SetWriteGuard installs g wrapped as the fault says.
func (w *guardWrap) SetWriteGuard(g transfer.WriteGuard) {
	if g == nil {
		w.Engine.SetWriteGuard(nil)
		return
	}
	switch w.fault {
	case GuardCached:
		var mu sync.Mutex
		cache := map[string][]transfer.Desc{}
		w.Engine.SetWriteGuard(func(peer string, d transfer.Desc) (transfer.Desc, error) {
			mu.Lock()
			defer mu.Unlock()
			for _, r := range cache[peer] {
				if r.Contains(d.Addr, d.Len) {
					return r, nil // admitted before: not asked again
				}
			}
			r, err := g(peer, d)
			if err == nil {
				cache[peer] = append(cache[peer], r)
			}
			return r, err
		})
	default:
		w.Engine.SetWriteGuard(g)
	case GuardStartOnly:
		w.Engine.SetWriteGuard(func(peer string, d transfer.Desc) (transfer.Desc, error) {
			first := d
			first.Len = min(d.Len, 1)
			r, err := g(peer, first)
			if err != nil {
				return r, err
			}
			if end := d.End(); end > r.End() {
				r.Len = end - r.Addr // the first byte vouches for the rest
			}
			return r, nil
		})
	}
}

// TCPEngine returns the tcp engine c configures, broken as f says, for a
// plugin process to serve (conformance/broken/tcpplugin): f is zero (the
// engine unbroken) or UnprovenGiveUp. It keeps every optional capability
// of the tcp engine, transfer.WriteStaller among them, so the suite stalls
// its writes through the plugin protocol.
func TCPEngine(f Fault, c tcp.Config) (transfer.Engine, error) {
	switch f {
	case 0, UnprovenGiveUp:
	default:
		return nil, fmt.Errorf("broken: fault %v is not offered over tcp; offered: %v", f, UnprovenGiveUp)
	}
	e, err := tcp.New(c)
	if err != nil {
		return nil, err
	}
	if f == 0 {
		return e, nil
	}
	return &tcpGiveUp{Engine: e}, nil
}

// tcpGiveUp is a tcp engine with the UnprovenGiveUp fault.
type tcpGiveUp struct{ *tcp.Engine }

// PostWrite posts through tcp and gives up on the write, claiming
// quiescence, once it was pending for giveUpAfter (a stalled one).
func (e *tcpGiveUp) PostWrite(peer string, ops []transfer.WriteOp) (transfer.Op, error) {
	op, err := e.Engine.PostWrite(peer, ops)
	if err != nil {
		return nil, err
	}
	return &giveUpOp{Op: op, posted: time.Now()}, nil
}

// ParseFault returns the fault String names; "" and "none" are zero.
func ParseFault(name string) (Fault, error) {
	if name == "" || name == "none" {
		return 0, nil
	}
	for f := CorruptByte; f <= ReadUnguarded; f++ {
		if f.String() == name {
			return f, nil
		}
	}
	return 0, fmt.Errorf("broken: no fault named %q", name)
}
