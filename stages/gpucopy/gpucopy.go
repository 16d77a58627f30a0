// Package gpucopy is the engine shared by the CUDA gather and scatter
// stages: one kernel launch per operation (never one per descriptor) over a
// bounded pool of copy contexts, each a CUDA stream, an event, a kernel
// parameter block and a piece table.
//
// Submit checks the region and every run against the registry before any
// byte moves: each registered range touched must be CUDA memory of the
// stage's device or host memory pinned and mapped for it (cuMemHostAlloc,
// cuMemHostRegister). It cuts the runs into pieces (package kernels),
// writes them into the context's pinned table (compact entries for runs
// of 4 KiB and more; a large request over several build workers), stages
// the table to the device when the table is not read zero-copy, launches
// the kernel and records the event. Poll queries the event and never
// blocks; Release returns the context. The registered ranges stay pinned
// until the operation is terminal.
//
// SubmitBlocks is the block-table form (transfer.BlockCopy): no piece
// table, the kernel computing each address from (region base, stride,
// id); the ids are checked once each, the registry once per pool region
// touched, and completion is a flag the kernel stores to host-mapped
// memory (Settings.Completion). SubmitShaped is the shaped block form
// (transfer.ShapedCopy: segments of groups of blocks, a layout
// conversion), the same kernel path with each segment's address computed
// on the device from a segment table uploaded once per shape. Launched
// counts the launches of each form,
// so a caller can tell which form the layers above used.
package gpucopy

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/cuda/kernels"
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
	if d == Scatter {
		return "scatter"
	}
	return "gather"
}

// Defaults and limits of Settings.
const (
	DefaultContexts = 8
	MaxContexts     = 1024
	// initialPieces is the piece capacity each context's table starts with;
	// a larger operation grows it (a one-off allocation).
	initialPieces = 4096
	// closeWait bounds how long Close waits for launched work.
	closeWait = 10 * time.Second
)

// Settings configure an Engine.
type Settings struct {
	// Context is the CUDA context of the device the kernels run on.
	// Required; the engine does not release it.
	Context *cuda.Context
	// Registry holds the memory that regions and run addresses must lie
	// in. Required.
	Registry *mem.Registry
	// Contexts bounds the operations submitted and not yet released
	// (default DefaultContexts); beyond it Submit returns ErrBusy.
	Contexts int
	// BuildWorkers bounds the goroutines one descriptor-form Submit
	// spreads its checks and (full) piece table over: 0 picks one per
	// 1,024 runs from 4,096 runs on, at most min(GOMAXPROCS, 8); 1 builds
	// on the calling goroutine alone.
	BuildWorkers int
	// ZeroCopyTable makes the kernel read its piece table straight from
	// pinned host memory; false stages the table to device memory first
	// (one small async copy on the same stream).
	ZeroCopyTable bool
	// Completion says how a block-form operation's end is seen (default
	// CompletionFlag); descriptor-form operations always use an event.
	Completion Completion
	// PTX overrides the embedded kernel module (nil: the embedded one
	// for the device, see kernels.Load).
	PTX []byte
	// fullTables never builds compact piece tables (tests measure both).
	fullTables bool
	// OnClose, when set, runs once at the end of Close (a factory that
	// retained Context releases it there).
	OnClose func() error
}

// Launched counts the operations an Engine launched in each form: Runs by
// Submit (a piece table), Blocks by SubmitBlocks (no piece table), Shaped
// by SubmitShaped.
type Launched struct{ Runs, Blocks, Shaped uint64 }

// Launched returns the operations launched so far in each form, so a
// caller can tell which form a layer above it used.
func (e *Engine) Launched() Launched {
	return Launched{Runs: e.launched.runs.Load(), Blocks: e.launched.blocks.Load(), Shaped: e.launched.shaped.Load()}
}

// Engine runs CUDA copies in one direction. It is safe for concurrent use.
type Engine struct {
	dir     Direction
	name    string
	cc      *cuda.Context
	reg     *mem.Registry
	mod     *kernels.Module
	zero    bool
	onClose func() error
	// completion of block-form operations
	completion Completion
	workers    int // Settings.BuildWorkers
	// fullTables is Settings.fullTables
	fullTables bool
	// launched counts the operations launched in each form (Launched).
	launched struct{ runs, blocks, shaped atomic.Uint64 }
	// segs caches the shaped form's segment tables on the device.
	segs segTables

	// mu guards the pool (free contexts, closed flag) and live, so a
	// launch is either seen by Close or refused.
	mu   sync.Mutex
	pool *ctxpool.Pool[*copyCtx]
	all  []*copyCtx
	live map[*op]struct{}
}

