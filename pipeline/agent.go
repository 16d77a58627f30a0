package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/pipeline/credit"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/stages/write"
	"github.com/bouncekv/bounce/transfer"
)

// Config holds the runtime knobs of an agent (the bounce section of the
// configuration). Zero fields take the defaults of DefaultConfig.
type Config struct {
	// Enabled turns the bounce path on; off means every transfer is direct.
	Enabled bool
	// ArenaSize is the size of the shared region arena.
	ArenaSize uint64
	// Granularity is the buddy allocator's minimum block.
	Granularity uint64
	// MaxChunk caps one chunk (one bulk write); it must match the peer's.
	MaxChunk uint64
	// MinChunk ramps a request's chunk sizes up from it and tapers them
	// off toward the end (plan.Options.MinChunk); 0 gives every chunk
	// MaxChunk.
	MinChunk uint64
	// MaxInflight is W, the per-flow cap on regions in flight.
	MaxInflight int
	// ScatterWorkers is the number of scatter worker goroutines.
	ScatterWorkers int
	// MinDescriptors and MaxAvgDescriptor are the routing gates.
	MinDescriptors   int
	MaxAvgDescriptor uint64
	// RequestTimeout fails a request that made no progress for this long.
	RequestTimeout time.Duration
	// QuiesceTimeout bounds how long a failing request waits for its ops to
	// stop before it is published retired but not quiescent.
	QuiesceTimeout time.Duration
	// FlowExpiry is how long a receiver keeps a flow that holds granted
	// regions (not being scattered) while its sender stays silent (no WANT,
	// DATA or cancel since the flow's latest grant) before it reclaims the
	// flow's regions; a sender that crashed mid-request would otherwise hold
	// them until ForgetPeer. A flow still waiting for a grant, or whose
	// regions are all being scattered, waits for the receiver and never
	// expires. Zero means 4 × RequestTimeout: by then a live sender has
	// failed the request and cancelled it itself.
	FlowExpiry time.Duration
	// UnreachedGrace is how long a receiver keeps a flow whose granted
	// regions wait for a sender its control channel has been without a
	// completed handshake with for as long (zmq: Channel.PeerDownFor):
	// such a sender never got the grants since, and its loss report may be
	// missing (a dial nobody answered, a handshake it refused, a kill as
	// the connection came up), which left the flow to FlowExpiry. The
	// sender is then handled as lost. Zero or less means 15 s.
	UnreachedGrace time.Duration
	// Quarantine is how long a region reclaimed from a flow whose sender
	// may still write it stays out of use before it can be granted again:
	// the regions of an expired flow, and those of a forgotten peer unless
	// the engine fences forgotten peers (transfer.Fencer). A sender that was
	// only slow (a partition, a stalled NIC) may still land a write there,
	// which must not reach another flow's region. Zero (or negative) means
	// 1 × RequestTimeout, as in the reference design: a live sender fails
	// a request that made no progress for that long. It cannot be turned
	// off; a cancel from the sender itself frees its regions at once (it
	// cancels only once its writes are over).
	Quarantine time.Duration
	// EagerGather starts gathers before the GRANT arrives (bounded by W and
	// half the arena).
	EagerGather bool
	// DisableMerging sends one scatter run per descriptor (debugging only).
	DisableMerging bool
	// Route is the route of a request that asks for RouteAuto: RouteAuto
	// (bounce when eligible, else direct, each fallback warned once per
	// peer and counted), RouteBounce (required: a request that cannot take
	// it is refused with the reason) or RouteDirect.
	Route Route
	// MaxFlowsPerPeer caps the flows (requests) one peer may have open on
	// this receiver; a WANT opening one more is refused with a NACK.
	MaxFlowsPerPeer int
	// WantRate and WantBurst bound the WANTs (cancels included) one peer
	// may send per second; the excess is dropped and counted.
	WantRate  float64
	WantBurst int
	// MaxControlPeers caps the reverse control paths the receiver keeps
	// open; the least recently used idle one is closed to make room.
	MaxControlPeers int
	// MaxArenaShare is the fraction of the arena one peer's flows may hold
	// even when no other peer waits (0 < share <= 1); while others wait a
	// peer holds at most an equal share (credit.Config.PeerShare).
	MaxArenaShare float64
	// CostModel lets route auto decide each eligible request by the
	// engine-aware cost model (predicted time on both paths; see package
	// costmodel) instead of by the gates alone.
	CostModel bool
	// PullRead says whether pulls into host memory read the holder's
	// staged regions where both engines can, instead of the holder
	// writing them (bounce.pull_read; DefaultPullRead).
	PullRead PullRead
}

// DefaultConfig returns the defaults: the reference design's, except an
// 8 MiB chunk and route auto's cost model on (docs/BENCHMARKS.md says why).
func DefaultConfig() Config {
	return Config{
		Enabled:          true,
		ArenaSize:        256 << 20,
		Granularity:      1 << 20,
		MaxChunk:         8 << 20,
		MaxInflight:      8,
		ScatterWorkers:   4,
		MinDescriptors:   1024,
		MaxAvgDescriptor: 16 << 10,
		RequestTimeout:   30 * time.Second,
		QuiesceTimeout:   5 * time.Second,
		EagerGather:      true,
		MaxFlowsPerPeer:  DefaultMaxFlowsPerPeer,
		WantRate:         DefaultWantRate,
		WantBurst:        DefaultWantBurst,
		MaxControlPeers:  DefaultMaxControlPeers,
		MaxArenaShare:    DefaultMaxArenaShare,
		CostModel:        true,
		PullRead:         DefaultPullRead,
	}
}

