// Package hostcopy is the engine shared by the host gather and scatter
// stages: a bounded pool of copy contexts, a fixed set of copy workers, and
// the validation of runs against a region and registered host memory.
//
// Submit checks every run before any byte moves, borrows a copy context
// without blocking (ErrBusy when none is free), cuts the copy into shares of
// about equal bytes (at most one per worker and one per MinShareBytes) and
// queues them, so one large operation runs on several workers at once. Runs
// that overlap (in the region or in memory) are therefore copied in no
// particular order; the pipeline's plans never overlap. The returned
// transfer.Op is terminal when its last share is; it is polled without
// blocking, and Release gives the context back to the pool.
package hostcopy

import (
	"fmt"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/bouncekv/bounce/internal/ctxpool"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// Direction says which way a run's bytes move.
type Direction uint8

const (
	// Gather copies each run's addresses into the region.
	Gather Direction = iota
	// Scatter copies the region out to each run's addresses.
	Scatter
)

// String returns "gather" or "scatter".
func (d Direction) String() string {
	switch d {
	case Gather:
		return "gather"
	case Scatter:
		return "scatter"
	default:
		return fmt.Sprintf("direction(%d)", uint8(d))
	}
}

// Defaults and limits of Config.
const (
	// DefaultContexts is the pool size used when Config.Contexts is zero.
	DefaultContexts = 8
	// MaxDefaultWorkers caps the worker count used when Config.Workers is
	// zero: the number of CPUs (GOMAXPROCS), at least 2 and at most this.
	MaxDefaultWorkers = 8
	// MaxContexts is the largest accepted Config.Contexts.
	MaxContexts = 4096
	// MaxWorkers is the largest accepted Config.Workers.
	MaxWorkers = 256
	// MinShareBytes is the smallest share an operation is cut into: an
	// operation of fewer than twice as many bytes runs on one worker.
	MinShareBytes = 512 << 10
)

// DefaultWorkers returns the worker count used when Config.Workers is zero.
func DefaultWorkers() int { return max(2, min(runtime.GOMAXPROCS(0), MaxDefaultWorkers)) }

// retainRuns is the largest run buffer a released context keeps for reuse.
const retainRuns = 1 << 16

// Settings configure an Engine; the host stages (gather, scatter) use them
// as their own Settings.
type Settings struct {
	// Registry holds the host memory that regions and run addresses must
	// lie in. Required.
	Registry *mem.Registry
	// Contexts bounds the operations submitted and not yet released
	// (default DefaultContexts); beyond it the stage returns ErrBusy.
	Contexts int
	// Workers is the number of copy goroutines (default DefaultWorkers()).
	// One operation is shared among up to Workers of them.
	Workers int
	// Notify, when set, is called once per operation right after it
	// becomes terminal, from a worker goroutine (or from Close for queued
	// operations it fails). It must not block: Signal(ch) builds the usual
	// non-blocking send on a channel of capacity one, so a reactor can sleep
	// on ch instead of polling in a loop.
	Notify func()
}

// Signal returns a Notify function that does a non-blocking send on ch. With
// a channel of capacity one, a reactor that drains ch and then polls its
// outstanding operations never misses a completion.
func Signal(ch chan<- struct{}) func() {
	return func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Engine runs host copies in one direction. It is safe for concurrent use.
type Engine struct {
	dir    Direction
	name   string
	reg    *mem.Registry
	notify func()

	workers int

	// mu guards the pool (its free contexts and closed flag) and the
	// queue; workers wait on cond over it.
	mu   sync.Mutex
	cond *sync.Cond
	pool *ctxpool.Pool[*copyCtx]
	// queue is a ring of submitted, not yet started shares; it never holds
	// more than workers shares per context.
	queue  []share
	head   int
	queued int

	wg        sync.WaitGroup
	closeOnce sync.Once

	// beforeCopy is a test hook run by a worker before each copy.
	beforeCopy func()
}

type copyCtx struct {
	runs   []transfer.Run      // the submitted runs, validated
	split  []transfer.Run      // runs cut at share boundaries
	bounds []int               // end index in split of each share
	pins   []uint64            // the registered ranges the copy touches, pinned while it runs
	blk    transfer.BlockCopy  // a block-table copy's chunk (SubmitBlocks)
	shp    transfer.ShapedCopy // a shaped copy's units (SubmitShaped)
}

// touch records that the copy uses the registered range starting at a.
func (c *copyCtx) touch(a uint64) {
	if !slices.Contains(c.pins, a) {
		c.pins = append(c.pins, a)
	}
}

// share is one worker's part of an operation: runs, or pieces [lo, hi)
// of a block copy.
type share struct {
	o      *op
	runs   []transfer.Run
	blk    *transfer.BlockCopy
	shp    *transfer.ShapedCopy
	lo, hi uint64
}

// New validates cfg and starts the engine's workers. Close stops them.
func New(dir Direction, cfg Settings) (*Engine, error) {
	name := dir.String() + "/host"
	if dir != Gather && dir != Scatter {
		return nil, fmt.Errorf("hostcopy: unknown direction %d", uint8(dir))
	}
	if cfg.Registry == nil {
		return nil, fmt.Errorf("%s: config: Registry is required", name)
	}
	contexts := cfg.Contexts
	switch {
	case contexts == 0:
		contexts = DefaultContexts
	case contexts < 0 || contexts > MaxContexts:
		return nil, fmt.Errorf("%s: config: Contexts %d outside [1, %d]", name, cfg.Contexts, MaxContexts)
	}
	workers := cfg.Workers
	switch {
	case workers == 0:
		workers = DefaultWorkers()
	case workers < 0 || workers > MaxWorkers:
		return nil, fmt.Errorf("%s: config: Workers %d outside [1, %d]", name, cfg.Workers, MaxWorkers)
	}
	e := &Engine{
		dir:     dir,
		name:    name,
		reg:     cfg.Registry,
		notify:  cfg.Notify,
		workers: workers,
		queue:   make([]share, contexts*workers),
	}
	e.cond = sync.NewCond(&e.mu)
	free := make([]*copyCtx, contexts)
	for i := range free {
		free[i] = &copyCtx{}
	}
	e.pool = ctxpool.New(name, &e.mu, free)
	e.wg.Add(workers)
	for range workers {
		go e.work()
	}
	return e, nil
}

// Submit checks region and runs and queues the copy. It never blocks on the
// copy: it returns an error wrapping ErrBusy when every context is in use,
// ErrClosed after Close, and ErrOutOfBounds, ErrNotRegistered or
// ErrUnsupported when a run falls outside the region or registered host
// memory, in which case nothing is written. Runs that move no bytes (Len or
// Count zero) are skipped. The caller may reuse runs once Submit returns.
//
// The registered ranges the region and runs lie in stay pinned until the
// operation is terminal (the Registry refuses to remove them); the memory
// must stay mapped as long.
func (e *Engine) Submit(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	ctx, err := e.pool.Get()
	if err != nil {
		return nil, err
	}

	// Validate the private copy, so a caller mutating runs concurrently
	// cannot slip an unchecked run past validation.
	ctx.runs = append(ctx.runs[:0], runs...)
	ctx.pins = ctx.pins[:0]
	if err := e.validate(ctx, region); err != nil {
		e.putCtx(ctx)
		return nil, fmt.Errorf("%s: %w", e.name, err)
	}
	// Pinned until the copy ends, so the memory cannot be deregistered (and
	// then freed) under it.
	if err := e.reg.Pin(ctx.pins); err != nil {
		e.putCtx(ctx)
		return nil, fmt.Errorf("%s: %w", e.name, err)
	}
	ctx.split, ctx.bounds = Split(ctx.split[:0], ctx.bounds[:0], ctx.runs, e.workers, MinShareBytes)
	o := &op{e: e, ctx: ctx, region: region, done: make(chan struct{})}
	o.left.Store(int32(len(ctx.bounds)))

	e.mu.Lock()
	if e.pool.ClosedLocked() {
		e.mu.Unlock()
		e.reg.Unpin(ctx.pins)
		e.putCtx(ctx)
		return nil, fmt.Errorf("%s: submit: %w", e.name, transfer.ErrClosed)
	}
	lo := 0
	for _, hi := range ctx.bounds {
		e.queue[(e.head+e.queued)%len(e.queue)] = share{o: o, runs: ctx.split[lo:hi]}
		e.queued++
		lo = hi
	}
	if len(ctx.bounds) == 1 {
		e.cond.Signal()
	} else {
		e.cond.Broadcast()
	}
	e.mu.Unlock()
	return o, nil
}

// Idle returns the number of copy contexts free right now.
func (e *Engine) Idle() int { return e.pool.Idle() }

// Close stops the engine: queued operations fail with ErrClosed, running
// copies finish, and Close returns once every worker has exited. An
// operation of several shares that was partly running fails too, with the
// bytes of its finished shares already moved. Operations keep their status
// and may still be released. Close is idempotent.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		var queued []*op
		e.pool.CloseWith(func() {
			queued = make([]*op, 0, e.queued)
			for ; e.queued > 0; e.queued-- {
				queued = append(queued, e.queue[e.head].o)
				e.queue[e.head] = share{}
				e.head = (e.head + 1) % len(e.queue)
			}
			e.cond.Broadcast()
		})
		for _, o := range queued {
			o.shareDone(fmt.Errorf("%s: queued copy: %w", e.name, transfer.ErrClosed))
		}
		e.wg.Wait()
	})
	return nil
}

