// Package cudacopy is a single-host transfer.Engine on one GPU (or peer
// GPUs of one host): engines made by one Fabric, in one process, write into
// each other's registered memory with asynchronous CUDA copies —
// cuMemcpyDtoDAsync on one device, cuMemcpyPeerAsync between devices,
// cuMemcpyAsync where a side is pinned host memory — and an operation is
// Done when its CUDA event has completed, which Poll queries without
// blocking.
//
// Its direct path is the honest per-descriptor baseline: one copy per
// write op, or one cuMemcpyBatchAsync per BatchMax ops where the driver
// exports it (Config.Batch). Registered host memory is page-locked with
// cuMemHostRegister (unless the driver already knows it as pinned), so the
// engine also serves host memory. With Config.IPC an engine also writes
// into engines of other processes on the host through CUDA IPC (ipc.go).
package cudacopy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/engines/internal/writeset"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// Limits.
const (
	// MaxStreams bounds the operations in flight per engine; a post beyond
	// it is ErrBusy.
	MaxStreams = 256
	// BatchMax is the most copies one cuMemcpyBatchAsync call carries.
	BatchMax = 4096
	// waitBound bounds how long ForgetPeer and Close wait for copies.
	waitBound = 10 * time.Second
)

// Fabric connects the engines created from it (one process, one driver).
// It is safe for concurrent use.
type Fabric struct {
	id  uint64
	lib *cuda.Lib

	mu      sync.Mutex
	engines map[string]*Engine
	nextInc uint64
}

// NewFabric returns an empty fabric whose engines open the driver through
// lib (a nil lib opens cuda.LibName lazily).
func NewFabric(lib *cuda.Lib) *Fabric {
	if lib == nil {
		lib = &cuda.Lib{}
	}
	return &Fabric{id: rand.Uint64(), lib: lib, engines: map[string]*Engine{}}
}

// Config configures an engine.
type Config struct {
	// Name is the engine's name, unique on the fabric.
	Name string
	// Device is the CUDA ordinal the engine's streams run on.
	Device int
	// Batch posts a multi-op write as cuMemcpyBatchAsync calls where the
	// driver exports it (else one async copy per op).
	Batch bool
	// OnComplete, when set, is called after Poll first observes an
	// operation terminal. It must not block.
	OnComplete func()
	// IPC exports the CUDA memory this engine registers (cuIpcGetMemHandle,
	// listed in its Metadata) and lets LoadPeer take metadata of an engine
	// in another process on the same host, whose exported memory it opens
	// (cuIpcOpenMemHandle) and writes. With it on the engine does not fence
	// forgotten peers: it cannot stop another process's copies.
	IPC bool
	// Hold, when set, runs on a goroutine of each posted operation before
	// its copies are queued and may block; abort is closed when the
	// operation is failed by ForgetPeer or Close, and Hold must return by
	// then. A held operation stays pending and moves nothing; one failed
	// while held moves nothing at all. It lets a test stall writes.
	Hold func(abort <-chan struct{})
}

// Engine is one agent's endpoint on a Fabric. It is safe for concurrent use.
type Engine struct {
	fab   *Fabric
	name  string
	inc   uint64
	cfg   Config
	cc    *cuda.Context
	reg   mem.Registry
	owned map[uint64]bool // host ranges this engine cuMemHostRegister'ed

	// Guarded by fab.mu.
	closed  bool
	peers   map[string]*Engine
	fenced  map[string]bool // forgotten peers, refused until loaded again
	out     map[*writeOp]struct{}
	in      map[*writeOp]struct{}
	streams []*slot // idle
	nslots  int
	batch   *cuda.BatchCopy

	// CUDA IPC (Config.IPC), guarded by fab.mu.
	host    [16]byte
	exports map[uint64]export          // by registered range Addr
	remotes map[string]*remote         // peers of other processes
	opened  map[cuda.IPCHandle]*opened // their allocations mapped here
}

type slot struct {
	stream *cuda.Stream
	event  *cuda.Event
}

var (
	_ transfer.Engine = (*Engine)(nil)
	_ transfer.Fencer = (*Engine)(nil)
)

