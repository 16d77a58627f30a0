// Package certify builds conformance fixtures for implementations made by
// node factories, so the conformance suite can certify any built-in (or any
// factory a plugin host adds) by kind — from `go test` or from
// `bounce conformance`.
package certify

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"slices"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/engines/cudacopy"
	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/engines/ucx"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/stages/write"
	"github.com/bouncekv/bounce/transfer"
)

// Kinds lists what can be certified: "engine", "control", "gather",
// "scatter" and "writer".
func Kinds() []string { return []string{"engine", "control", "gather", "scatter", "writer"} }

// Options tune the fixtures.
type Options struct {
	// Engine configures engines (and the carrier engines of a control plane
	// that rides on an engine). Zero means config defaults.
	Engine config.EngineConfig
	// Control configures control channels; BindAddress defaults to
	// 127.0.0.1.
	Control config.ControlPlaneConfig
	// Bounce configures stages (copy contexts).
	Bounce config.BounceConfig
	// Stages holds the stages' plugin blocks (checksum, env, args,
	// options), used when the stage certified is a plugin.
	Stages config.StagesConfig
	// Carrier is the engine kind that carries a control plane built on
	// engine notifications (nixlnotif); default loopback.
	Carrier string
	// Memory is the memory the data rules of engines, writers and stages
	// run on: "host" (the default), "cuda" (CUDA managed memory on
	// CUDADevice, through CUDA) or "auto" (Run probes: cuda for an
	// implementation that declares CUDA memory, transfer.MemoryKinder, else
	// host). Where no GPU is usable the rules are skipped with the reason.
	Memory string
	// CUDA is the driver for Memory "cuda"; Run takes it from the
	// factories' table when nil.
	CUDA *cuda.Lib
	// CUDADevice is the ordinal of Memory "cuda".
	CUDADevice int
	// Logger receives what the fixtures log, among it every line a
	// plugin writes to stderr; nil discards it.
	Logger *slog.Logger
}

// Memories lists the accepted Options.Memory values.
func Memories() []string { return []string{"host", "cuda", "auto"} }

// memory returns the conformance memory o names.
func (o Options) memory() (conformance.Memory, error) {
	switch o.Memory {
	case "", "host":
		return conformance.Memory{}, nil
	case "cuda":
	default:
		return conformance.Memory{}, fmt.Errorf("certify: unknown memory %q; accepted: %v", o.Memory, Memories())
	}
	m := conformance.Memory{Kind: transfer.CUDA, Device: int32(o.CUDADevice)}
	if o.CUDA == nil {
		m.Unavailable = "no CUDA driver given"
		return m, nil
	}
	drv, err := o.CUDA.Open()
	if err != nil {
		m.Unavailable = err.Error()
		return m, nil
	}
	ctx, err := drv.Primary(o.CUDADevice)
	if err != nil {
		m.Unavailable = err.Error()
		return m, nil
	}
	// The primary context is retained for the life of the process, as the
	// stages and engines on it retain it too.
	m.Alloc = func(n uint64) ([]byte, func() error, error) {
		p, err := ctx.MemAllocManaged(n)
		if err != nil {
			return nil, nil, err
		}
		return cuda.ManagedBytes(p, n), func() error { return ctx.MemFree(p) }, nil
	}
	return m, nil
}

func (o *Options) fill() {
	def := config.Default()
	if o.Engine.Kind == "" {
		o.Engine = def.Engine
	}
	if o.Control.SendHWM == 0 {
		o.Control = def.ControlPlane
	}
	if o.Control.BindAddress == "" && o.Control.Interface == "" {
		o.Control.BindAddress = "127.0.0.1"
	}
	if o.Bounce.CopyContexts == 0 {
		o.Bounce = def.Bounce
	}
	if o.Carrier == "" {
		o.Carrier = "loopback"
	}
}

// StartError is Run's error when the subject could not be created at all
// — a plugin that does not start or refuses its options, a built-in whose
// configuration it rejects — so no rule ran.
type StartError struct {
	// Subject is the report's subject ("engine/myfabric").
	Subject string
	Err     error
}

// Error says what could not be started and why.
func (e *StartError) Error() string {
	return fmt.Sprintf("certify: %s could not be started: %v", e.Subject, e.Err)
}