// Per-peer limit defaults (docs/SECURITY.md). A legitimate sender opens one
// flow per concurrent request and sends a WANT per request plus one cancel
// per failed request.
const (
	DefaultMaxFlowsPerPeer = 256
	DefaultWantRate        = 5000
	DefaultWantBurst       = 1024
	DefaultMaxControlPeers = 1024
	DefaultMaxArenaShare   = 0.5
)

// DefaultPullRead is bounce.pull_read's default: auto, reading where both
// engines can. BenchmarkPullReadVsWrite (tcp, host memory, push and both
// pulls side by side) measured the read at least as fast as the holder's
// write on a loaded 2-core box — read/write median 1.2 over 8 runs of 4096
// and 16384 × 4 KiB, from 0.87 to 1.71 (indicative only: the box is
// shared): the holder no longer spends its CPU writing, the puller lands
// the bytes itself. docs/bench/device/issue29/run.sh (step 7) measures it
// on the 16-CPU GPU host; if it measures the write faster there, this is
// the one place to change.
const DefaultPullRead = PullReadAuto

// EffectiveQuarantine returns the quarantine c resolves to (Quarantine,
// or its default): how long the agent trusts a late write to have landed
// by. An engine that fences forgotten peers holds its fence that long.
func (c Config) EffectiveQuarantine() time.Duration {
	c.fill()
	return c.Quarantine
}

func (c *Config) fill() {
	d := DefaultConfig()
	c.ArenaSize = cmp.Or(c.ArenaSize, d.ArenaSize)
	c.Granularity = cmp.Or(c.Granularity, d.Granularity)
	c.MaxChunk = cmp.Or(c.MaxChunk, d.MaxChunk)
	c.MaxInflight = cmp.Or(c.MaxInflight, d.MaxInflight)
	c.ScatterWorkers = cmp.Or(c.ScatterWorkers, d.ScatterWorkers)
	c.MaxAvgDescriptor = cmp.Or(c.MaxAvgDescriptor, d.MaxAvgDescriptor)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, d.RequestTimeout)
	c.QuiesceTimeout = cmp.Or(c.QuiesceTimeout, d.QuiesceTimeout)
	c.FlowExpiry = cmp.Or(c.FlowExpiry, 4*c.RequestTimeout)
	if c.UnreachedGrace <= 0 {
		c.UnreachedGrace = defaultUnreachedGrace
	}
	if c.Quarantine <= 0 {
		c.Quarantine = c.RequestTimeout
	}
	c.MaxFlowsPerPeer = cmp.Or(c.MaxFlowsPerPeer, d.MaxFlowsPerPeer)
	c.WantRate = cmp.Or(c.WantRate, d.WantRate)
	c.WantBurst = cmp.Or(c.WantBurst, d.WantBurst)
	c.MaxControlPeers = cmp.Or(c.MaxControlPeers, d.MaxControlPeers)
	if c.MaxArenaShare <= 0 || c.MaxArenaShare > 1 {
		c.MaxArenaShare = d.MaxArenaShare
	}
	c.PullRead = cmp.Or(c.PullRead, d.PullRead)
}

// Settings are the agent's injected dependencies. The agent does not own
// them: the caller closes the engine, control channel and stages after
// Shutdown.
type Settings struct {
	// Name is this agent's name; it must equal Engine.Name().
	Name string
	// Engine moves the bytes (bulk writes and the direct path).
	Engine transfer.Engine
	// Control carries WANT/GRANT/DATA/ACK. Nil disables the bounce path.
	Control transfer.ControlChannel
	// Gatherer, Scatterer and Writer are the pipeline stages. Writer nil
	// means a bulk write on Engine.
	Gatherer  transfer.Gatherer
	Scatterer transfer.Scatterer
	Writer    transfer.Writer
	// Registry is the host memory the stages validate against. The agent
	// adds its arena and every RegisterMemory to it.
	Registry *mem.Registry
	// NewArena, if set, allocates the bounce arena (device memory or
	// pinned host memory, say); nil maps host memory (mem.NewArena). The
	// gatherer must write the arena's memory kind and the engine read it,
	// else the bounce path is off.
	NewArena func(name string, size uint64) (Arena, error)
	// RequireBounce makes New fail, wrapping ErrBounceUnavailable and
	// naming the reason, when bounce is enabled but its path cannot be set
	// up (an arena that cannot be mapped, say), instead of serving every
	// transfer on the direct path.
	RequireBounce bool
	// Wake, if set, is signalled by stages or engines when an op completes,
	// so the reactor reacts without polling delay.
	Wake <-chan struct{}
	// Logger receives warnings (dropped messages, rejected peers); nil
	// discards them.
	Logger *slog.Logger
	// TracerProvider, MeterProvider and Propagator are the agent's
	// OpenTelemetry dependencies; nil means the otel globals. A no-op
	// TracerProvider (trace/noop) turns every span off at no cost.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	Propagator     propagation.TextMapPropagator
	// Kinds names the components above for span attributes.
	Kinds Kinds
	// Clock is the reactor's time source (timeouts, flow expiry,
	// quarantine); nil means real time. A deterministic simulation sets
	// its own.
	Clock Clock
	// Received, if set, receives a completion event for every request a
	// peer sent to this agent (see Received). The reactor never blocks on
	// it: size its buffer for the bursts you expect; an event that finds it
	// full is dropped and counted (Stats.DroppedEvents). Nil discards the
	// events (they are still counted in Stats.Events).
	Received chan<- Received
	// Peers is the admitted-peer set shared with the engine and the control
	// channel (package security). LoadPeer introduces each loaded peer's key
	// there, and the reactor drops control messages from names it does not
	// admit. Nil means security.mode off: every peer is admitted.
	Peers *security.Peers
}