// FencesForgottenPeers reports true without IPC: once ForgetPeer(p)
// returns, p's copies into this engine's memory have stopped and its later
// posts are refused until p is loaded again. With IPC it is false: a peer
// in another process writes through its own mapping.
func (e *Engine) FencesForgottenPeers() bool { return !e.cfg.IPC }

// NewEngine opens the driver (on first use), retains the device's primary
// context and creates the engine. Without a GPU the error wraps
// cuda.ErrUnavailable.
func (f *Fabric) NewEngine(cfg Config) (*Engine, error) {
	if err := transfer.CheckName(cfg.Name); err != nil {
		return nil, fmt.Errorf("cudacopy: new engine: %w", err)
	}
	drv, err := f.lib.Open()
	if err != nil {
		return nil, fmt.Errorf("cudacopy: new engine %q: %w", cfg.Name, err)
	}
	cc, err := drv.Primary(cfg.Device)
	if err != nil {
		return nil, fmt.Errorf("cudacopy: new engine %q: %w", cfg.Name, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, dup := f.engines[cfg.Name]; dup {
		_ = cc.Release()
		return nil, fmt.Errorf("cudacopy: new engine %q: name already in use on this fabric", cfg.Name)
	}
	f.nextInc++
	e := &Engine{fab: f, name: cfg.Name, inc: f.nextInc, cfg: cfg, cc: cc, owned: map[uint64]bool{},
		peers: map[string]*Engine{}, fenced: map[string]bool{}, out: map[*writeOp]struct{}{}, in: map[*writeOp]struct{}{},
		exports: map[uint64]export{}, remotes: map[string]*remote{}, opened: map[cuda.IPCHandle]*opened{}}
	if cfg.IPC {
		if !drv.HasIPC() {
			_ = cc.Release()
			return nil, fmt.Errorf("cudacopy: new engine %q: ipc: %w", cfg.Name, cuda.ErrNoIPC)
		}
		e.host = bootID()
	}
	if cfg.Batch && drv.HasBatchCopy() {
		if e.batch, err = cc.NewBatchCopy(BatchMax); err != nil {
			_ = cc.Release()
			return nil, fmt.Errorf("cudacopy: new engine %q: %w", cfg.Name, err)
		}
	}
	f.engines[cfg.Name] = e
	return e, nil
}

// Name returns the engine's name.
func (e *Engine) Name() string { return e.name }

// Context returns the engine's CUDA context.
func (e *Engine) Context() *cuda.Context { return e.cc }

// MemoryKinds reports CUDA and host memory (host memory is page-locked on
// registration).
func (e *Engine) MemoryKinds() []transfer.MemKind {
	return []transfer.MemKind{transfer.CUDA, transfer.Host}
}

// Batched reports whether multi-op writes go through cuMemcpyBatchAsync.
func (e *Engine) Batched() bool { return e.batch != nil }

// RegisterMemory makes d a write source and destination. CUDA memory must
// be of a device this engine's device reaches; host memory is page-locked
// for the device unless it already is.
func (e *Engine) RegisterMemory(d transfer.Desc) error {
	if d.Kind == transfer.CUDA {
		if int(d.Device) != e.cc.Device() {
			return fmt.Errorf("cudacopy %s: register %v: memory of device %d, engine on device %d: %w", e.name, d, d.Device, e.cc.Device(), transfer.ErrUnsupported)
		}
		if t, err := e.cc.PointerMemoryType(d.Addr); err != nil || t != cuda.MemoryTypeDevice {
			return fmt.Errorf("cudacopy %s: register %v: not device memory the driver knows (%v): %w", e.name, d, err, transfer.ErrUnsupported)
		}
	}
	e.fab.mu.Lock()
	defer e.fab.mu.Unlock()
	if e.closed {
		return fmt.Errorf("cudacopy %s: register %v: %w", e.name, d, transfer.ErrClosed)
	}
	if slices.Contains(e.reg.Ranges(), d) {
		return nil
	}
	pinned := false
	if d.Kind == transfer.Host {
		if _, err := e.cc.HostDevicePointer(uintptr(d.Addr)); err != nil {
			if _, err := e.cc.HostRegister(uintptr(d.Addr), d.Len); err != nil {
				return fmt.Errorf("cudacopy %s: register %v: page-lock: %w", e.name, d, err)
			}
			pinned = true
		}
	}
	if e.cfg.IPC && d.Kind == transfer.CUDA {
		if err := e.exportLocked(d); err != nil {
			return fmt.Errorf("cudacopy %s: register %v: %w", e.name, d, err)
		}
	}
	if err := e.reg.Add(d); err != nil {
		delete(e.exports, d.Addr)
		if pinned {
			_ = e.cc.HostUnregister(uintptr(d.Addr))
		}
		return fmt.Errorf("cudacopy %s: register: %w", e.name, err)
	}
	if pinned {
		e.owned[d.Addr] = true
	}
	return nil
}

// DeregisterMemory removes exactly d; ErrInUse while a write in flight
// reads or writes it.
func (e *Engine) DeregisterMemory(d transfer.Desc) error {
	e.fab.mu.Lock()
	defer e.fab.mu.Unlock()
	if e.closed {
		return fmt.Errorf("cudacopy %s: deregister %v: %w", e.name, d, transfer.ErrClosed)
	}
	if err := writeset.InUse(d, e.out, e.in); err != nil {
		return fmt.Errorf("cudacopy %s: deregister %v: %w", e.name, d, err)
	}
	if err := e.reg.Remove(d); err != nil {
		return fmt.Errorf("cudacopy %s: %w", e.name, err)
	}
	delete(e.exports, d.Addr)
	if e.owned[d.Addr] {
		delete(e.owned, d.Addr)
		if err := e.cc.HostUnregister(uintptr(d.Addr)); err != nil {
			return fmt.Errorf("cudacopy %s: deregister %v: %w", e.name, d, err)
		}
	}
	return nil
}

// Metadata layout, little-endian: magic "BCMD", version 1, fabric id (8),
// incarnation (8), name length (2), name.
const (
	mdMagic   = "BCMD"
	mdVersion = 1
	mdFixed   = 4 + 1 + 8 + 8 + 2
)

// Metadata identifies this engine on its fabric.
func (e *Engine) Metadata() ([]byte, error) {
	e.fab.mu.Lock()
	defer e.fab.mu.Unlock()
	if e.closed {
		return nil, fmt.Errorf("cudacopy %s: metadata: %w", e.name, transfer.ErrClosed)
	}
	if e.cfg.IPC {
		return e.ipcMetadataLocked(), nil
	}
	return encodeMetadata(e.fab.id, e.inc, e.name), nil
}

func encodeMetadata(fabric, inc uint64, name string) []byte {
	b := append([]byte(mdMagic), mdVersion)
	b = binary.LittleEndian.AppendUint64(b, fabric)
	b = binary.LittleEndian.AppendUint64(b, inc)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(name)))
	return append(b, name...)
}