type copyCtx struct {
	stream  *cuda.Stream
	event   *cuda.Event
	args    *cuda.Args
	host    cuda.HostMem   // encoded piece table (pinned, device-mapped)
	dev     cuda.DevicePtr // staged copy of the table (0 when zero-copy)
	cap     int            // pieces the table holds
	pieces  []transfer.Run // the table before Encode, on a big-endian host only
	n       int            // pieces in the table
	compact bool           // the table is kernels.CompactPiece entries
	bytes   uint64         // payload bytes they move
	scope
	work []part   // the descriptor form's build workers (buildParallel)
	blk  blockBuf // the block form's ids, bases and completion flag
}

// scope is what one pass of checks has proved: the registered ranges
// touched (to pin) and the last one (the common case of the next run).
type scope struct {
	pins []uint64
	last transfer.Desc // the registered range the previous run lay in
}

// New validates s, loads the kernels and builds the context pool.
func New(dir Direction, s Settings) (*Engine, error) {
	name := dir.String() + "/cuda"
	if s.Context == nil {
		return nil, fmt.Errorf("%s: config: Context is required", name)
	}
	if s.Registry == nil {
		return nil, fmt.Errorf("%s: config: Registry is required", name)
	}
	n := s.Contexts
	switch {
	case n == 0:
		n = DefaultContexts
	case n < 0 || n > MaxContexts:
		return nil, fmt.Errorf("%s: config: Contexts %d outside [1, %d]", name, s.Contexts, MaxContexts)
	}
	mod, err := kernels.Load(s.Context, s.PTX)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if s.BuildWorkers < 0 {
		_ = mod.Unload()
		return nil, fmt.Errorf("%s: config: BuildWorkers %d is negative", name, s.BuildWorkers)
	}
	if s.Completion > CompletionEvent {
		_ = mod.Unload()
		return nil, fmt.Errorf("%s: config: unknown Completion %d", name, s.Completion)
	}
	e := &Engine{dir: dir, name: name, cc: s.Context, reg: s.Registry, mod: mod, zero: s.ZeroCopyTable, onClose: s.OnClose, completion: s.Completion, workers: s.BuildWorkers, fullTables: s.fullTables, live: map[*op]struct{}{}}
	for range n {
		c, err := e.newCtx()
		if err != nil {
			e.destroy()
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		e.all = append(e.all, c)
	}
	e.pool = ctxpool.New(name, &e.mu, slices.Clone(e.all))
	return e, nil
}

func (e *Engine) newCtx() (*copyCtx, error) {
	c := &copyCtx{}
	var err error
	if c.stream, err = e.cc.NewStream(); err != nil {
		return nil, err
	}
	if c.event, err = e.cc.NewEvent(false); err != nil {
		_ = c.stream.Destroy()
		return nil, err
	}
	if c.args, err = kernels.NewArgs(e.cc); err != nil {
		e.freeCtx(c)
		return nil, err
	}
	if err := e.grow(c, initialPieces, 0); err != nil {
		e.freeCtx(c)
		return nil, err
	}
	if e.mod.HasBlocks(kernels.BlockGeneral) {
		if err := e.newBlockBuf(c); err != nil {
			e.freeCtx(c)
			return nil, err
		}
	}
	return c, nil
}

// grow gives c a table of at least n pieces, keeping its first keep
// pieces. c is idle.
func (e *Engine) grow(c *copyCtx, n, keep int) error {
	if n <= c.cap {
		return nil
	}
	n = max(n, 2*c.cap)
	host, err := e.cc.HostAlloc(uint64(n) * kernels.PieceSize)
	if err != nil {
		return err
	}
	var dev cuda.DevicePtr
	if !e.zero {
		if dev, err = e.cc.MemAlloc(uint64(n) * kernels.PieceSize); err != nil {
			_ = e.cc.HostFree(host)
			return err
		}
	}
	copy(host.Bytes(), c.host.Bytes()[:keep*kernels.PieceSize])
	e.freeTable(c)
	c.host, c.dev, c.cap = host, dev, n
	return nil
}

func (e *Engine) freeTable(c *copyCtx) {
	if c.host.Host != 0 {
		_ = e.cc.HostFree(c.host)
		c.host = cuda.HostMem{}
	}
	if c.dev != 0 {
		_ = e.cc.MemFree(c.dev)
		c.dev = 0
	}
	c.cap = 0
}

func (e *Engine) freeCtx(c *copyCtx) {
	e.freeTable(c)
	e.freeBlockBuf(c)
	if c.args != nil {
		_ = c.args.Free()
	}
	if c.event != nil {
		_ = c.event.Destroy()
	}
	if c.stream != nil {
		_ = c.stream.Destroy()
	}
}

// MemoryKinds reports that the engine copies CUDA memory of its device
// and host memory pinned for it.
func (e *Engine) MemoryKinds() []transfer.MemKind {
	return []transfer.MemKind{transfer.Host, transfer.CUDA}
}

// Idle returns the number of copy contexts free right now.
func (e *Engine) Idle() int { return e.pool.Idle() }

// Submit checks region and runs and launches the copy. It never blocks on
// the copy: ErrBusy when every context is in use, ErrClosed after Close,
// and ErrOutOfBounds, ErrNotRegistered or ErrUnsupported (memory the
// device cannot reach) when a run falls outside the region or the
// registered memory, in which case nothing moves.
func (e *Engine) Submit(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	return submit(e, "", &e.launched.runs,
		func(c *copyCtx) (transfer.Desc, error) { return region, e.build(c, region, runs) },
		func(c *copyCtx, _ *op, region transfer.Desc) error { return e.launch(c, region) })
}

// submit is every form's lifecycle: take a context, build the form's job
// in it (every check, before any byte moves; a failure is wrapped with
// form), pin the memory it names, launch it under mu so Close either sees
// the operation live (and waits for it before unloading the module) or
// refuses it here, and count it in n. A failed launch waits for what was
// queued before it and gives everything back.
func submit[J any](e *Engine, form string, n *atomic.Uint64, build func(*copyCtx) (J, error), launch func(*copyCtx, *op, J) error) (transfer.Op, error) {
	c, err := e.pool.Get()
	if err != nil {
		return nil, err
	}
	c.pins = c.pins[:0]
	c.last = transfer.Desc{}
	j, err := build(c)
	if err != nil {
		e.put(c)
		return nil, fmt.Errorf("%s: %s%w", e.name, form, err)
	}
	if err := e.reg.Pin(c.pins); err != nil {
		e.put(c)
		return nil, fmt.Errorf("%s: %w", e.name, err)
	}
	o := &op{e: e, c: c}
	e.mu.Lock()
	if e.pool.ClosedLocked() {
		err = fmt.Errorf("submit: %w", transfer.ErrClosed)
	} else if err = launch(c, o, j); err == nil {
		e.live[o] = struct{}{}
		n.Add(1)
	}
	e.mu.Unlock()
	if err != nil {
		// Nothing was queued after a failed table copy or launch, or the
		// stream is broken; wait for what was queued before saying so.
		_ = c.stream.Synchronize()
		e.reg.Unpin(c.pins)
		e.put(c)
		return nil, fmt.Errorf("%s: %w", e.name, err)
	}
	return o, nil
}

// launch queues c's prepared table (staged to the device unless read
// zero-copy), the kernel and the event on c's stream.
func (e *Engine) launch(c *copyCtx, region transfer.Desc) error {
	np := c.n
	entry := uint64(kernels.PieceSize)
	if c.compact {
		entry = kernels.CompactSize
	}
	bytes := uint64(np) * entry
	if np > 0 {
		table := c.host.Dev
		if !e.zero {
			if err := c.stream.CopyHtoD(c.dev, c.host.Host, bytes); err != nil {
				return fmt.Errorf("stage piece table: %w", err)
			}
			table = c.dev
		}
		var err error
		if c.compact {
			err = e.mod.LaunchCompact(e.dir == Gather, c.stream, c.args, cuda.DevicePtr(region.Addr), table, uint64(np))
		} else {
			err = e.mod.Launch(e.dir == Gather, c.stream, c.args, cuda.DevicePtr(region.Addr), table, uint64(np), c.bytes)
		}
		if err != nil {
			return fmt.Errorf("launch: %w", err)
		}
	}
	return c.event.Record(c.stream)
}

// build checks the region and every run and writes c's piece table, in
// one pass: each run is read once, checked, and its pieces appended
// straight into the pinned table (kernels.View), so what was checked is
// what the kernel copies even if the caller changes runs meanwhile, and
// no run is copied or encoded twice. It records the registered ranges
// touched in c.pins. It touches no payload byte and queues nothing.
func (e *Engine) build(c *copyCtx, region transfer.Desc, runs []transfer.Run) error {
	if region.Len == 0 {
		return fmt.Errorf("region %v: empty: %w", region, transfer.ErrOutOfBounds)
	}
	rd, err := e.reg.FindKind(region.Kind, region.Device, region.Addr, region.Len)
	if err != nil {
		return fmt.Errorf("region %v: %w", region, err)
	}
	if err := e.touch(&c.scope, rd); err != nil {
		return fmt.Errorf("region %v: %w", region, err)
	}
	tab := kernels.View(c.host.Bytes())
	c.compact = false
	if tab != nil && e.compactFor(region, runs) {
		if ok, err := e.buildCompact(c, region, runs); err != nil || ok {
			return err
		}
		// A run a compact table cannot hold (strided): start over with
		// full pieces. The region's range is the first pin.
		c.pins, c.last = c.pins[:1], rd
	}
	if w := e.buildWorkers(len(runs)); w > 1 && tab != nil {
		return e.buildParallel(c, region, runs, w)
	}
	c.pieces = c.pieces[:0]
	c.bytes = 0
	for i := range runs {
		r := runs[i]
		if r.Len == 0 || r.Count == 0 {
			continue
		}
		if err := e.checkRun(&c.scope, region, i, r); err != nil {
			return err
		}
		c.bytes += r.Len * r.Count
		if tab == nil { // big-endian host: encoded below
			c.pieces = kernels.AppendPieces(c.pieces, r, kernels.PieceBytes)
			continue
		}
		// end <= region.Len bounds Len*Count, so k is at most a region's
		// bytes.
		if k := kernels.PieceCount(r, kernels.PieceBytes); uint64(len(tab))+k > uint64(cap(tab)) {
			n := len(tab)
			if err := e.grow(c, n+int(k), n); err != nil {
				return fmt.Errorf("piece table of %d pieces: %w", n+int(k), err)
			}
			tab = kernels.View(c.host.Bytes())[:n]
		}
		tab = kernels.AppendPieces(tab, r, kernels.PieceBytes)
	}
	if tab != nil {
		c.n = len(tab)
		return nil
	}
	c.n = len(c.pieces)
	if err := e.grow(c, c.n, 0); err != nil {
		return fmt.Errorf("piece table of %d pieces: %w", c.n, err)
	}
	return kernels.Encode(c.host.Bytes(), c.pieces)
}

// compactMinBytes is the first run's size from which build takes a
// compact table: at 4 KiB pieces the compact kernels match or beat the
// full ones, below they lose (512 B: 0.35 of one copy against 0.75,
// docs/BENCHMARKS.md issue 24), so smaller pieces keep the full table.
const compactMinBytes = 4 << 10

// compactFor reports whether build tries a compact table: the module has
// the kernels, the region's offsets fit, and the request's first
// non-empty run (KV requests are of one size) is at least
// compactMinBytes.
func (e *Engine) compactFor(region transfer.Desc, runs []transfer.Run) bool {
	if e.fullTables || !e.mod.HasCompact() || region.Len > kernels.MaxCompactRegion {
		return false
	}
	for _, r := range runs {
		if r.Len != 0 && r.Count != 0 {
			return r.Len >= compactMinBytes
		}
	}
	return false
}

// buildCompact is build's loop for a compact table (16 bytes a piece, a
// third of what the host writes for a full one): it reports false, having
// launched nothing, at the first run a compact table cannot hold.
func (e *Engine) buildCompact(c *copyCtx, region transfer.Desc, runs []transfer.Run) (bool, error) {
	tab := kernels.ViewCompact(c.host.Bytes())
	c.bytes = 0
	for i := range runs {
		r := runs[i]
		if r.Len == 0 || r.Count == 0 {
			continue
		}
		if !kernels.Compactable(r) {
			return false, nil
		}
		if err := e.checkRun(&c.scope, region, i, r); err != nil {
			return false, err
		}
		c.bytes += r.Len * r.Count
		if k := kernels.PieceCount(r, kernels.CompactMax); uint64(len(tab))+k > uint64(cap(tab)) {
			n := len(tab)
			full := func(m int) int { return (m*kernels.CompactSize + kernels.PieceSize - 1) / kernels.PieceSize }
			if err := e.grow(c, full(n+int(k)), full(n)); err != nil {
				return false, fmt.Errorf("piece table of %d pieces: %w", n+int(k), err)
			}
			tab = kernels.ViewCompact(c.host.Bytes())[:n]
		}
		tab = kernels.AppendCompact(tab, r, kernels.CompactMax)
	}
	c.n, c.compact = len(tab), true
	return true, nil
}

// checkRun checks run i (not empty) against the region and the registry,
// recording the ranges it touches in sc.
func (e *Engine) checkRun(sc *scope, region transfer.Desc, i int, r transfer.Run) error {
	if hi, _ := bits.Mul64(r.Len, r.Count); hi != 0 {
		return fmt.Errorf("run %d: %d copies of %d bytes overflow: %w", i, r.Count, r.Len, transfer.ErrOutOfBounds)
	}
	_, end, ok := r.RegionSpan()
	if !ok {
		return fmt.Errorf("run %d: region offsets overflow: %w", i, transfer.ErrOutOfBounds)
	}
	if end > region.Len {
		return fmt.Errorf("run %d: region bytes up to offset %d exceed the %d-byte region: %w", i, end, region.Len, transfer.ErrOutOfBounds)
	}
	if err := e.checkAddrs(sc, r); err != nil {
		return fmt.Errorf("run %d: %w", i, err)
	}
	return nil
}

// checkAddrs proves every copy of r lies in one registered range the
// device reaches; a strided run whose span crosses ranges is checked range
// by range, so the cost is bounded by the number of ranges, not by Count.
func (e *Engine) checkAddrs(c *scope, r transfer.Run) error {
	start, end, ok := r.AddrSpan()
	if !ok {
		return fmt.Errorf("addresses overflow (addr %#x, len %d, count %d, stride %d): %w", r.Addr, r.Len, r.Count, r.AddrStride, transfer.ErrOutOfBounds)
	}
	if c.last.Len != 0 && c.last.Contains(start, end-start) {
		return nil // the common case: the same range as the previous run
	}
	if d, err := e.reg.FindAny(start, end-start); err == nil {
		return e.touch(c, d)
	} else if r.Count == 1 || r.AddrStride == 0 {
		return err
	}
	for k := uint64(0); k < r.Count; {
		d, err := e.reg.FindAny(r.Addr+k*r.AddrStride, r.Len)
		if err != nil {
			return fmt.Errorf("copy %d: %w", k, err)
		}
		if err := e.touch(c, d); err != nil {
			return err
		}
		k = (d.End()-r.Len-r.Addr)/r.AddrStride + 1
	}
	return nil
}

// touch records that the copy uses registered range d, after checking the
// device reaches it.
func (e *Engine) touch(c *scope, d transfer.Desc) error {
	if slices.Contains(c.pins, d.Addr) {
		c.last = d
		return nil
	}
	if err := e.reachable(d); err != nil {
		return err
	}
	c.pins = append(c.pins, d.Addr)
	c.last = d
	return nil
}

// Reachable returns the registered range holding d and nil when the
// kernel can touch it, or why not (host memory not pinned for the device,
// memory of another device); a caller skips the other descriptors inside
// the range returned.
func (e *Engine) Reachable(d transfer.Desc) (transfer.Desc, error) {
	r, err := e.reg.FindAny(d.Addr, d.Len)
	if err != nil {
		return transfer.Desc{}, err
	}
	return r, e.reachable(r)
}

// reachable reports why the kernel cannot touch registered range d.
func (e *Engine) reachable(d transfer.Desc) error {
	switch d.Kind {
	case transfer.CUDA:
		if int(d.Device) != e.cc.Device() {
			return fmt.Errorf("%v is memory of device %d, the stage runs on device %d: %w", d, d.Device, e.cc.Device(), transfer.ErrUnsupported)
		}
		return nil
	case transfer.Host:
		dp, err := e.cc.HostDevicePointer(uintptr(d.Addr))
		if err != nil {
			return fmt.Errorf("%v is host memory not pinned for the device (cuMemHostAlloc or cuMemHostRegister it): %v: %w", d, err, transfer.ErrUnsupported)
		}
		if uint64(dp) != d.Addr {
			return fmt.Errorf("%v is pinned host memory mapped at device address %#x, not its host address: %w", d, uint64(dp), transfer.ErrUnsupported)
		}
		return nil
	default:
		return fmt.Errorf("%v: unknown memory kind: %w", d, transfer.ErrUnsupported)
	}
}

func (e *Engine) put(c *copyCtx) {
	if !e.pool.Put(c) {
		e.freeCtx(c) // closed: Close freed the contexts idle then, not this one
	}
}

// Close waits (bounded) for launched copies, finishes their operations
// (they keep their status and may still be released) and frees every idle
// context. It is idempotent.
func (e *Engine) Close() error {
	var live []*op
	closing := false
	free := e.pool.CloseWith(func() {
		closing = true
		live = make([]*op, 0, len(e.live))
		for o := range e.live {
			live = append(live, o)
		}
	})
	if !closing {
		return nil
	}
	var errs []error
	deadline := time.Now().Add(closeWait)
	for _, o := range live {
		for {
			s, _ := o.Poll()
			if s.Terminal() {
				break
			}
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("%s: close: a copy still runs after %v: %w", e.name, closeWait, transfer.ErrNotQuiescent))
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	for _, c := range free {
		e.freeCtx(c)
	}
	if len(errs) == 0 {
		e.freeSegTables()
		errs = append(errs, e.mod.Unload())
		if e.onClose != nil {
			errs = append(errs, e.onClose())
		}
	}
	return errors.Join(errs...)
}

// destroy frees the pool of a New that failed half-way.
func (e *Engine) destroy() {
	for _, c := range e.all {
		e.freeCtx(c)
	}
	e.freeSegTables()
	_ = e.mod.Unload()
}

// op is one launched copy.
type op struct {
	e *Engine
	c *copyCtx

	// flag, when set, is the pinned word a block-form kernel stores seq
	// to when done (CompletionFlag); misses counts the polls that found
	// it unset.
	flag   *uint32
	seq    uint32
	misses uint32

	mu       sync.Mutex
	state    transfer.Status
	err      error
	released bool
}

// Poll queries the copy's event (or reads its completion flag) without
// blocking.
func (o *op) Poll() (transfer.Status, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.state != transfer.Pending {
		return o.state, o.err
	}
	var done bool
	var err error
	if o.flag != nil {
		done, err = o.pollFlag()
	} else {
		done, err = o.c.event.Query()
	}
	if !done && err == nil {
		return transfer.Pending, nil
	}
	if err != nil {
		// A failed query is a sticky device error: the kernel's memory
		// accesses cannot be proved finished.
		o.state, o.err = transfer.Failed, fmt.Errorf("%s: %w: %w", o.e.name, err, transfer.ErrDeviceFault)
	} else {
		o.state = transfer.Done
		// Failed copies keep their ranges pinned: nothing proves the
		// device stopped touching them.
		o.e.reg.Unpin(o.c.pins)
	}
	o.e.mu.Lock()
	delete(o.e.live, o)
	o.e.mu.Unlock()
	return o.state, o.err
}

// Release returns the copy context once the operation is terminal.
func (o *op) Release() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.state == transfer.Pending {
		return fmt.Errorf("%s: release: copy still running: %w", o.e.name, transfer.ErrInUse)
	}
	if o.released {
		return fmt.Errorf("%s: release: operation already released: %w", o.e.name, transfer.ErrClosed)
	}
	o.released = true
	if o.state == transfer.Failed {
		// The context's stream and table may still be in use by a faulted
		// device: never reuse it.
		return nil
	}
	o.e.put(o.c)
	return nil
}