// Unwrap returns the cause.
func (e *StartError) Unwrap() error { return e.Err }

// Run certifies the implementation name of kind with cfg and returns the
// report. Unknown kinds or names are errors listing what is accepted.
// Before any rule, Run creates one fixture and closes it: an error there
// is a *StartError, and what that fixture lacks of the kind's optional
// capabilities is the report's Absent. A writer named in f.Writers (a
// write stage) is certified over a pair of carrier engines (o.Carrier);
// otherwise name is an engine and the writer its one bulk write.
func Run(f node.Factories, kind, name string, o Options, cfg conformance.Config) (conformance.Report, error) {
	o.fill()
	if o.CUDA == nil {
		o.CUDA = f.CUDA
	}
	if o.Memory == "auto" {
		o.Memory = probeMemory(f, kind, name, o)
	}
	if _, err := o.memory(); err != nil {
		return conformance.Report{}, err
	}
	if cfg.Subject == "" {
		cfg.Subject = kind + "/" + name
	}
	started := func(err error) error { return &StartError{Subject: cfg.Subject, Err: err} }
	var rep conformance.Report
	var absent []string
	switch kind {
	case "engine":
		ef, ok := f.Engines[name]
		if !ok {
			return rep, unknown("engine", name, f.Engines)
		}
		pairs := EngineFactory(ef, o)
		p, err := pairs()
		if err != nil {
			return rep, started(err)
		}
		if p.Memory.Unavailable == "" { // else every rule skips with the reason
			absent = EngineAbsent(p.A)
		}
		if p.Cleanup != nil {
			p.Cleanup()
		}
		rep = conformance.CheckEngine(pairs, cfg)
	case "control":
		cf, ok := f.Controls[name]
		if !ok {
			return rep, unknown("control plane", name, f.Controls)
		}
		carrier, ok := f.Engines[o.Carrier]
		if !ok {
			return rep, unknown("carrier engine", o.Carrier, f.Engines)
		}
		sets := ControlFactory(cf, carrier, o)
		set, err := sets()
		if err != nil {
			return rep, started(err)
		}
		for _, c := range []transfer.ControlChannel{set.A, set.B, set.C} {
			c.Close()
		}
		set.Cleanup()
		rep = conformance.CheckControlChannel(sets, cfg)
	case "gather":
		gf, ok := f.Gatherers[name]
		if !ok {
			return rep, unknown("gather stage", name, f.Gatherers)
		}
		fixtures := GathererFactory(gf, o)
		if err := probe(fixtures, func(fx conformance.GathererFixture) { closeIf(fx.Gatherer) }); err != nil {
			return rep, started(err)
		}
		rep = conformance.CheckGatherer(fixtures, cfg)
	case "scatter":
		sf, ok := f.Scatterers[name]
		if !ok {
			return rep, unknown("scatter stage", name, f.Scatterers)
		}
		fixtures := ScattererFactory(sf, o)
		if err := probe(fixtures, func(fx conformance.ScattererFixture) { closeIf(fx.Scatterer) }); err != nil {
			return rep, started(err)
		}
		rep = conformance.CheckScatterer(fixtures, cfg)
	case "writer":
		var fixtures conformance.WriterFactory
		if wf, ok := f.Writers[name]; ok {
			carrier, ok := f.Engines[o.Carrier]
			if !ok {
				return rep, unknown("carrier engine", o.Carrier, f.Engines)
			}
			fixtures = WriteStageFactory(wf, carrier, o)
		} else if ef, ok := f.Engines[name]; ok {
			fixtures = WriterFactory(ef, o)
		} else {
			return rep, fmt.Errorf("certify: no write stage or engine named %q; accepted: %v", name, slices.Sorted(maps.Keys(f.Writers)))
		}
		fx, err := fixtures()
		if err != nil {
			return rep, started(err)
		}
		if _, ok := fx.Writer.(transfer.ContextWriter); !ok && fx.Writer != nil {
			absent = append(absent, "transfer.ContextWriter")
		}
		if fx.Cleanup != nil {
			fx.Cleanup()
		}
		rep = conformance.CheckWriter(fixtures, cfg)
	default:
		return rep, fmt.Errorf("certify: unknown kind %q; accepted: %v", kind, Kinds())
	}
	rep.Absent = absent
	return rep, nil
}