// decodeMetadata parses Metadata (version 1, or 2 with IPC exports);
// every failure wraps ErrBadMetadata.
func decodeMetadata(b []byte) (md metadata, err error) {
	if len(b) < mdFixed {
		return md, fmt.Errorf("%d bytes, want at least %d: %w", len(b), mdFixed, transfer.ErrBadMetadata)
	}
	if string(b[:4]) != mdMagic {
		return md, fmt.Errorf("bad magic %q: %w", b[:4], transfer.ErrBadMetadata)
	}
	if b[4] != mdVersion && b[4] != mdVersionIPC {
		return md, fmt.Errorf("version %d, want %d or %d: %w", b[4], mdVersion, mdVersionIPC, transfer.ErrBadMetadata)
	}
	md.fabric = binary.LittleEndian.Uint64(b[5:])
	md.inc = binary.LittleEndian.Uint64(b[13:])
	n := int(binary.LittleEndian.Uint16(b[21:]))
	switch {
	case b[4] == mdVersion && len(b) != mdFixed+n, len(b) < mdFixed+n:
		return metadata{}, fmt.Errorf("name of %d bytes in %d bytes of metadata: %w", n, len(b), transfer.ErrBadMetadata)
	}
	md.name = string(b[mdFixed : mdFixed+n])
	if err := transfer.CheckName(md.name); err != nil {
		return metadata{}, fmt.Errorf("%v: %w", err, transfer.ErrBadMetadata)
	}
	if b[4] == mdVersionIPC {
		if err := decodeIPC(&md, b[mdFixed+n:]); err != nil {
			return metadata{}, err
		}
	}
	return md, nil
}

