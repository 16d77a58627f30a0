package pipeline

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/bouncekv/bounce/transfer"
)

// Fault injection: wrappers around the real components, used next to them.

// faultEngine wraps a real engine; while failWrites is set, every PostWrite
// returns an op that fails; while inUse is set, DeregisterMemory refuses as
// an engine does while a write uses the memory.
type faultEngine struct {
	transfer.Engine
	failWrites atomic.Bool
	inUse      atomic.Bool
	// unproven makes every PostWrite return an op that fails without proof
	// that the write stopped (ErrNotQuiescent); nothing is written.
	unproven atomic.Bool
}

func (e *faultEngine) DeregisterMemory(d transfer.Desc) error {
	if e.inUse.Load() {
		return fmt.Errorf("injected: %v in use: %w", d, transfer.ErrInUse)
	}
	return e.Engine.DeregisterMemory(d)
}

func (e *faultEngine) PostWrite(peer string, ops []transfer.WriteOp) (transfer.Op, error) {
	if e.unproven.Load() {
		return &doneOp{err: fmt.Errorf("injected: write may still land: %w", transfer.ErrNotQuiescent)}, nil
	}
	if e.failWrites.Load() {
		return &doneOp{err: fmt.Errorf("injected engine failure: %w", transfer.ErrPeerLost)}, nil
	}
	return e.Engine.PostWrite(peer, ops)
}

// doneOp is an op that is already terminal.
type doneOp struct{ err error }

func (o *doneOp) Poll() (transfer.Status, error) {
	if o.err != nil {
		return transfer.Failed, o.err
	}
	return transfer.Done, nil
}
func (o *doneOp) Release() error { return nil }

// faultScatterer wraps a real scatterer; while fail is set every scatter
// fails after doing nothing. While hold is set every scatter does nothing
// and stays Pending until release, then fails: its request is in flight
// and never ACKed (the receiver NACKs a failed scatter at once).
type faultScatterer struct {
	transfer.Scatterer
	fail     atomic.Bool
	hold     atomic.Bool
	held     atomic.Int64 // scatters begun while hold was set
	once     sync.Once
	released chan struct{}
}

func (s *faultScatterer) Scatter(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	if s.hold.Load() {
		s.held.Add(1)
		return &heldScatterOp{released: s.released}, nil
	}
	if s.fail.Load() {
		return &doneOp{err: fmt.Errorf("injected scatter failure")}, nil
	}
	return s.Scatterer.Scatter(region, runs)
}

// release ends the held scatters (they fail).
func (s *faultScatterer) release() { s.once.Do(func() { close(s.released) }) }

// heldScatterOp is Pending until released, then Failed.
type heldScatterOp struct{ released chan struct{} }

func (o *heldScatterOp) Poll() (transfer.Status, error) {
	select {
	case <-o.released:
		return transfer.Failed, fmt.Errorf("injected scatter failure (held)")
	default:
		return transfer.Pending, nil
	}
}

func (o *heldScatterOp) Release() error { return nil }

// stallGatherer wraps a real gatherer. While stalled, each gather is
// launched for real but its op reports Pending until release is closed; it
// then reports the real result, or outcome when set.
type stallGatherer struct {
	transfer.Gatherer
	mu      sync.Mutex
	stalled bool
	release chan struct{}
	outcome error // reported instead of the real result once released
}

func newStallGatherer(g transfer.Gatherer) *stallGatherer {
	return &stallGatherer{Gatherer: g, release: make(chan struct{})}
}

func (s *stallGatherer) stall(on bool) {
	s.mu.Lock()
	s.stalled = on
	s.mu.Unlock()
}

func (s *stallGatherer) Gather(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	op, err := s.Gatherer.Gather(region, runs)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.stalled {
		return op, nil
	}
	return &stalledOp{Op: op, s: s}, nil
}

type stalledOp struct {
	transfer.Op
	s *stallGatherer
}

func (o *stalledOp) Poll() (transfer.Status, error) {
	select {
	case <-o.s.release:
	default:
		return transfer.Pending, nil
	}
	st, err := o.Op.Poll()
	if st.Terminal() && o.s.outcome != nil {
		return transfer.Failed, o.s.outcome
	}
	return st, err
}

func (o *stalledOp) Release() error {
	// The real op may still be pending if Poll never saw it terminal.
	for {
		if st, _ := o.Op.Poll(); st.Terminal() {
			return o.Op.Release()
		}
	}
}

// busyScatterer wraps a real scatterer; while busy is set every Scatter
// answers ErrBusy (a full copy pool) and counts the try.
type busyScatterer struct {
	transfer.Scatterer
	busy  atomic.Bool
	tries atomic.Int64
}

func (s *busyScatterer) Scatter(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	if s.busy.Load() {
		s.tries.Add(1)
		return nil, fmt.Errorf("injected: copy pool full: %w", transfer.ErrBusy)
	}
	return s.Scatterer.Scatter(region, runs)
}

// plainEngine hides every optional capability of the engine it wraps (a
// Fencer among them): the agent sees an engine that proves nothing.
type plainEngine struct{ transfer.Engine }

// fencingEngine claims to fence forgotten peers (transfer.Fencer) whatever
// the engine it wraps does, for fault injection.
type fencingEngine struct{ transfer.Engine }

func (e *fencingEngine) FencesForgottenPeers() bool { return true }
