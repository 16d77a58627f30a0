// Package broken holds deliberately broken implementations of the bounce
// interfaces, each violating one conformance rule on top of a correct
// in-tree implementation (engines/loopback, controlplane/inproc). They exist
// to show that the conformance suite rejects what it must; never use them
// for anything else.
package broken

import (
	"fmt"
	"sync"
	"time"

	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/controlplane/inproc"
	"github.com/bouncekv/bounce/engines/loopback"
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
	default:
		return fmt.Sprintf("fault(%d)", int(f))
	}
}

// How long EarlyDone waits before it copies, and LateWrite before it
// copies again.
const (
	earlyDelay = 20 * time.Millisecond
	lateDelay  = 5 * time.Millisecond
)

// Engines returns an EngineFactory of loopback pairs whose A engine has
// fault f, and stop, which ends any goroutine the fault leaked; call it
// when done with the factory.
func Engines(f Fault) (newPair conformance.EngineFactory, stop func()) {
	quit := make(chan struct{})
	var once sync.Once
	stop = func() { once.Do(func() { close(quit) }) }
	newPair = func() (conformance.EnginePair, error) {
		fab := loopback.NewFabric()
		a, err := fab.NewEngine("a")
		if err != nil {
			return conformance.EnginePair{}, err
		}
		b, err := fab.NewEngine("b")
		if err != nil {
			a.Close()
			return conformance.EnginePair{}, err
		}
		e := &engine{Engine: a, note: a, fault: f}
		if f == LeakGoroutine {
			go func() { <-quit }()
		}
		return conformance.EnginePair{
			A:       e,
			B:       b,
			KillB:   func() { b.Close() },
			Cleanup: func() { e.Close(); b.Close() },
		}, nil
	}
	return newPair, stop
}

// engine wraps a correct engine and breaks it as its fault says.
type engine struct {
	transfer.Engine
	note  transfer.Notifier
	fault Fault
	wg    sync.WaitGroup // goroutines writing late
}

// Notify forwards to the wrapped engine.
func (e *engine) Notify(peer string, payload []byte) error { return e.note.Notify(peer, payload) }

// RecvNotification forwards to the wrapped engine.
func (e *engine) RecvNotification(timeout time.Duration) (transfer.Message, error) {
	return e.note.RecvNotification(timeout)
}

// Close waits for the late writers, then closes the wrapped engine.
func (e *engine) Close() error {
	e.wg.Wait()
	return e.Engine.Close()
}

// PostWrite posts through the wrapped engine and breaks the result.
func (e *engine) PostWrite(peer string, ops []transfer.WriteOp) (transfer.Op, error) {
	ops = append([]transfer.WriteOp(nil), ops...)
	switch e.fault {
	case EarlyDone:
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			time.Sleep(earlyDelay)
			if op, err := e.Engine.PostWrite(peer, ops); err == nil {
				waitOp(op)
			}
		}()
		return doneOp{}, nil
	case SwallowFailure:
		op, err := e.Engine.PostWrite(peer, ops)
		if err != nil {
			return doneOp{}, nil
		}
		return &swallowOp{Op: op}, nil
	}
	op, err := e.Engine.PostWrite(peer, ops)
	if err != nil {
		return nil, err
	}
	switch e.fault {
	case CorruptByte:
		return &corruptOp{Op: op, dst: ops[0].Dst}, nil
	case NeverComplete:
		return pendingOp{}, nil
	case LateWrite:
		return &lateOp{Op: op, e: e, ops: ops}, nil
	}
	return op, nil
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

// lateOp copies the sources over the destinations again after Done.
type lateOp struct {
	transfer.Op
	e     *engine
	ops   []transfer.WriteOp
	again bool
}

func (o *lateOp) Poll() (transfer.Status, error) {
	st, err := o.Op.Poll()
	if st == transfer.Done && !o.again {
		o.again = true
		ops := o.ops
		o.e.wg.Add(1)
		go func() {
			defer o.e.wg.Done()
			time.Sleep(lateDelay)
			for _, w := range ops {
				copy(mem.Unsafe(w.Dst.Addr, w.Dst.Len), mem.Unsafe(w.Src.Addr, w.Src.Len))
			}
		}()
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