// LoadPeer decodes a peer's Metadata. Errors wrap ErrBadMetadata (bad
// bytes or another fabric), ErrUnknownPeer (no such open engine) or
// ErrPeerLost (a closed incarnation).
func (e *Engine) LoadPeer(md []byte) (string, error) {
	m, err := decodeMetadata(md)
	if err != nil {
		return "", fmt.Errorf("cudacopy %s: load peer: %w", e.name, err)
	}
	inc, name := m.inc, m.name
	if m.fabric != e.fab.id {
		if e.cfg.IPC {
			return e.loadRemote(m)
		}
		return "", fmt.Errorf("cudacopy %s: load peer %q: metadata from another fabric (another process: set engine.options ipc true on both): %w", e.name, name, transfer.ErrBadMetadata)
	}
	e.fab.mu.Lock()
	defer e.fab.mu.Unlock()
	if e.closed {
		return "", fmt.Errorf("cudacopy %s: load peer %q: %w", e.name, name, transfer.ErrClosed)
	}
	t, ok := e.fab.engines[name]
	switch {
	case !ok:
		return "", fmt.Errorf("cudacopy %s: load peer %q: no such engine on this fabric: %w", e.name, name, transfer.ErrUnknownPeer)
	case t.inc != inc:
		return "", fmt.Errorf("cudacopy %s: load peer %q: metadata of a closed incarnation: %w", e.name, name, transfer.ErrPeerLost)
	}
	if t.cc.Device() != e.cc.Device() {
		ok, err := e.cc.CanAccessPeer(t.cc)
		if err != nil || !ok {
			return "", fmt.Errorf("cudacopy %s: load peer %q: device %d cannot reach device %d (%v): %w", e.name, name, e.cc.Device(), t.cc.Device(), err, transfer.ErrUnsupported)
		}
		if err := e.cc.EnablePeerAccess(t.cc); err != nil {
			return "", fmt.Errorf("cudacopy %s: load peer %q: %w", e.name, name, err)
		}
	}
	e.peers[name] = t
	delete(e.fenced, name)
	if r := e.remotes[name]; r != nil {
		delete(e.remotes, name)
		_ = e.releaseLocked(r)
	}
	return name, nil
}

// ForgetPeer drops a peer on both sides of the data path: this engine's
// writes to it and its writes into this engine fail with ErrPeerLost once
// their copies have stopped (a GPU copy cannot be cancelled; ForgetPeer
// waits for it, bounded), and the peer's later posts into this engine are
// refused until it is loaded again. A peer that was never loaded is
// fenced all the same and reported as ErrUnknownPeer.
func (e *Engine) ForgetPeer(name string) error {
	e.fab.mu.Lock()
	if e.closed {
		e.fab.mu.Unlock()
		return fmt.Errorf("cudacopy %s: forget peer %q: %w", e.name, name, transfer.ErrClosed)
	}
	_, known := e.peers[name]
	delete(e.peers, name)
	rem := e.remotes[name]
	delete(e.remotes, name)
	known = known || rem != nil
	e.fenced[name] = true
	var pending []*writeOp
	for o := range e.out {
		if o.peer == name {
			o.failLocked(fmt.Errorf("cudacopy %s: write to %q: peer forgotten: %w", e.name, name, transfer.ErrPeerLost))
			pending = append(pending, o)
		}
	}
	for o := range e.in {
		if o.src.name == name {
			o.failLocked(fmt.Errorf("cudacopy %s: write to %q: the target forgot this engine: %w", o.src.name, e.name, transfer.ErrPeerLost))
			pending = append(pending, o)
		}
	}
	e.fab.mu.Unlock()
	if err := waitOps(pending); err != nil {
		// A copy may still run into the peer's mappings: they stay open.
		return fmt.Errorf("cudacopy %s: forget peer %q: %w", e.name, name, err)
	}
	if rem != nil {
		e.fab.mu.Lock()
		err := e.releaseLocked(rem)
		e.fab.mu.Unlock()
		if err != nil {
			return fmt.Errorf("cudacopy %s: forget peer %q: close its IPC mappings: %w", e.name, name, err)
		}
	}
	if !known {
		return fmt.Errorf("cudacopy %s: forget peer %q: %w", e.name, name, transfer.ErrUnknownPeer)
	}
	return nil
}