// Arena is the memory of a bounce arena: one range, freed by Close once
// nothing touches it.
type Arena interface {
	Desc() transfer.Desc
	Close() error
}

// Clock tells the reactor the time.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
}

// realClock is the wall clock.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Agent is one bounce endpoint: sender and receiver at once.
type Agent struct {
	name string
	cfg  Config
	set  Settings
	log  *slog.Logger

	arena  Arena
	arenaD transfer.Desc
	// ctrlMax is the control channel's message limit (0 = none stated):
	// chunks are planned so that their DATA fits it and GRANTs are split.
	ctrlMax int
	// router is route auto's cost model; nil when bounce is off.
	router *router
	// inc is this agent's incarnation, random per agent: its WANTs carry
	// it, so a receiver that fenced a lost sender admits its restart under
	// the same name at once and keeps dropping the old one's WANTs.
	inc      uint64
	bounceOn bool   // bounce path usable locally
	noBounce string // why not, when !bounceOn
	capacity uint64

	peersMu sync.RWMutex
	peers   map[string]*peerInfo
	// peerOps holds the names a LoadPeer or a lost sender's fence is
	// working on (under peersMu), each with a channel closed when it ends:
	// the two own the peer's engine state, so they never overlap.
	peerOps map[string]chan struct{}

	nextID atomic.Uint64

	cmdMu  sync.Mutex
	cmds   []func(*reactor)
	kickCh chan struct{}

	stopOnce sync.Once
	stopped  chan struct{} // closed when the reactor has exited
	closing  atomic.Bool

	stats counters
	obs   *obs
	r     *reactor
	wg    sync.WaitGroup
	// guard authorizes incoming writes; nil unless authentication is on and
	// the engine asks a guard (transfer.WriteGuarded).
	guard *writeGuard
	// rguard authorizes the pullers' reads of staged regions; canRead says
	// pulls read (both set when bounce is on, Config.PullRead is not off
	// and the engine reads and serves reads: transfer.CanRead).
	rguard  *readGuard
	canRead bool
	// dests is the memory a DATA may scatter into (datacheck.go).
	dests scatterDests
	// checksOff skips the per-run DATA check (back to the grant-bounds
	// check alone) and the revocation fence: benchmarks set it to measure
	// what the checks cost; nothing else does.
	checksOff atomic.Bool

	// stageOnly holds the registrations the engine cannot touch (device
	// memory over a host engine): the stages reach them, the bounce route
	// alone carries them.
	stageMu   sync.Mutex
	stageOnly map[transfer.Desc]bool

	// poolMu guards the registered block pools (who may write each
	// region's memory is the dests table's, read at RegisterPool).
	poolMu sync.Mutex
	pools  map[string]*localPool
	// deregisterChecked, when set (by tests), runs in DeregisterMemory
	// between its pool check and the registry's removal.
	deregisterChecked func()
}

type peerInfo struct {
	name     string
	bounce   bool
	reason   string // why not bounce
	endpoint string // control endpoint from the peer's descriptor, "" if none
	// ctrl is set when the control channel reaches the peer (always when
	// bounce is): direct requests then tell it when they end (DONE).
	ctrl bool
	// warned holds the kinds of fallback already warned about.
	warnMu sync.Mutex
	warned map[string]bool
	// pools are the block pools the peer's descriptor advertises, by name.
	pools map[string]transfer.Pool
	// layouts are the KV layouts of those pools that advertise one.
	layouts map[string]*transfer.Layout
	// forgotten is set by ForgetPeer before it removes the peer anywhere,
	// so a request submitted to this incarnation of the peer that then
	// meets an unknown peer knows it was lost (ErrPeerLost).
	forgotten atomic.Bool
}

// lostErr reports err as a lost peer when the peer was forgotten and err is
// what the control channel or the engine say about a peer they no longer
// know: the request raced ForgetPeer.
func (pi *peerInfo) lostErr(err error) error {
	if err == nil || !pi.forgotten.Load() || errors.Is(err, transfer.ErrPeerLost) || !errors.Is(err, transfer.ErrUnknownPeer) {
		return err
	}
	return fmt.Errorf("%w: peer %q was forgotten: %w", transfer.ErrPeerLost, pi.name, err)
}

// New builds and starts an agent. A bounce set-up failure (arena, scheduler,
// registration) never fails New, unless Settings.RequireBounce: the agent
// logs the reason and serves every transfer on the direct path.
func New(s Settings, cfg Config) (*Agent, error) {
	a, err := build(s, cfg)
	if err != nil {
		return nil, err
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.r.run()
	}()
	a.r.startHelpers(&a.wg)
	return a, nil
}