// EngineAbsent names the optional capabilities e lacks, of those the
// agent uses: transfer.Notifier and MaxNotifySize (its limit; 0 states none),
// transfer.Fencer, transfer.PeerLossReporter, transfer.WriteGuarded and
// RouteCosts (route auto's cost model; costs that are not valid count as
// absent).
func EngineAbsent(e transfer.Engine) []string {
	var absent []string
	lacks := func(name string, has bool) {
		if !has {
			absent = append(absent, name)
		}
	}
	_, notifier := e.(transfer.Notifier)
	lacks("transfer.Notifier", notifier)
	if notifier {
		_, ok := e.(transfer.NotifyLimiter)
		lacks("MaxNotifySize", ok)
	}
	_, fencer := e.(transfer.Fencer)
	lacks("transfer.Fencer", fencer)
	_, reporter := e.(transfer.PeerLossReporter)
	lacks("transfer.PeerLossReporter", reporter)
	_, guarded := e.(transfer.WriteGuarded)
	lacks("transfer.WriteGuarded", guarded)
	c, ok := e.(transfer.RouteCoster)
	if ok {
		post, write, bw := c.RouteCosts()
		ok = post >= 0 && write >= 0 && bw > 0 && !math.IsInf(bw, 0)
	}
	lacks("RouteCosts", ok)
	return absent
}

// probeMemory returns "cuda" when the implementation name of kind declares
// CUDA memory, else "host" (also when it cannot be made here: the suite
// then reports why).
func probeMemory(f node.Factories, kind, name string, o Options) string {
	var x any
	var err error
	switch kind {
	case "engine", "writer":
		if ef, ok := f.Engines[name]; ok {
			if _, isCUDA := ef.(*node.CUDACopyFactory); isCUDA {
				return "cuda" // made on demand; no GPU is reported by the rules
			}
			if e, err := fresh(ef).CreateEngine(o.settings("probe"), o.Engine); err == nil {
				x = e
				defer e.Close()
			}
		}
	case "gather":
		if gf, ok := f.Gatherers[name]; ok {
			var g transfer.Gatherer
			if g, err = gf.CreateGatherer(o.settings("probe"), o.Bounce); err == nil {
				x = g
				defer g.Close()
			}
		}
	case "scatter":
		if sf, ok := f.Scatterers[name]; ok {
			var sc transfer.Scatterer
			if sc, err = sf.CreateScatterer(o.settings("probe"), o.Bounce); err == nil {
				x = sc
				defer sc.Close()
			}
		}
	}
	if errors.Is(err, cuda.ErrUnavailable) || x != nil && transfer.Handles(x, transfer.CUDA) {
		return "cuda" // a CUDA stage without a GPU: the rules say why they skip
	}
	return "host"
}

func unknown[V any](what, name string, m map[string]V) error {
	return fmt.Errorf("certify: no %s named %q; accepted: %v", what, name, slices.Sorted(maps.Keys(m)))
}

func (o Options) settings(name string) node.Settings {
	return node.Settings{Name: name, Logger: o.Logger, Registry: &mem.Registry{}, Notify: func() {}}
}

// stageSettings are settings for a stage of configuration c: its plugin
// block when it is a plugin (or names a binary).
func (o Options) stageSettings(name string, c config.StageConfig) node.Settings {
	s := o.settings(name)
	s.Plugin = c.Plugin
	return s
}