// waitOps polls ops until each is terminal, bounded by waitBound.
func waitOps(ops []*writeOp) error {
	deadline := time.Now().Add(waitBound)
	for _, o := range ops {
		for {
			if s, _ := o.Poll(); s.Terminal() {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("cudacopy: a copy still runs after %v: %w", waitBound, transfer.ErrNotQuiescent)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	return nil
}

// PostWrite checks every write and queues the copies on one stream. Each
// source must lie in memory registered here and each destination in
// memory the peer registered, else ErrNotRegistered or ErrOutOfBounds (and
// ErrUnsupported for a memory kind the engine cannot touch) and nothing is
// queued. The copy follows the registered memory's kind, whatever kind
// the descriptor names. More than MaxStreams operations in flight is ErrBusy.
func (e *Engine) PostWrite(peerName string, ops []transfer.WriteOp) (transfer.Op, error) {
	ctx := func(format string, args ...any) string {
		return fmt.Sprintf("cudacopy %s: post write to %q: ", e.name, peerName) + fmt.Sprintf(format, args...)
	}
	if err := writeset.CheckPost(e, "cudacopy", ops); err != nil {
		return nil, fmt.Errorf("%s%w", ctx(""), err)
	}
	own := slices.Clone(ops)
	f := e.fab
	f.mu.Lock()
	defer f.mu.Unlock()
	if e.closed {
		return nil, fmt.Errorf("%s: %w", ctx("engine"), transfer.ErrClosed)
	}
	if r := e.remotes[peerName]; r != nil {
		op, err := e.postRemoteLocked(r, own)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ctx("peer in another process"), err)
		}
		return op, nil
	}
	t, ok := e.peers[peerName]
	if !ok {
		return nil, fmt.Errorf("%s: %w", ctx("peer not loaded"), transfer.ErrUnknownPeer)
	}
	if t.closed {
		return nil, fmt.Errorf("%s: %w", ctx("peer closed"), transfer.ErrPeerLost)
	}
	if t.fenced[e.name] {
		return nil, fmt.Errorf("%s: %w", ctx("the peer forgot this engine (it must load it again)"), transfer.ErrPeerLost)
	}
	// The registrations, not the descriptors' kinds, say what memory an
	// address is: both engines live in this process, so the peer's
	// registry is authoritative (the pipeline labels its writes with the
	// arena kind a GRANT carries, but any other caller may label a
	// descriptor wrongly). Every range found is one this engine
	// handles, on a device it reaches.
	for i := range own {
		w := &own[i]
		sd, err := e.reg.FindAny(w.Src.Addr, w.Src.Len)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ctx("write %d source", i), err)
		}
		dd, err := t.reg.FindAny(w.Dst.Addr, w.Dst.Len)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ctx("write %d destination not registered by the peer", i), err)
		}
		w.Src.Kind, w.Src.Device = sd.Kind, sd.Device
		w.Dst.Kind, w.Dst.Device = dd.Kind, dd.Device
	}
	s, err := e.slotLocked()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ctx("streams"), err)
	}
	o := &writeOp{src: e, dst: t, peer: peerName, ops: own, slot: s, abortC: make(chan struct{}), held: make(chan struct{})}
	if h := e.cfg.Hold; h != nil {
		e.out[o] = struct{}{}
		t.in[o] = struct{}{}
		go e.release(o, h)
		return o, nil
	}
	if err := e.queue(s, t, own); err != nil {
		// Whatever was queued before the failure must finish before the
		// slot is reused or the error returned.
		_ = s.stream.Synchronize()
		e.streams = append(e.streams, s)
		return nil, fmt.Errorf("%s: %w", ctx("queue"), err)
	}
	close(o.held)
	e.out[o] = struct{}{}
	t.in[o] = struct{}{}
	return o, nil
}

