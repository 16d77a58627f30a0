package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// Route is the path a transfer takes.
type Route uint8

const (
	// RouteAuto lets the agent decide (bounce when eligible, else direct).
	RouteAuto Route = iota
	// RouteBounce requires the bounce path: Submit refuses a transfer that
	// cannot take it (ErrBounceUnavailable, with the reason). The
	// descriptor gates do not apply.
	RouteBounce
	// RouteDirect forces the direct per-descriptor path.
	RouteDirect
)

// String returns "auto", "bounce" or "direct".
func (r Route) String() string {
	switch r {
	case RouteAuto:
		return "auto"
	case RouteBounce:
		return "bounce"
	case RouteDirect:
		return "direct"
	default:
		return fmt.Sprintf("route(%d)", uint8(r))
	}
}

// Request is one transfer: write Src[i] (local memory) to Dst[i] (the peer's
// memory) for every i, or, in the block-table form, the blocks Blocks names
// (then Src and Dst stay empty: a request has one form or the other). The
// agent reads Src and Dst (the slices, not only the memory they describe)
// until the batch is terminal: the direct path posts them later on the
// reactor, and the bounce path emits each chunk's runs from them as the
// chunk starts. The caller must not change them before.
type Request struct {
	Peer string
	Src  []transfer.Desc
	Dst  []transfer.Desc
	// Blocks, when set, makes this a block-table request (see
	// BlockRequest): pools registered once, blocks named by id.
	Blocks *BlockRequest
	Route  Route
	// OnComplete, if set, runs once on its own goroutine after the batch is
	// terminal. Release waits for it to return.
	OnComplete func(*Batch)
	// Tag is the caller's opaque tag for the request (at most wire.MaxTag =
	// 256 bytes; Submit refuses a longer one). It travels to the receiver,
	// whose completion event (Received) carries it.
	Tag []byte
}

// Batch is a submitted transfer. Its methods are safe for concurrent use.
type Batch struct {
	id     uint64
	route  Route
	reason string // why this route was chosen
	onDone func(*Batch)

	done chan struct{} // closed when terminal

	mu        sync.Mutex
	status    transfer.Status
	err       error
	quiescent bool
	fault     bool          // an op reported a device fault
	quiet     chan struct{} // closed when quiescent
	cbWG      sync.WaitGroup

	abandon func(time.Duration) transfer.AbandonOutcome // set by the agent

	obs batchObs // telemetry (set in Submit, then used on the reactor)

	plan   time.Duration // building the plan, at Submit
	stages Stages        // set by the reactor before a successful batch resolves

	// pred is route auto's prediction; observe, when set, is told how
	// long a successful batch took since start.
	pred    RoutePrediction
	start   time.Time
	observe func(time.Duration)
	// unpin, when set, runs once when the batch becomes quiescent (it
	// releases a block-table request's source pool).
	unpin func()
}

// setStages records a successful request's stage times (reactor only,
// before it resolves the batch).
func (b *Batch) setStages(s Stages) {
	b.mu.Lock()
	b.stages = s
	b.mu.Unlock()
}

// Stages returns where a successful request's time went (see Stages); it is
// zero until the batch is Done, and for a failed batch.
func (b *Batch) Stages() Stages {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.status != transfer.Done {
		return Stages{}
	}
	s := b.stages
	s.Plan = b.plan
	return s
}

func newBatch(id uint64, route Route, reason string, onDone func(*Batch)) *Batch {
	return &Batch{id: id, route: route, reason: reason, onDone: onDone, done: make(chan struct{}), quiet: make(chan struct{})}
}

// ID returns the agent-unique request id.
func (b *Batch) ID() uint64 { return b.id }

// TraceID returns the trace id of the request's bounce.transfer span (the
// one trace that holds both agents' spans of it), or "" when the request
// is not traced.
func (b *Batch) TraceID() string {
	if !b.obs.sc.IsValid() || !b.obs.sc.IsSampled() {
		return ""
	}
	return b.obs.sc.TraceID().String()
}