func (e *Engine) putCtx(ctx *copyCtx) {
	if cap(ctx.runs) > retainRuns {
		ctx.runs = nil
	}
	if cap(ctx.split) > retainRuns {
		ctx.split = nil
	}
	ctx.blk = transfer.BlockCopy{} // drop the caller's ids
	ctx.shp = transfer.ShapedCopy{}
	e.pool.Put(ctx) // after Close the context is dropped: it holds only Go memory
}

func (e *Engine) work() {
	defer e.wg.Done()
	for {
		e.mu.Lock()
		for e.queued == 0 && !e.pool.ClosedLocked() {
			e.cond.Wait()
		}
		if e.queued == 0 {
			e.mu.Unlock()
			return
		}
		sh := e.queue[e.head]
		e.queue[e.head] = share{}
		e.head = (e.head + 1) % len(e.queue)
		e.queued--
		e.mu.Unlock()

		if e.beforeCopy != nil {
			e.beforeCopy()
		}
		if sh.blk != nil {
			sh.o.shareDone(e.copyBlocks(sh.o.region.Addr, sh.blk, sh.lo, sh.hi))
			continue
		}
		if sh.shp != nil {
			sh.o.shareDone(e.copyShaped(sh.o.region.Addr, sh.shp, sh.lo, sh.hi))
			continue
		}
		e.copyRuns(sh.o.region.Addr, sh.runs)
		sh.o.shareDone(nil)
	}
}