// release queues a held operation's copies once Hold returns, unless the
// operation was failed meanwhile (then nothing moves).
func (e *Engine) release(o *writeOp, hold func(abort <-chan struct{})) {
	hold(o.abortC)
	e.fab.mu.Lock()
	defer e.fab.mu.Unlock()
	defer close(o.held)
	if o.abort != nil {
		o.cancelled = true
		return
	}
	if err := e.queue(o.slot, o.dst, o.ops); err != nil {
		_ = o.slot.stream.Synchronize()
		o.abort = fmt.Errorf("cudacopy %s: write to %q: queue: %w", e.name, o.peer, err)
		o.cancelled = true
	}
}

func (e *Engine) slotLocked() (*slot, error) {
	if n := len(e.streams); n > 0 {
		s := e.streams[n-1]
		e.streams = e.streams[:n-1]
		return s, nil
	}
	if e.nslots >= MaxStreams {
		return nil, fmt.Errorf("%d writes in flight: %w", MaxStreams, transfer.ErrBusy)
	}
	st, err := e.cc.NewStream()
	if err != nil {
		return nil, err
	}
	ev, err := e.cc.NewEvent(false)
	if err != nil {
		_ = st.Destroy()
		return nil, err
	}
	e.nslots++
	return &slot{stream: st, event: ev}, nil
}

// queue puts the copies of ops on s's stream and records its event. A nil
// t is a peer of another process: ops are already translated to its
// mappings here.
func (e *Engine) queue(s *slot, t *Engine, ops []transfer.WriteOp) error {
	peer := t != nil && t.cc.Device() != e.cc.Device()
	if e.batch != nil && len(ops) > 1 && !peer {
		for lo := 0; lo < len(ops); lo += BatchMax {
			hi := min(lo+BatchMax, len(ops))
			for i, w := range ops[lo:hi] {
				e.batch.Set(i, cuda.DevicePtr(w.Dst.Addr), cuda.DevicePtr(w.Src.Addr), w.Src.Len)
			}
			if err := e.batch.Post(s.stream, hi-lo); err != nil {
				return err
			}
		}
		return s.event.Record(s.stream)
	}
	for _, w := range ops {
		dst, src := cuda.DevicePtr(w.Dst.Addr), cuda.DevicePtr(w.Src.Addr)
		var err error
		switch {
		case peer && w.Src.Kind == transfer.CUDA && w.Dst.Kind == transfer.CUDA:
			err = s.stream.CopyPeer(dst, t.cc, src, e.cc, w.Src.Len)
		case w.Src.Kind == transfer.CUDA && w.Dst.Kind == transfer.CUDA:
			err = s.stream.CopyDtoD(dst, src, w.Src.Len)
		default:
			err = s.stream.Copy(dst, src, w.Src.Len)
		}
		if err != nil {
			return err
		}
	}
	return s.event.Record(s.stream)
}

// InFlight returns the number of operations posted and not yet seen
// terminal.
func (e *Engine) InFlight() int {
	e.fab.mu.Lock()
	defer e.fab.mu.Unlock()
	return len(e.out)
}

// Close fails this engine's writes in flight (ErrClosed) and writes into it
// (ErrPeerLost) once their copies have stopped, and frees its streams. It
// is idempotent.
func (e *Engine) Close() error {
	f := e.fab
	f.mu.Lock()
	if e.closed {
		f.mu.Unlock()
		return nil
	}
	e.closed = true
	if f.engines[e.name] == e {
		delete(f.engines, e.name)
	}
	var pending []*writeOp
	for o := range e.out {
		o.failLocked(fmt.Errorf("cudacopy %s: write to %q: engine closed: %w", e.name, o.peer, transfer.ErrClosed))
		pending = append(pending, o)
	}
	for o := range e.in {
		o.failLocked(fmt.Errorf("cudacopy %s: write to %q: peer closed: %w", o.src.name, o.peer, transfer.ErrPeerLost))
		pending = append(pending, o)
	}
	clear(e.peers)
	f.mu.Unlock()
	err := waitOps(pending)
	f.mu.Lock()
	idle := e.streams
	e.streams = nil
	owned := e.owned
	e.owned = map[uint64]bool{}
	var errs []error
	if err == nil { // else a copy may still run into a mapping: it stays open
		for _, r := range e.remotes {
			if rerr := e.releaseLocked(r); rerr != nil {
				errs = append(errs, fmt.Errorf("cudacopy %s: close: IPC mappings of %q: %w", e.name, r.name, rerr))
			}
		}
	}
	clear(e.remotes)
	f.mu.Unlock()
	if err != nil {
		errs = append(errs, err)
	} else {
		for _, s := range idle {
			errs = append(errs, s.event.Destroy(), s.stream.Destroy())
		}
		for a := range owned {
			errs = append(errs, e.cc.HostUnregister(uintptr(a)))
		}
		if e.batch != nil {
			errs = append(errs, e.batch.Free())
		}
		errs = append(errs, e.cc.Release())
	}
	return errors.Join(errs...)
}

