// Package certify builds conformance fixtures for implementations made by
// node factories, so the conformance suite can certify any built-in (or any
// factory a plugin host adds) by kind — from `go test` or from
// `bounce conformance`.
package certify

import (
	"fmt"
	"maps"
	"slices"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/conformance"
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
	// Carrier is the engine kind that carries a control plane built on
	// engine notifications (nixlnotif); default loopback.
	Carrier string
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

// Run certifies the implementation name of kind with cfg and returns the
// report. Unknown kinds or names are errors listing what is accepted.
func Run(f node.Factories, kind, name string, o Options, cfg conformance.Config) (conformance.Report, error) {
	o.fill()
	if cfg.Subject == "" {
		cfg.Subject = kind + "/" + name
	}
	switch kind {
	case "engine":
		ef, ok := f.Engines[name]
		if !ok {
			return conformance.Report{}, unknown("engine", name, f.Engines)
		}
		return conformance.CheckEngine(EngineFactory(ef, o), cfg), nil
	case "control":
		cf, ok := f.Controls[name]
		if !ok {
			return conformance.Report{}, unknown("control plane", name, f.Controls)
		}
		carrier, ok := f.Engines[o.Carrier]
		if !ok {
			return conformance.Report{}, unknown("carrier engine", o.Carrier, f.Engines)
		}
		return conformance.CheckControlChannel(ControlFactory(cf, carrier, o), cfg), nil
	case "gather":
		gf, ok := f.Gatherers[name]
		if !ok {
			return conformance.Report{}, unknown("gather stage", name, f.Gatherers)
		}
		return conformance.CheckGatherer(GathererFactory(gf, o), cfg), nil
	case "scatter":
		sf, ok := f.Scatterers[name]
		if !ok {
			return conformance.Report{}, unknown("scatter stage", name, f.Scatterers)
		}
		return conformance.CheckScatterer(ScattererFactory(sf, o), cfg), nil
	case "writer":
		ef, ok := f.Engines[name]
		if !ok {
			return conformance.Report{}, unknown("engine (the writer's)", name, f.Engines)
		}
		return conformance.CheckWriter(WriterFactory(ef, o), cfg), nil
	}
	return conformance.Report{}, fmt.Errorf("certify: unknown kind %q; accepted: %v", kind, Kinds())
}

func unknown[V any](what, name string, m map[string]V) error {
	return fmt.Errorf("certify: no %s named %q; accepted: %v", what, name, slices.Sorted(maps.Keys(m)))
}

func settings(name string) node.Settings {
	return node.Settings{Name: name, Logger: nil, Registry: &mem.Registry{}, Notify: func() {}}
}

// EngineFactory returns fresh engine pairs "a" and "b" from ef; KillB
// closes b abruptly. The pair names what the suite cannot find out by
// itself: the engine's internal fragment size and largest notification
// (tcp, ucx) and, for loopback and cudacopy, a way to stall a's writes on
// purpose.
func EngineFactory(ef node.EngineFactory, o Options) conformance.EngineFactory {
	o.fill()
	return func() (conformance.EnginePair, error) {
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
				c := cudacopy.Config{Name: name}
				if name == "a" {
					c.Hold = valve.Wait
				}
				return cf.Fabric.NewEngine(c)
			}
		} else {
			create = func(name string) (transfer.Engine, error) { return ef.CreateEngine(settings(name), o.Engine) }
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
	if l, ok := e.(interface{ MaxNotifySize() int }); ok {
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
			eng, err := carrier.CreateEngine(settings(name), o.Engine)
			if err != nil {
				cleanup()
				return conformance.ControlSet{}, err
			}
			engines = append(engines, eng)
			ch, err := cf.CreateControl(settings(name), o.Control, eng)
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
	return func() (conformance.GathererFixture, error) {
		s := settings("g")
		g, err := gf.CreateGatherer(s, o.Bounce)
		if err != nil {
			return conformance.GathererFixture{}, err
		}
		return conformance.GathererFixture{Gatherer: g, Register: s.Registry.Add}, nil
	}
}

// ScattererFactory returns fresh scatterers over their own registry.
func ScattererFactory(sf node.ScatterFactory, o Options) conformance.ScattererFactory {
	o.fill()
	return func() (conformance.ScattererFixture, error) {
		s := settings("s")
		sc, err := sf.CreateScatterer(s, o.Bounce)
		if err != nil {
			return conformance.ScattererFixture{}, err
		}
		return conformance.ScattererFixture{Scatterer: sc, Register: s.Registry.Add}, nil
	}
}

// WriterFactory returns the engine-backed bulk writer on a fresh pair of
// engines from ef: a writes to b.
func WriterFactory(ef node.EngineFactory, o Options) conformance.WriterFactory {
	o.fill()
	pairs := EngineFactory(ef, o)
	return func() (conformance.WriterFixture, error) {
		p, err := pairs()
		if err != nil {
			return conformance.WriterFixture{}, err
		}
		return conformance.WriterFixture{
			Writer:         write.New(p.A),
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
			Cleanup: p.Cleanup,
		}, nil
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