// copyRuns moves the bytes of validated runs.
func (e *Engine) copyRuns(base uint64, runs []transfer.Run) {
	for _, r := range runs {
		if r.Len == 0 || r.Count == 0 {
			continue
		}
		if r.Count == 1 || (r.RegionStride == r.Len && r.AddrStride == r.Len) {
			e.copyOne(base+r.RegionOff, r.Addr, r.Len*r.Count)
			continue
		}
		for i := range r.Count {
			e.copyOne(base+r.RegionOff+i*r.RegionStride, r.Addr+i*r.AddrStride, r.Len)
		}
	}
}

func (e *Engine) copyOne(regionAddr, addr, n uint64) {
	reg, ext := mem.Unsafe(regionAddr, n), mem.Unsafe(addr, n)
	if e.dir == Gather {
		copy(reg, ext)
	} else {
		copy(ext, reg)
	}
}

// validate checks the region and every run of ctx and records the
// registered ranges they use in ctx.pins. It touches no payload byte.
func (e *Engine) validate(ctx *copyCtx, region transfer.Desc) error {
	runs := ctx.runs
	if region.Kind != transfer.Host {
		return fmt.Errorf("region %v: only host memory: %w", region, transfer.ErrUnsupported)
	}
	if region.Len == 0 {
		return fmt.Errorf("region %v: empty: %w", region, transfer.ErrOutOfBounds)
	}
	rd, err := e.reg.Find(region.Addr, region.Len)
	if err != nil {
		return fmt.Errorf("region %v: %w", region, err)
	}
	ctx.touch(rd.Addr)
	for i, r := range runs {
		if r.Len == 0 || r.Count == 0 {
			continue
		}
		if hi, _ := bits.Mul64(r.Len, r.Count); hi != 0 {
			return fmt.Errorf("run %d: %d copies of %d bytes overflow: %w", i, r.Count, r.Len, transfer.ErrOutOfBounds)
		}
		_, end, ok := r.RegionSpan()
		if !ok {
			return fmt.Errorf("run %d: region offsets overflow (off %d, len %d, count %d, stride %d): %w",
				i, r.RegionOff, r.Len, r.Count, r.RegionStride, transfer.ErrOutOfBounds)
		}
		if end > region.Len {
			return fmt.Errorf("run %d: region bytes up to offset %d exceed the %d-byte region: %w",
				i, end, region.Len, transfer.ErrOutOfBounds)
		}
		if err := e.checkAddrs(ctx, r); err != nil {
			return fmt.Errorf("run %d: %w", i, err)
		}
	}
	return nil
}