// Route returns the path the transfer took.
func (b *Batch) Route() Route { return b.route }

// RouteReason says why the route was chosen (for logs and summaries).
func (b *Batch) RouteReason() string { return b.reason }

// Prediction returns route auto's prediction of the request on both paths
// (Made false when the route was forced or the gates decided).
func (b *Batch) Prediction() RoutePrediction { return b.pred }

// Done is closed when the batch is terminal.
func (b *Batch) Done() <-chan struct{} { return b.done }

// Wait blocks until the batch is terminal or ctx ends. It returns nil on
// success, the failure cause on failure, or ctx's error; giving up a Wait does
// not change the batch (see Abandon).
func (b *Batch) Wait(ctx context.Context) error {
	select {
	case <-b.done:
		return b.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Status returns Pending, Done or Failed.
func (b *Batch) Status() transfer.Status {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.status
}

// Err returns the failure cause, or nil.
func (b *Batch) Err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// Retirement reports whether the batch is terminal (retired) and whether the
// agent proved that no engine or stage still touches the caller's buffers
// (quiescent). Retired but not quiescent means the buffers must not be freed.
// A batch can become quiescent after it retired, when work that outlived a
// timeout finally stops.
func (b *Batch) Retirement() (retired, quiescent bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.status.Terminal(), b.quiescent
}

// Quiescent is closed once the batch is quiescent.
func (b *Batch) Quiescent() <-chan struct{} { return b.quiet }

// Abandon gives up on the batch within timeout: a pending batch is failed
// (its flow cancelled) and the agent waits, at most timeout, for every op
// touching the caller's buffers to stop. Recoverable means the buffers may be
// released; DeviceFault means they never may (restart the engine);
// NotQuiescent means no proof came in time and the caller keeps waiting.
func (b *Batch) Abandon(timeout time.Duration) transfer.AbandonOutcome {
	if b.abandon == nil {
		return transfer.NotQuiescent
	}
	return b.abandon(timeout)
}

// Release ends the caller's use of the batch. It refuses (ErrNotQuiescent) a
// batch that is not quiescent, so no caller frees memory a transport may still
// touch. It waits for a running completion callback; after Release returns no
// callback runs. Releasing twice is harmless.
func (b *Batch) Release() error {
	b.mu.Lock()
	if !b.quiescent {
		st := b.status
		b.mu.Unlock()
		return fmt.Errorf("pipeline: release batch %d (%s): %w", b.id, st, transfer.ErrNotQuiescent)
	}
	b.mu.Unlock()
	b.cbWG.Wait()
	return nil
}

// finish publishes the terminal status. quiescent says whether every op that
// touched the caller's buffers is proved stopped. Only the first call has an
// effect; it reports whether this call did.
func (b *Batch) finish(err error, quiescent bool) bool {
	b.mu.Lock()
	if b.status.Terminal() {
		b.mu.Unlock()
		return false
	}
	if err != nil {
		b.status, b.err = transfer.Failed, err
	} else {
		b.status = transfer.Done
	}
	cb := b.onDone
	if cb != nil {
		b.cbWG.Add(1) // pinned before the status is visible to Release
	}
	b.mu.Unlock()
	if err == nil && b.observe != nil {
		b.observe(time.Since(b.start))
	}
	if quiescent {
		b.markQuiescent()
	}
	close(b.done)
	if cb != nil {
		go func() {
			defer b.cbWG.Done()
			cb(b)
		}()
	}
	return true
}

// markQuiescent records the proof of quiescence. Idempotent.
func (b *Batch) markQuiescent() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.quiescent || b.fault {
		return
	}
	b.quiescent = true
	close(b.quiet)
	if b.unpin != nil {
		b.unpin()
		b.unpin = nil
	}
}

// markFault records a device fault: the batch never becomes quiescent.
func (b *Batch) markFault() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fault = true
}

func (b *Batch) faulted() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fault
}

// ErrAbandoned is the failure cause of a batch the caller abandoned.
var ErrAbandoned = errors.New("abandoned by caller")