// build builds an agent without starting its goroutines (New starts them;
// a simulation steps the reactor itself).
func build(s Settings, cfg Config) (*Agent, error) {
	cfg.fill()
	if s.Engine == nil {
		return nil, errors.New("pipeline: settings: Engine is required")
	}
	if s.Name == "" {
		s.Name = s.Engine.Name()
	}
	if s.Name != s.Engine.Name() {
		return nil, fmt.Errorf("pipeline: settings: Name %q differs from the engine's name %q", s.Name, s.Engine.Name())
	}
	if s.Registry == nil {
		s.Registry = &mem.Registry{}
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	if s.Clock == nil {
		s.Clock = realClock{}
	}
	a := &Agent{
		inc:     rand.Uint64() | 1, // never zero (unknown)
		name:    s.Name,
		cfg:     cfg,
		set:     s,
		log:     s.Logger.With("agent", s.Name),
		peers:   make(map[string]*peerInfo),
		peerOps: make(map[string]chan struct{}),
		kickCh:  make(chan struct{}, 1),
		stopped: make(chan struct{}),
	}
	a.obs = newObs(a, s)
	a.dests.byPeer = s.Peers.Enabled()
	// The guard is in force before the arena is registered with the
	// engine: an engine that listens already (a plugin's, which holds no
	// keys) must never see the arena writable unguarded.
	//
	// An engine that authenticates with an authenticator lent to it (a
	// plugin's, which holds no keys) gets the agent's first, so the names
	// the guard checks are proven by keys, not claimed.
	if au, ok := s.Engine.(transfer.Authenticating); ok && s.Peers.Enabled() {
		au.SetAuthenticator(s.Peers.Authenticator())
	}
	if wg, ok := s.Engine.(transfer.WriteGuarded); ok && s.Peers.Enabled() {
		a.guard = newWriteGuard(&a.dests)
		if f, ok := s.Engine.(transfer.WriteFencer); ok {
			a.guard.fence = func(d transfer.Desc) {
				if !a.checksOff.Load() {
					f.FenceWrites(d)
				}
			}
		}
		wg.SetWriteGuard(a.guard.check)
	}
	var sched *credit.Scheduler
	if err := a.initBounce(&sched); err != nil {
		if s.RequireBounce && cfg.Enabled {
			return nil, fmt.Errorf("pipeline: %w: %w", ErrBounceUnavailable, err)
		}
		a.bounceOn, a.noBounce = false, err.Error()
		a.log.Warn("bounce disabled, serving every transfer on the direct path", "reason", err)
	}
	if a.guard != nil {
		a.guard.setArena(a.arenaD)
	}
	if rg, ok := s.Engine.(transfer.ReadGuarded); ok && a.bounceOn && a.cfg.PullRead != PullReadOff && transfer.CanRead(s.Engine) && a.arenaD.Kind == transfer.Host {
		a.rguard = newReadGuard(a.arenaD, rg.FenceReads, func(off uint64) { a.post(func(r *reactor) { r.readFenced(off) }) })
		rg.SetReadGuard(a.rguard.check)
		a.canRead = true
	}
	if a.bounceOn && cfg.CostModel {
		a.router = a.newRouter()
	}
	a.r = newReactor(a, sched)
	if pl, ok := s.Engine.(transfer.PeerLossReporter); ok && a.bounceOn {
		pl.SetPeerLost(func(peer string) { a.post(func(r *reactor) { r.peerGone(peer, "the engine lost every connection") }) })
	}
	// A control channel that notices a peer's connection drop (zmq: the
	// socket monitor) reports a dead peer as fast, even one that never
	// opened an engine connection.
	if pl, ok := s.Control.(transfer.PeerLossReporter); ok && a.bounceOn {
		pl.SetPeerLost(func(peer string) {
			a.post(func(r *reactor) { r.peerGone(peer, "the control channel lost its connection") })
		})
	}
	// A peer reported lost is up again once its connection is (a process
	// restarted at its endpoint): requests to it no longer fail as lost.
	if pu, ok := s.Control.(peerUpReporter); ok && a.bounceOn {
		pu.SetPeerUp(func(peer string) { a.post(func(r *reactor) { r.peerUp(peer) }) })
	}
	a.watchRefusals(s.Control)
	return a, nil
}

// defaultUnreachedGrace is Config.UnreachedGrace's default: past the zmq
// heartbeat timeout (3 s) and a CURVE handshake on a loaded machine, short
// of the default request timeout (30 s) and flow expiry (4 × that).
const defaultUnreachedGrace = 15 * time.Second

// pathDowner is a control channel that says how long its path to a peer
// has been without a completed handshake (zmq: since the DEALER was added
// or its connection dropped; 0 while up); known is false for a peer it
// has no path to.
type pathDowner interface {
	PeerDownFor(peer string) (d time.Duration, known bool)
}

// peerUpReporter is a control channel that says when a peer's connection
// is up (zmq: its handshake completed), the first time and after a loss it
// reported (transfer.PeerLossReporter).
type peerUpReporter interface {
	SetPeerUp(fn func(peer string))
}

func (a *Agent) initBounce(out **credit.Scheduler) error {
	switch {
	case !a.cfg.Enabled:
		return errors.New("bounce disabled by configuration")
	case a.set.Control == nil:
		return errors.New("no control channel")
	case a.set.Gatherer == nil || a.set.Scatterer == nil:
		return errors.New("no gather or scatter stage")
	case a.set.Control.LocalEndpoint() == "":
		return errors.New("control channel has no usable endpoint")
	}
	if l, ok := a.set.Control.(messageLimiter); ok && l.MaxMessageSize() > 0 {
		a.ctrlMax = l.MaxMessageSize()
		if need := minControlMessage(); a.ctrlMax < need {
			return fmt.Errorf("control channel %s carries messages of at most %d bytes; bounce needs %d", a.set.Control.Kind(), a.ctrlMax, need)
		}
	}
	usable := credit.UsableCapacity(a.cfg.ArenaSize, a.cfg.Granularity)
	sched, err := credit.New(credit.Config{Capacity: a.cfg.ArenaSize, Granularity: a.cfg.Granularity, MaxInflight: a.cfg.MaxInflight,
		PeerShare: true, PeerMax: uint64(a.cfg.MaxArenaShare * float64(usable))})
	if err != nil {
		return fmt.Errorf("credit scheduler: %w", err)
	}
	if a.cfg.MaxChunk > sched.Capacity() {
		a.log.Info("max chunk clamped to the arena's usable capacity", "max_chunk", a.cfg.MaxChunk, "capacity", sched.Capacity())
		a.cfg.MaxChunk = sched.Capacity()
	}
	newArena := a.set.NewArena
	if newArena == nil {
		newArena = func(name string, size uint64) (Arena, error) { return mem.NewArena(name, size) }
	}
	arena, err := newArena(a.name, sched.Capacity())
	if err != nil {
		return fmt.Errorf("arena: %w", err)
	}
	d := arena.Desc()
	for _, c := range []struct {
		x    any
		what string
	}{{a.set.Gatherer, "gather stage"}, {a.set.Scatterer, "scatter stage"}, {a.set.Engine, "engine"}} {
		if !transfer.Handles(c.x, d.Kind) {
			arena.Close()
			return fmt.Errorf("the %s cannot touch the %s arena %v", c.what, d.Kind, d)
		}
	}
	if err := a.set.Registry.Add(d); err != nil {
		arena.Close()
		return fmt.Errorf("register arena with the stages: %w", err)
	}
	if err := a.set.Engine.RegisterMemory(d); err != nil {
		_ = a.set.Registry.Remove(d)
		arena.Close()
		return fmt.Errorf("register arena with the engine: %w", err)
	}
	if a.set.Writer == nil {
		a.set.Writer = write.New(a.set.Engine)
	}
	a.arena, a.arenaD, a.capacity, a.bounceOn = arena, d, sched.Capacity(), true
	*out = sched
	return nil
}

// newRouter calibrates the host copy costs on the arena and builds route
// auto's model; a failed probe keeps conservative host costs.
func (a *Agent) newRouter() *router {
	h, err := calibrateHost(a.set.Gatherer, a.arenaD)
	if err != nil {
		a.log.Warn("copy probe failed; route auto assumes 2 GB/s host copies", "err", err)
		h.CopyBandwidth, h.PerRun = 2e9, 50*time.Nanosecond
	}
	r, err := newRouter(a.set.Engine, h, a.cfg.MaxChunk)
	if err != nil {
		a.log.Warn("route auto falls back to the gates alone", "err", err)
		return nil
	}
	a.log.Debug("route auto calibrated", "model", r.snapshot())
	return r
}

// RouteModel returns a snapshot of route auto's cost model; ok is false
// when there is none (bounce off).
func (a *Agent) RouteModel() (m RouteModel, ok bool) {
	if a.router == nil {
		return RouteModel{}, false
	}
	return a.router.snapshot(), true
}

// Name returns the agent's name.
func (a *Agent) Name() string { return a.name }

// BounceEnabled reports whether the local bounce path is up, and why not.
func (a *Agent) BounceEnabled() (bool, string) { return a.bounceOn, a.noBounce }

// Arena returns the registered arena that receiver grants are carved from
// (zero when bounce is off). Its address is public: every peer sees it in
// this agent's engine metadata.
func (a *Agent) Arena() transfer.Desc { return a.arenaD }

// Config returns the effective configuration (after defaults and clamping).
func (a *Agent) Config() Config { return a.cfg }

// RegisterMemory registers user memory with the engine and the stages, so it
// can be a transfer's source or a destination peers write to. Peers must
// reload this agent's descriptor to see new destinations.
func (a *Agent) RegisterMemory(d transfer.Desc) error {
	return a.RegisterMemoryFor(d)
}

// RegisterMemoryFor is RegisterMemory for memory only the named peers may
// write with the direct path (with authentication on; none named: every
// admitted peer, as RegisterMemory). Any registered memory can be a
// transfer's source.
//
// Memory the engine carries only by staging each descriptor through host
// buffers (transfer.StagedKinder: tcp with device staging) is registered
// with both, so the direct route can carry it too. Memory the engine cannot
// touch but the stages can (device KV with a host
// engine, CUDA stages and a pinned-host arena) is registered with the
// stages alone: transfers from and into it take the bounce route, the only
// one that can carry it. Memory neither can touch is refused wrapping
// ErrUnsupported.
func (a *Agent) RegisterMemoryFor(d transfer.Desc, peers ...string) error {
	if !transfer.Handles(a.set.Engine, d.Kind) && !transfer.Stages(a.set.Engine, d.Kind) {
		return a.registerStageOnly(d, peers)
	}
	if err := a.set.Registry.Add(d); err != nil {
		return fmt.Errorf("pipeline: register %v: %w", d, err)
	}
	if err := a.set.Engine.RegisterMemory(d); err != nil {
		_ = a.set.Registry.Remove(d)
		return fmt.Errorf("pipeline: register %v with engine: %w", d, err)
	}
	var who []string
	if len(peers) > 0 {
		who = slices.Clone(peers)
	}
	a.dests.add(d, who)
	return nil
}

// registerStageOnly registers d, which the engine cannot touch, with the
// stages alone, or says why it cannot be carried at all.
func (a *Agent) registerStageOnly(d transfer.Desc, peers []string) error {
	if !a.bounceOn {
		return fmt.Errorf("pipeline: register %v: the engine cannot touch %s memory and the bounce path, which could stage it through the arena, is off (%s): %w",
			d, d.Kind, a.noBounce, transfer.ErrUnsupported)
	}
	if !transfer.Handles(a.set.Gatherer, d.Kind) || !transfer.Handles(a.set.Scatterer, d.Kind) {
		return fmt.Errorf("pipeline: register %v: neither the engine nor both stages can touch %s memory (device KV needs stages.gather and stages.scatter cuda): %w",
			d, d.Kind, transfer.ErrUnsupported)
	}
	if err := a.set.Registry.Add(d); err != nil {
		return fmt.Errorf("pipeline: register %v: %w", d, err)
	}
	a.stageMu.Lock()
	if a.stageOnly == nil {
		a.stageOnly = map[transfer.Desc]bool{}
	}
	a.stageOnly[d] = true
	a.stageMu.Unlock()
	var who []string
	if len(peers) > 0 {
		who = slices.Clone(peers)
	}
	a.dests.add(d, who)
	return nil
}

// DeregisterMemory undoes RegisterMemory. It refuses with ErrInUse while a
// gather or scatter still copies into or out of the memory, a write uses
// it or a registered pool lies in it (DeregisterPool first); free the
// memory only once DeregisterMemory succeeded.
func (a *Agent) DeregisterMemory(d transfer.Desc) error {
	if err := a.removeUnpooled(d); err != nil {
		return fmt.Errorf("pipeline: deregister %v: %w", d, err)
	}
	// The engine refuses while a write uses d, in which case d stays
	// registered.
	a.stageMu.Lock()
	stageOnly := a.stageOnly[d]
	delete(a.stageOnly, d)
	a.stageMu.Unlock()
	if stageOnly {
		a.dests.remove(d)
		return nil
	}
	if err := a.set.Engine.DeregisterMemory(d); err != nil {
		if aerr := a.set.Registry.Add(d); aerr != nil {
			a.log.Error("re-register after a refused deregister", "desc", d, "err", aerr)
		}
		return fmt.Errorf("pipeline: deregister %v: %w", d, err)
	}
	a.dests.remove(d)
	return nil
}

// removeUnpooled removes d from the stages' registry unless a registered
// pool lies in it (ErrInUse), under the pool lock, so no RegisterPool finds
// d between the check and the removal. The registry refuses (ErrInUse)
// while a gather or scatter still copies into or out of d.
func (a *Agent) removeUnpooled(d transfer.Desc) error {
	a.poolMu.Lock()
	defer a.poolMu.Unlock()
	if name := a.poolOverLocked(d); name != "" {
		return fmt.Errorf("pool %q lies in it: %w", name, transfer.ErrInUse)
	}
	if a.deregisterChecked != nil {
		a.deregisterChecked()
	}
	return a.set.Registry.Remove(d)
}

// Handshake returns the capability blob this agent advertises, or nil when
// it offers no bounce path.
func (a *Agent) Handshake() *wire.Handshake {
	if !a.bounceOn {
		return nil
	}
	ep := a.set.Control.LocalEndpoint()
	if ep == "" {
		return nil
	}
	return &wire.Handshake{
		Version:       wire.Version,
		ControlKind:   a.set.Control.Kind(),
		ArenaCapacity: a.capacity,
		MaxChunk:      a.cfg.MaxChunk,
		Endpoint:      ep,
	}
}

// Descriptor returns the blob peers pass to LoadPeer: this agent's name, its
// engine metadata, its bounce handshake and its block pools.
func (a *Agent) Descriptor() ([]byte, error) {
	md, err := a.set.Engine.Metadata()
	if err != nil {
		return nil, fmt.Errorf("pipeline: engine metadata: %w", err)
	}
	var key security.Key
	if a.set.Peers.Enabled() {
		key = a.set.Peers.Self().Public
	}
	return wire.MarshalAgentDesc(wire.AgentDesc{Name: a.name, Engine: md, PublicKey: key, Handshake: a.Handshake(), Pools: a.poolDescs()}), nil
}

// LoadPeer loads a peer's descriptor: its public key joins the admitted set
// (when the trust policy admits it: security.allowed_peers), the engine
// learns how to reach it and the handshake decides its route. A descriptor
// without a key while authentication is on, or with a key the policy
// refuses, is an error wrapping security.ErrNotAdmitted. An incompatible or missing handshake is
// not an error: the peer is served on the direct path and the reason is
// logged and returned by PeerRoute. Loading a peer again refreshes it.
func (a *Agent) LoadPeer(blob []byte) (string, error) {
	d, err := wire.UnmarshalAgentDesc(blob)
	if err != nil {
		a.stats.badPeerDesc.Add(1)
		return "", fmt.Errorf("pipeline: load peer: %w: %w", transfer.ErrBadMetadata, err)
	}
	defer a.claimLoad(d.Name)()
	if err := a.set.Peers.Introduce(d.Name, d.PublicKey); err != nil {
		a.stats.unadmitted.Add(1)
		return "", fmt.Errorf("pipeline: load peer %q: %w", d.Name, err)
	}
	name, err := a.set.Engine.LoadPeer(d.Engine)
	if err != nil {
		return "", fmt.Errorf("pipeline: load peer %q: %w", d.Name, err)
	}
	if name != d.Name {
		return "", fmt.Errorf("pipeline: load peer: descriptor names %q but its engine metadata names %q: %w", d.Name, name, transfer.ErrBadMetadata)
	}
	pi := &peerInfo{name: name, pools: make(map[string]transfer.Pool, len(d.Pools)), layouts: map[string]*transfer.Layout{}}
	for _, p := range d.Pools {
		pi.pools[p.Name] = p.Pool
		if p.Layout != nil {
			pi.layouts[p.Name] = p.Layout
		}
	}
	reason := a.checkHandshake(d.Handshake, name)
	if d.HandshakeErr != nil {
		reason = "malformed handshake: " + d.HandshakeErr.Error()
	}
	if reason != "" {
		pi.reason = reason
		a.stats.incompatiblePeers.Add(1)
		if a.bounceOn {
			// Bounce is up here, so this peer is a fallback (the agent
			// warned at start when bounce is off locally).
			a.log.Warn("peer stays on the direct path", "peer", name, "reason", reason)
		}
	} else if err := a.set.Control.AddPeer(name, d.Handshake.Endpoint); err != nil {
		pi.reason = "control endpoint unusable: " + err.Error()
		a.stats.incompatiblePeers.Add(1)
		a.log.Warn("peer stays on the direct path", "peer", name, "reason", pi.reason)
	} else {
		pi.bounce, pi.ctrl, pi.endpoint = true, true, d.Handshake.Endpoint
	}
	if !pi.ctrl && a.set.Control != nil && d.Handshake != nil && d.HandshakeErr == nil &&
		d.Handshake.ControlKind == a.set.Control.Kind() && d.Handshake.Endpoint != "" {
		// Direct-only, but the control planes still speak to each other:
		// the peer learns when a direct request to it ended.
		if a.set.Control.AddPeer(name, d.Handshake.Endpoint) == nil {
			pi.ctrl, pi.endpoint = true, d.Handshake.Endpoint
		}
	}
	a.peersMu.Lock()
	a.peers[name] = pi
	a.peersMu.Unlock()
	return name, nil
}

// claimLoad waits until no fence of peer is under way and reserves peer
// for a LoadPeer; the returned func ends the reservation. A fence the
// reactor queued before the load then finds the peer loaded and skips it
// (claimFence), instead of dropping the engine state just loaded.
func (a *Agent) claimLoad(peer string) func() {
	for {
		a.peersMu.Lock()
		busy, ok := a.peerOps[peer]
		if !ok {
			done := make(chan struct{})
			a.peerOps[peer] = done
			a.peersMu.Unlock()
			return func() { a.endPeerOp(peer, done) }
		}
		a.peersMu.Unlock()
		<-busy
	}
}

// claimFence reserves a lost sender for a fence of its engine state,
// unless the peer is loaded or being loaded now (LoadPeer owns that state
// then): ok is false and nothing is reserved. end ends the reservation.
func (a *Agent) claimFence(peer string) (end func(), ok bool) {
	a.peersMu.Lock()
	defer a.peersMu.Unlock()
	if _, loaded := a.peers[peer]; loaded {
		return nil, false
	}
	if _, busy := a.peerOps[peer]; busy {
		return nil, false
	}
	done := make(chan struct{})
	a.peerOps[peer] = done
	return func() { a.endPeerOp(peer, done) }, true
}

func (a *Agent) endPeerOp(peer string, done chan struct{}) {
	a.peersMu.Lock()
	delete(a.peerOps, peer)
	a.peersMu.Unlock()
	close(done)
}

// checkHandshake says why peer's handshake h rules the bounce path out, in
// terms an operator can act on, or "".
func (a *Agent) checkHandshake(h *wire.Handshake, peer string) string {
	local := a.Handshake()
	switch {
	case local == nil:
		return "bounce is off locally: " + a.noBounce
	case h == nil:
		return fmt.Sprintf("peer advertises no bounce handshake (bounce is off on %s)", peer)
	case h.Version != local.Version:
		return fmt.Sprintf("wire version %d here vs %d on %s", local.Version, h.Version, peer)
	case h.ControlKind != local.ControlKind:
		return fmt.Sprintf("control plane %q here vs %q on %s (set control_plane.kind alike)", local.ControlKind, h.ControlKind, peer)
	case h.MaxChunk != local.MaxChunk:
		return fmt.Sprintf("max chunk %s here vs %s on %s (set bounce.max_chunk alike; it is clamped to the arena's usable capacity)", sizeString(local.MaxChunk), sizeString(h.MaxChunk), peer)
	case h.Endpoint == "":
		return "peer handshake has no endpoint"
	}
	return ""
}

// PeerRoute reports whether a loaded peer is bounce-capable and, if not, why.
func (a *Agent) PeerRoute(peer string) (bounce bool, reason string, known bool) {
	a.peersMu.RLock()
	defer a.peersMu.RUnlock()
	pi, ok := a.peers[peer]
	if !ok {
		return false, "", false
	}
	return pi.bounce, pi.reason, true
}

// ForgetPeer drops a peer: its handshake, its control path and its engine
// state. The peer's flows on this receiver are reclaimed and every request
// to it in flight, including one whose Submit raced ForgetPeer, fails with
// ErrPeerLost. A Submit that starts after ForgetPeer returned is refused
// with ErrUnknownPeer. A later LoadPeer must re-validate.
func (a *Agent) ForgetPeer(peer string) error {
	a.peersMu.Lock()
	if pi, ok := a.peers[peer]; ok {
		pi.forgotten.Store(true)
		delete(a.peers, peer)
	}
	a.peersMu.Unlock()
	defer a.set.Peers.Forget(peer)
	var errs []error
	if a.set.Control != nil {
		if err := a.set.Control.RemovePeer(peer); err != nil && !errors.Is(err, transfer.ErrUnknownPeer) {
			errs = append(errs, err)
		}
	}
	// The engine first. An engine that fences forgotten peers, once its
	// ForgetPeer returned without failing (an unknown peer has nothing left
	// to cut), proves no write from the peer lands any more, so the regions
	// reclaimed below may be granted to others at once; otherwise they are
	// quarantined first.
	err := a.set.Engine.ForgetPeer(peer)
	forgot := err == nil || errors.Is(err, transfer.ErrUnknownPeer)
	if !forgot {
		errs = append(errs, err)
	}
	fenced := forgot && fences(a.set.Engine)
	a.post(func(r *reactor) { r.forgetPeer(peer, fenced) })
	return errors.Join(errs...)
}

// fences reports whether eng proves a forgotten peer can no longer write
// local memory (transfer.Fencer).
func fences(eng transfer.Engine) bool {
	f, ok := eng.(transfer.Fencer)
	return ok && f.FencesForgottenPeers()
}

// Submit starts a transfer and returns at once. Argument errors (mismatched
// descriptors, unknown peer, agent shut down) are returned directly; every
// other failure resolves the batch.
func (a *Agent) Submit(req Request) (*Batch, error) {
	return a.SubmitContext(context.Background(), req)
}

// Shutdown fails every request in flight (ErrClosed), waits for their ops to
// stop (bounded by ctx), stops the reactor and workers and frees the arena
// once nothing can touch it. It is idempotent.
func (a *Agent) Shutdown(ctx context.Context) error {
	var err error
	a.stopOnce.Do(func() {
		a.closing.Store(true)
		a.post(func(r *reactor) { r.beginShutdown() })
		select {
		case <-a.stopped:
		case <-ctx.Done():
			err = fmt.Errorf("pipeline: shutdown: %w", ctx.Err())
			a.post(func(r *reactor) { r.forceStop() })
			<-a.stopped
		}
		// The pumps may be parked in the channel's Recv and the engine's
		// RecvNotification: woken, they return at once instead of at their
		// receive timeout.
		if w, ok := a.set.Control.(transfer.RecvWaker); ok {
			w.WakeRecv()
		}
		if w, ok := a.set.Engine.(transfer.NotificationWaker); ok {
			w.WakeRecvNotification()
		}
		a.wg.Wait()
		a.obs.close()
		if a.guard != nil {
			a.guard.close()
		}
		if a.rguard != nil {
			a.rguard.close() // no read of the arena is served from now on
		}
		if a.arena != nil {
			if a.r.arenaQuiet {
				if derr := a.set.Engine.DeregisterMemory(a.arenaD); derr != nil && !errors.Is(derr, transfer.ErrClosed) {
					a.log.Warn("deregister arena", "err", derr)
				}
				_ = a.set.Registry.Remove(a.arenaD)
				_ = a.arena.Close()
			} else {
				a.log.Warn("arena kept mapped: ops that may still touch it never stopped")
			}
		}
	})
	return err
}

// post queues a command for the reactor. It never blocks.
func (a *Agent) post(fn func(*reactor)) {
	a.cmdMu.Lock()
	a.cmds = append(a.cmds, fn)
	a.cmdMu.Unlock()
	a.kick()
}

func (a *Agent) kick() {
	select {
	case a.kickCh <- struct{}{}:
	default:
	}
}

func (a *Agent) takeCmds(buf []func(*reactor)) []func(*reactor) {
	a.cmdMu.Lock()
	buf = append(buf[:0], a.cmds...)
	clear(a.cmds)
	a.cmds = a.cmds[:0]
	a.cmdMu.Unlock()
	return buf
}

// CheckConservation runs the credit scheduler's conservation check on the
// reactor: every arena byte is free, held by exactly one remote flow, or
// local staging. It returns nil when bounce is off.
func (a *Agent) CheckConservation() error {
	res := make(chan error, 1)
	select {
	case <-a.stopped:
		return nil
	default:
	}
	a.post(func(r *reactor) {
		if r.sched == nil {
			res <- nil
			return
		}
		res <- r.sched.Check()
	})
	select {
	case err := <-res:
		return err
	case <-a.stopped:
		return nil
	}
}

// ArenaStats returns the credit scheduler's view of the arena (zero when
// bounce is off or the agent stopped).
func (a *Agent) ArenaStats() credit.Stats {
	res := make(chan credit.Stats, 1)
	a.post(func(r *reactor) {
		if r.sched != nil {
			res <- r.sched.Stats()
			return
		}
		res <- credit.Stats{}
	})
	select {
	case s := <-res:
		return s
	case <-a.stopped:
		return credit.Stats{}
	}
}