// checkAddrs proves that every copy of r lies in one registered range. The
// common case is one lookup for the whole span; a strided run whose span
// crosses registrations is checked copy by copy, jumping over all copies
// that fit the range just found, so the cost is bounded by the number of
// ranges, not by Count.
func (e *Engine) checkAddrs(ctx *copyCtx, r transfer.Run) error {
	start, end, ok := r.AddrSpan()
	if !ok {
		return fmt.Errorf("addresses overflow (addr %#x, len %d, count %d, stride %d): %w",
			r.Addr, r.Len, r.Count, r.AddrStride, transfer.ErrOutOfBounds)
	}
	d, err := e.reg.Find(start, end-start)
	if err == nil {
		ctx.touch(d.Addr)
		return nil
	}
	if r.Count == 1 || r.AddrStride == 0 {
		return err
	}
	for k := uint64(0); k < r.Count; {
		d, err := e.reg.Find(r.Addr+k*r.AddrStride, r.Len)
		if err != nil {
			return fmt.Errorf("copy %d: %w", k, err)
		}
		ctx.touch(d.Addr)
		// The last copy index j with Addr+j*stride+Len <= d.End(); copy k
		// fits, so j >= k and the subtraction cannot underflow.
		k = (d.End()-r.Len-r.Addr)/r.AddrStride + 1
	}
	return nil
}

// op is one submitted copy.
type op struct {
	e        *Engine
	ctx      *copyCtx
	region   transfer.Desc
	left     atomic.Int32          // shares not yet finished
	failure  atomic.Pointer[error] // the first share's error
	state    atomic.Uint32         // transfer.Status
	err      error                 // written before state becomes terminal
	released atomic.Bool
	done     chan struct{} // closed once terminal
}

// shareDone records one finished share; the last one makes the operation
// terminal: Failed with the first share error, else Done.
func (o *op) shareDone(err error) {
	if err != nil {
		o.failure.CompareAndSwap(nil, &err)
	}
	if o.left.Add(-1) != 0 {
		return
	}
	o.e.reg.Unpin(o.ctx.pins)
	if p := o.failure.Load(); p != nil {
		o.err = *p
		o.state.Store(uint32(transfer.Failed))
	} else {
		o.state.Store(uint32(transfer.Done))
	}
	close(o.done)
	if o.e.notify != nil {
		o.e.notify()
	}
}

// Done returns a channel closed once the operation is terminal, so a
// waiter can block on it instead of polling.
func (o *op) Done() <-chan struct{} { return o.done }

// Poll reports the operation's status without blocking.
func (o *op) Poll() (transfer.Status, error) {
	s := transfer.Status(o.state.Load())
	if s == transfer.Pending {
		return s, nil
	}
	return s, o.err
}

// Release returns the copy context to the pool once the operation is
// terminal.
func (o *op) Release() error {
	if transfer.Status(o.state.Load()) == transfer.Pending {
		return fmt.Errorf("%s: release: copy still running: %w", o.e.name, transfer.ErrInUse)
	}
	if o.released.Swap(true) {
		return fmt.Errorf("%s: release: operation already released: %w", o.e.name, transfer.ErrClosed)
	}
	ctx := o.ctx
	o.ctx = nil
	o.e.putCtx(ctx)
	return nil
}