// EngineFactory returns fresh engine pairs "a" and "b" from ef; KillB
// closes b abruptly. The pair names what the suite cannot find out by
// itself: the engine's internal fragment size and largest notification
// (tcp, ucx) and, for loopback and cudacopy, a way to stall a's writes on
// purpose (tcp and plugin engines that implement transfer.WriteStaller
// are stalled through it by the suite).
func EngineFactory(ef node.EngineFactory, o Options) conformance.EngineFactory {
	o.fill()
	memory, merr := o.memory()
	return func() (conformance.EnginePair, error) {
		if merr != nil || memory.Unavailable != "" {
			return conformance.EnginePair{Memory: memory}, merr
		}
		ef := fresh(ef)
		var create func(name string) (transfer.Engine, error)
		var valve *conformance.Valve
		if lf, ok := ef.(*node.LoopbackFactory); ok {
			// Built here rather than by the factory, to give a a hook that
			// stalls its writes (StallWrites).
			valve = &conformance.Valve{}
			create = func(name string) (transfer.Engine, error) {
				opts := loopback.Options{}
				if name == "a" {
					opts.Hold = valve.Wait
				}
				return lf.Fabric.NewEngine(name, opts)
			}
		} else if cf, ok := ef.(*node.CUDACopyFactory); ok {
			// The same for cudacopy: a's copies are queued only once its
			// Hold returns.
			valve = &conformance.Valve{}
			create = func(name string) (transfer.Engine, error) {
				c := cudacopy.Config{Name: name, Device: o.CUDADevice}
				if name == "a" {
					c.Hold = valve.Wait
				}
				return cf.Fabric.NewEngine(c)
			}
		} else {
			// Others stall a's writes themselves when they can: the suite
			// uses their transfer.WriteStaller (tcp's, and a plugin
			// engine's that declares one, through the plugin protocol).
			create = func(name string) (transfer.Engine, error) { return ef.CreateEngine(o.settings(name), o.Engine) }
		}
		a, err := create("a")
		if err != nil {
			return conformance.EnginePair{}, err
		}
		b, err := create("b")
		if err != nil {
			a.Close()
			return conformance.EnginePair{}, err
		}
		p := conformance.EnginePair{
			A: a, B: b,
			Memory:  memory,
			KillB:   func() { b.Close() },
			Cleanup: func() { a.Close(); b.Close() },
		}
		if valve != nil {
			p.StallWrites = valve.Stall
		}
		p.FragmentSize, p.MaxNotification = limits(a, o.Engine)
		return p, nil
	}
}

// limits returns the internal fragment size and the largest notification
// of the in-tree engines that have them (zero where unknown: the suite
// then applies its own floor, or finds the largest notification itself).
func limits(e transfer.Engine, cfg config.EngineConfig) (uint64, int) {
	var note int
	if l, ok := e.(transfer.NotifyLimiter); ok {
		note = l.MaxNotifySize()
	}
	switch e.(type) {
	case *tcp.Engine:
		return tcp.MaxFramePayload, note
	case *ucx.Engine:
		if _, set := cfg.Options["fragment_size"]; !set {
			return ucx.DefaultFragmentSize, note
		}
	}
	return 0, note
}

// ControlFactory returns fresh channel sets "a", "b", "c"; a control plane
// that rides on an engine gets its own carrier engine per channel.
func ControlFactory(cf node.ControlFactory, carrier node.EngineFactory, o Options) conformance.ControlFactory {
	o.fill()
	return func() (conformance.ControlSet, error) {
		cf, carrier := freshControl(cf), fresh(carrier)
		var chans [3]transfer.ControlChannel
		var engines []transfer.Engine
		closeEngines := func() {
			for _, e := range engines {
				e.Close()
			}
		}
		cleanup := func() {
			for _, c := range chans {
				if c != nil {
					c.Close()
				}
			}
			closeEngines()
		}
		for i, name := range []string{"a", "b", "c"} {
			eng, err := carrier.CreateEngine(o.settings(name), o.Engine)
			if err != nil {
				cleanup()
				return conformance.ControlSet{}, err
			}
			engines = append(engines, eng)
			ch, err := cf.CreateControl(o.settings(name), o.Control, eng)
			if err != nil {
				cleanup()
				return conformance.ControlSet{}, err
			}
			chans[i] = ch
		}
		// The suite closes the channels itself; the carriers are ours.
		return conformance.ControlSet{A: chans[0], B: chans[1], C: chans[2], Cleanup: closeEngines}, nil
	}
}

// GathererFactory returns fresh gatherers over their own registry.
func GathererFactory(gf node.GatherFactory, o Options) conformance.GathererFactory {
	o.fill()
	memory, merr := o.memory()
	return func() (conformance.GathererFixture, error) {
		if merr != nil || memory.Unavailable != "" {
			return conformance.GathererFixture{Memory: memory}, merr
		}
		s := o.stageSettings("g", o.Stages.Gather)
		s.CUDADevice = o.CUDADevice
		g, err := gf.CreateGatherer(s, o.Bounce)
		if err != nil {
			return conformance.GathererFixture{}, err
		}
		return conformance.GathererFixture{Gatherer: g, Register: s.Registry.Add, Memory: memory}, nil
	}
}