// writeOp is one posted batch of writes.
type writeOp struct {
	src, dst *Engine
	peer     string
	ops      []transfer.WriteOp
	slot     *slot
	abort    error // guarded by fab.mu: the failure to report once the copies stopped

	abortC    chan struct{} // closed with the first abort (ends a Hold)
	held      chan struct{} // closed once the copies are queued or cancelled
	cancelled bool          // guarded by fab.mu: failed while held, nothing queued

	mu       sync.Mutex
	state    transfer.Status
	err      error
	released bool
}

// Writes, From and To make writeOp a writeset.Write.
func (o *writeOp) Writes() []transfer.WriteOp { return o.ops }
func (o *writeOp) From() string               { return o.src.name }
func (o *writeOp) To() string                 { return o.peer }

// failLocked records the failure the operation reports once its copies
// have stopped and ends a Hold. Caller holds fab.mu.
func (o *writeOp) failLocked(err error) {
	if o.abort == nil {
		o.abort = err
		close(o.abortC)
	}
}

// Poll queries the operation's event without blocking.
func (o *writeOp) Poll() (transfer.Status, error) {
	o.mu.Lock()
	if o.state != transfer.Pending {
		defer o.mu.Unlock()
		return o.state, o.err
	}
	select {
	case <-o.held:
	default:
		o.mu.Unlock()
		return transfer.Pending, nil // held: nothing queued yet
	}
	f := o.src.fab
	f.mu.Lock()
	cancelled := o.cancelled
	f.mu.Unlock()
	done, qerr := true, error(nil)
	if !cancelled {
		done, qerr = o.slot.event.Query()
	}
	if !done && qerr == nil {
		o.mu.Unlock()
		return transfer.Pending, nil
	}
	f.mu.Lock()
	abort := o.abort
	delete(o.src.out, o)
	if o.dst != nil {
		delete(o.dst.in, o)
	}
	f.mu.Unlock()
	switch {
	case qerr != nil:
		o.state, o.err = transfer.Failed, fmt.Errorf("cudacopy %s: write to %q: %w: %w", o.src.name, o.peer, qerr, transfer.ErrDeviceFault)
	case abort != nil:
		o.state, o.err = transfer.Failed, abort
	default:
		o.state = transfer.Done
	}
	s, err := o.state, o.err
	o.mu.Unlock()
	if cb := o.src.cfg.OnComplete; cb != nil {
		cb()
	}
	return s, err
}

// Release returns the operation's stream once it is terminal.
func (o *writeOp) Release() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.state == transfer.Pending {
		return fmt.Errorf("cudacopy %s: release write to %q: %w", o.src.name, o.peer, transfer.ErrInUse)
	}
	if o.released {
		return fmt.Errorf("cudacopy %s: release write to %q: already released: %w", o.src.name, o.peer, transfer.ErrClosed)
	}
	o.released = true
	if errors.Is(o.err, transfer.ErrDeviceFault) {
		return nil // never reuse a stream of a faulted device
	}
	f := o.src.fab
	f.mu.Lock()
	defer f.mu.Unlock()
	if o.src.closed {
		_ = o.slot.event.Destroy()
		_ = o.slot.stream.Destroy()
		return nil
	}
	o.src.streams = append(o.src.streams, o.slot)
	return nil
}
