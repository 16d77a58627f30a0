package pipeline

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/bouncekv/bounce/pipeline/credit"
	"github.com/bouncekv/bounce/transfer"
)

// errScatterCancelled is a task's result when its flow was given up before
// the scatter started: nothing was copied.
var errScatterCancelled = errors.New("scatter cancelled before it started")

// scatterTask is one DATA's scatter, shared by the reactor, which queues it
// and may cancel it, and the worker that runs it. Starting and cancelling
// are atomic with respect to each other under mu: a task cancelled before it
// started never starts, so no byte of a given-up flow reaches its
// destinations after the reactor let the flow go.
type scatterTask struct {
	// reading is set (by the reactor alone) while the chunk is still read
	// from the holder's staging (pullread.go): no worker has it yet.
	reading bool
	key     credit.FlowKey
	chunk   uint32
	region  transfer.Desc // the granted region in the local arena
	off     uint64        // the region's arena offset
	runs    []transfer.Run
	// blocks, when set, is a block-table chunk's copy (then runs is nil).
	blocks *transfer.BlockCopy
	// shaped, when set, is a converted block-table chunk's copy.
	shaped *transfer.ShapedCopy

	// Telemetry, set and read on the reactor only: the DATA's arrival and
	// the sender's chunk span it carried (zero unless the flow is traced),
	// and when the scatter was queued (the ACK's ScatterNS).
	at     time.Time
	parent trace.SpanContext
	queued time.Time

	mu        sync.Mutex
	started   bool
	cancelled bool

	err error // the outcome, set by the worker before it reports the task
}

// extent is the end of the bytes of its region the scatter reads: what a
// read of the holder's staging (pull by READ) must cover.
func (t *scatterTask) extent() uint64 {
	switch {
	case t.shaped != nil:
		return t.shaped.RegionOff + t.shaped.Bytes()
	case t.blocks != nil:
		return t.blocks.RegionOff + t.blocks.Bytes()
	}
	var end uint64
	for _, run := range t.runs {
		if run.Count > 0 {
			end = max(end, run.RegionOff+(run.Count-1)*run.RegionStride+run.Len)
		}
	}
	return end
}

// cancel stops the task if its scatter has not started. stopped is true
// when this call stopped it (it will never start); false when it had
// started already (it runs to completion and cannot be called back) or was
// cancelled before.
func (t *scatterTask) cancel() (stopped bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.started || t.cancelled {
		return false
	}
	t.cancelled = true
	return true
}

// launch starts the scatter unless the task was cancelled. The check and the
// start happen under one lock, so a concurrent cancel either comes first
// (the scatter never starts) or finds it started.
func (t *scatterTask) launch(s transfer.Scatterer) (transfer.Op, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cancelled {
		return nil, errScatterCancelled
	}
	var op transfer.Op
	var err error
	switch {
	case t.shaped != nil:
		op, err = scatterShaped(s, t.region, *t.shaped)
	case t.blocks != nil:
		op, err = scatterBlocks(s, t.region, *t.blocks)
	default:
		op, err = s.Scatter(t.region, t.runs)
	}
	if err == nil {
		t.started = true
	}
	return op, err
}

// payload is the bytes the task scatters.
func (t *scatterTask) payload() uint64 {
	if t.shaped != nil {
		return t.shaped.Bytes()
	}
	if t.blocks != nil {
		return t.blocks.Bytes()
	}
	var n uint64
	for i := range t.runs {
		n += t.runs[i].Len * t.runs[i].Count
	}
	return n
}

// doneSignaller is an op that closes a channel once it is terminal
// (the host copy stages' ops do), so a worker can block instead of polling.
type doneSignaller interface{ Done() <-chan struct{} }

// scatterWorker runs scatter tasks on its own goroutine: launch (retrying
// while the copy pool is busy, and giving up once the task is cancelled),
// wait for completion, hand the task back through report.
type scatterWorker struct {
	scatterer transfer.Scatterer
	tasks     <-chan *scatterTask
	quit      <-chan struct{}
	report    func(*scatterTask)
}

// run serves tasks until quit is closed.
func (w *scatterWorker) run() {
	for {
		var t *scatterTask
		select {
		case t = <-w.tasks:
		case <-w.quit:
			return
		}
		t.err = w.scatter(t)
		w.report(t)
	}
}

func (w *scatterWorker) scatter(t *scatterTask) error {
	back := time.Microsecond
	var op transfer.Op
	for {
		var err error
		op, err = t.launch(w.scatterer)
		if err == nil {
			break
		}
		if !errors.Is(err, transfer.ErrBusy) {
			return err
		}
		if !w.sleep(&back) {
			return transfer.ErrClosed
		}
	}
	if d, ok := op.(doneSignaller); ok {
		select {
		case <-d.Done():
		case <-w.quit:
			// The reactor quit under a running copy: Poll below says
			// whether it still runs.
		}
	}
	back = time.Microsecond
	for {
		st, err := op.Poll()
		if st.Terminal() {
			if rerr := op.Release(); rerr != nil && err == nil {
				err = rerr
			}
			return err
		}
		if !w.sleep(&back) {
			return fmt.Errorf("scatter abandoned at shutdown: %w", transfer.ErrNotQuiescent)
		}
	}
}

// sleep backs off exponentially up to 200µs; false once the reactor quit.
func (w *scatterWorker) sleep(back *time.Duration) bool {
	select {
	case <-w.quit:
		return false
	default:
	}
	if *back < 16*time.Microsecond {
		runtime.Gosched()
	} else {
		time.Sleep(*back)
	}
	if *back < 200*time.Microsecond {
		*back *= 2
	}
	return true
}