// ScattererFactory returns fresh scatterers over their own registry.
func ScattererFactory(sf node.ScatterFactory, o Options) conformance.ScattererFactory {
	o.fill()
	memory, merr := o.memory()
	return func() (conformance.ScattererFixture, error) {
		if merr != nil || memory.Unavailable != "" {
			return conformance.ScattererFixture{Memory: memory}, merr
		}
		s := o.stageSettings("s", o.Stages.Scatter)
		s.CUDADevice = o.CUDADevice
		sc, err := sf.CreateScatterer(s, o.Bounce)
		if err != nil {
			return conformance.ScattererFixture{}, err
		}
		return conformance.ScattererFixture{Scatterer: sc, Register: s.Registry.Add, Memory: memory}, nil
	}
}

// WriterFactory returns the engine-backed bulk writer on a fresh pair of
// engines from ef: a writes to b.
func WriterFactory(ef node.EngineFactory, o Options) conformance.WriterFactory {
	o.fill()
	pairs := EngineFactory(ef, o)
	return func() (conformance.WriterFixture, error) {
		p, err := pairs()
		if err != nil || p.Memory.Unavailable != "" {
			return conformance.WriterFixture{Memory: p.Memory}, err
		}
		return writerOver(p, write.New(p.A), p.Cleanup), nil
	}
}

// WriteStageFactory returns the write stage wf creates over a fresh pair
// of carrier engines from ef: a writes to b, through wf's writer on a.
func WriteStageFactory(wf node.WriteFactory, ef node.EngineFactory, o Options) conformance.WriterFactory {
	o.fill()
	pairs := EngineFactory(ef, o)
	return func() (conformance.WriterFixture, error) {
		p, err := pairs()
		if err != nil || p.Memory.Unavailable != "" {
			return conformance.WriterFixture{Memory: p.Memory}, err
		}
		w, err := wf.CreateWriter(o.stageSettings("a", o.Stages.Write), p.A)
		if err != nil {
			p.Cleanup()
			return conformance.WriterFixture{}, err
		}
		return writerOver(p, w, func() {
			if c, ok := w.(io.Closer); ok {
				c.Close()
			}
			p.Cleanup()
		}), nil
	}
}

// writerOver is the fixture of writer w on pair p's engine a, writing to
// b; cleanup ends it.
func writerOver(p conformance.EnginePair, w transfer.Writer, cleanup func()) conformance.WriterFixture {
	return conformance.WriterFixture{
		Memory:         p.Memory,
		Writer:         w,
		Peer:           "b",
		RegisterSource: p.A.RegisterMemory,
		Grant: func(d transfer.Desc) error {
			if err := p.B.RegisterMemory(d); err != nil {
				return err
			}
			md, err := p.B.Metadata()
			if err != nil {
				return err
			}
			_, err = p.A.LoadPeer(md)
			return err
		},
		Cleanup: cleanup,
	}
}

// fresh gives stateful in-process factories (the loopback fabric) a new
// instance per fixture so rules never see each other's engines.
func fresh(ef node.EngineFactory) node.EngineFactory {
	if _, ok := ef.(*node.LoopbackFactory); ok {
		return &node.LoopbackFactory{Fabric: loopback.NewFabric()}
	}
	return ef
}

func freshControl(cf node.ControlFactory) node.ControlFactory {
	if _, ok := cf.(*node.InprocFactory); ok {
		return node.NewInprocFactory()
	}
	return cf
}

// probe builds one fixture set, to tell a stage that cannot start apart
// from one that fails a rule, and releases it with release.
func probe[F any](fixtures func() (F, error), release func(F)) error {
	fx, err := fixtures()
	if err != nil {
		return err
	}
	release(fx)
	return nil
}

// closeIf closes c unless it is nil (a fixture without the stage where its
// memory is unavailable).
func closeIf(c interface{ Close() error }) {
	if c != nil {
		c.Close()
	}
}
