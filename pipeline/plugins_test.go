package pipeline

import (
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/plugins"
	gatherhost "github.com/bouncekv/bounce/stages/gather/host"
	scatterhost "github.com/bouncekv/bounce/stages/scatter/host"
	"github.com/bouncekv/bounce/stages/write"
	"github.com/bouncekv/bounce/transfer"
)

// buildTestPlugin builds plugins/internal/testplugin, which serves all
// five components from the in-tree implementations.
func buildTestPlugin(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "testplugin")
	if out, err := exec.Command("go", "build", "-o", bin, "../plugins/internal/testplugin").CombinedOutput(); err != nil {
		t.Fatalf("build test plugin: %v\n%s", err, out)
	}
	return bin
}

// pluginWorld is a world whose nodes run one component (engine, control,
// gather, scatter or writer) as a real plugin process each.
func pluginWorld(bin, component string) func(testing.TB) *world {
	spec := plugins.Spec{Path: bin}
	must := func(t testing.TB, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	hostStages := func(t testing.TB, reg *mem.Registry) (transfer.Gatherer, transfer.Scatterer) {
		g, err := gatherhost.New(gatherhost.Settings{Registry: reg, Contexts: 8})
		must(t, err)
		sc, err := scatterhost.New(scatterhost.Settings{Registry: reg, Contexts: 8})
		must(t, err)
		return g, sc
	}
	return func(t testing.TB) *world {
		w := newWorld(t)
		switch component {
		case "engine":
			w.engine = func(t testing.TB, name string, _ loopback.Options) transfer.Engine {
				e, err := plugins.OpenEngine(spec, plugins.Restart{}, name, nil)
				must(t, err)
				return e
			}
		case "control":
			w.ctrl = func(t testing.TB, name string, _ transfer.Engine) transfer.ControlChannel {
				ch, err := plugins.OpenControl(spec, plugins.Restart{}, name, map[string]string{"bind_address": "127.0.0.1"})
				must(t, err)
				return ch
			}
		case "gather":
			w.stages = func(t testing.TB, name string, reg *mem.Registry, _ transfer.Engine, notify func()) (transfer.Gatherer, transfer.Scatterer, transfer.Writer) {
				unused, sc := hostStages(t, reg)
				unused.Close()
				g, err := plugins.OpenGatherer(plugins.Spec{Path: spec.Path, Notify: notify}, plugins.Restart{}, name, nil, reg)
				must(t, err)
				return g, sc, nil
			}
		case "scatter":
			w.stages = func(t testing.TB, name string, reg *mem.Registry, _ transfer.Engine, notify func()) (transfer.Gatherer, transfer.Scatterer, transfer.Writer) {
				g, unused := hostStages(t, reg)
				unused.Close()
				sc, err := plugins.OpenScatterer(plugins.Spec{Path: spec.Path, Notify: notify}, plugins.Restart{}, name, nil, reg)
				must(t, err)
				return g, sc, nil
			}
		case "writer":
			w.stages = func(t testing.TB, name string, reg *mem.Registry, eng transfer.Engine, notify func()) (transfer.Gatherer, transfer.Scatterer, transfer.Writer) {
				g, sc := hostStages(t, reg)
				wr, err := plugins.OpenWriter(plugins.Spec{Path: spec.Path, Notify: notify}, plugins.Restart{}, name, nil, eng)
				must(t, err)
				return g, sc, wr
			}
		default:
			t.Fatalf("unknown component %q", component)
		}
		return w
	}
}

// TestEndToEndPlugins runs the end-to-end suite with each of the five
// components swapped for its plugin form: real plugin processes, memory
// shared by memfd handle, ops polled over gRPC.
func TestEndToEndPlugins(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts plugin processes")
	}
	bin := buildTestPlugin(t)
	for _, component := range []string{"engine", "control", "gather", "scatter", "writer"} {
		t.Run(component, func(t *testing.T) { e2e(t, pluginWorld(bin, component)) })
	}
}

// TestPluginCrash kills (SIGKILL) the sender's engine plugin or gather
// plugin, or the receiver's scatter plugin, while 8 transfers are in
// flight: each batch fails within the request timeout with an error naming
// the plugin and its exit status (for the receiver's scatter, the sender
// learns it from the receiver's NACK, not from its own timeout), it is
// retired and quiescent (the dead process touches no memory), the plugin
// is restarted, and the agent serves the next transfer on the new process.
// The world's leak check covers the supervisors and gRPC connections.
func TestPluginCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts plugin processes")
	}
	bin := buildTestPlugin(t)
	policy := plugins.Restart{MaxRestarts: 3, Backoff: 20 * time.Millisecond}
	// The plugin holds every op pending 300ms, so the kill lands mid-transfer.
	slow := map[string]string{"delay": "300ms"}
	for _, component := range []string{"engine", "gather", "scatter"} {
		t.Run(component, func(t *testing.T) {
			var victim plugins.Supervised
			w := newWorld(t)
			spec := plugins.Spec{Path: bin}
			switch component {
			case "engine":
				// Both sides need engines that reach each other: tcp
				// in-process for b.
				w.engine = func(t testing.TB, name string, opt loopback.Options) transfer.Engine {
					if name == "a" {
						e, err := plugins.OpenEngine(spec, policy, name, slow)
						if err != nil {
							t.Fatal(err)
						}
						victim = e.(plugins.Supervised)
						return e
					}
					return newTCPEngine(t, name, opt)
				}
			case "gather":
				w.stages = func(t testing.TB, name string, reg *mem.Registry, _ transfer.Engine, notify func()) (transfer.Gatherer, transfer.Scatterer, transfer.Writer) {
					sc, err := scatterhost.New(scatterhost.Settings{Registry: reg, Contexts: 8})
					if err != nil {
						t.Fatal(err)
					}
					if name != "a" {
						g, err := gatherhost.New(gatherhost.Settings{Registry: reg, Contexts: 8})
						if err != nil {
							t.Fatal(err)
						}
						return g, sc, nil
					}
					g, err := plugins.OpenGatherer(plugins.Spec{Path: spec.Path, Notify: notify}, policy, name, slow, reg)
					if err != nil {
						t.Fatal(err)
					}
					victim = g.(plugins.Supervised)
					return g, sc, nil
				}
			case "scatter":
				w.stages = func(t testing.TB, name string, reg *mem.Registry, _ transfer.Engine, notify func()) (transfer.Gatherer, transfer.Scatterer, transfer.Writer) {
					g, err := gatherhost.New(gatherhost.Settings{Registry: reg, Contexts: 8})
					if err != nil {
						t.Fatal(err)
					}
					if name != "b" {
						sc, err := scatterhost.New(scatterhost.Settings{Registry: reg, Contexts: 8})
						if err != nil {
							t.Fatal(err)
						}
						return g, sc, nil
					}
					sc, err := plugins.OpenScatterer(plugins.Spec{Path: spec.Path, Notify: notify}, policy, name, slow, reg)
					if err != nil {
						t.Fatal(err)
					}
					victim = sc.(plugins.Supervised)
					return g, sc, nil
				}
			}
			cfg := testConfig()
			a, b := w.node("a", cfg), w.node("b", cfg)
			// Under load: 8 batches of 1 MiB in flight at once, sharing the
			// receiver's 8 MiB arena.
			const batches, per = 8, 1 << 20
			l := kvLayout{count: per / 4096, size: 4096, fragmented: true}
			src, dst := a.buffer(t, batches*per), b.buffer(t, batches*per)
			connect(t, a, b)

			first := victim.Current()
			start := time.Now()
			var bts []*Batch
			for i := range batches {
				j := prepare(src[i*per:(i+1)*per], dst[i*per:(i+1)*per], l, uint64(1+i))
				bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
				if err != nil {
					t.Fatal(err)
				}
				bts = append(bts, bt)
			}
			time.Sleep(100 * time.Millisecond)
			killed := time.Now()
			if err := syscall.Kill(first.Pid(), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			var took []time.Duration
			failed := 0
			for _, bt := range bts {
				err := wait(t, bt)
				took = append(took, time.Since(killed))
				if d := time.Since(start); d > cfg.RequestTimeout+2*time.Second {
					t.Fatalf("batch %d resolved after %v, beyond the request timeout %v", bt.ID(), d, cfg.RequestTimeout)
				}
				if r, q := bt.Retirement(); !r || !q {
					t.Fatalf("batch %d: retirement = (%v, %v), want retired and quiescent: the killed process touches no memory", bt.ID(), r, q)
				}
				if err := bt.Release(); err != nil {
					t.Fatal(err)
				}
				if err == nil {
					continue // it finished before the kill
				}
				failed++
				if errors.Is(err, transfer.ErrTimeout) {
					t.Errorf("batch %d failed by its timeout, not by its cause: %v", bt.ID(), err)
				}
				for _, want := range []string{"testplugin", "signal: killed"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("batch %d error %q does not name %q", bt.ID(), err, want)
					}
				}
			}
			if failed == 0 {
				t.Fatal("no transfer failed although the plugin was killed mid-way")
			}
			slices.Sort(took)
			t.Logf("%s plugin killed with %d batches in flight: %d failed, resolved min %v median %v max %v after the kill",
				component, batches, failed, took[0].Round(time.Millisecond), took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))

			deadline := time.Now().Add(10 * time.Second)
			for victim.Current() == nil || victim.Current() == first {
				if time.Now().After(deadline) {
					t.Fatalf("plugin not restarted within 10s (restarts %d)", victim.Restarts())
				}
				time.Sleep(10 * time.Millisecond)
			}
			if victim.Restarts() != 1 {
				t.Fatalf("restarts = %d, want 1", victim.Restarts())
			}
			j := prepare(src[:per], dst[:per], l, 100)
			bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
			if err != nil {
				t.Fatal(err)
			}
			if err := wait(t, bt); err != nil {
				t.Fatalf("transfer after the restart: %v", err)
			}
			j.verify(t)
			if err := bt.Release(); err != nil {
				t.Fatal(err)
			}
			settled(t, a, b)
		})
	}
}

// TestPluginEnginePeerLostReclaimsFlows: the receiver's engine is the tcp
// engine in a real plugin process, and its control channel reports no
// losses. A sender holding a granted region dies (engine and channel
// closed at once): the plugin's engine reports the peer lost across the
// process boundary, the receiver's agent counts it (LostPeers) and
// reclaims the flow long before its expiry; the next sender is served.
func TestPluginEnginePeerLostReclaimsFlows(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts plugin processes")
	}
	bin := buildTestPlugin(t)
	w := newWorld(t)
	w.engine = func(t testing.TB, name string, opt loopback.Options) transfer.Engine {
		if name != "r" {
			return newTCPEngine(t, name, opt)
		}
		e, err := plugins.OpenEngine(plugins.Spec{Path: bin}, plugins.Restart{}, name, nil)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	cfg := testConfig()
	cfg.RequestTimeout = 15 * time.Second // flows expire after a minute
	var sw *stallWriter
	s := w.node("s", cfg, func(set *Settings) {
		sw = &stallWriter{w: write.New(set.Engine)}
		set.Writer = sw
	})
	r, next := w.node("r", cfg), w.node("next", cfg)
	if _, ok := r.eng.(transfer.PeerLossReporter); !ok {
		t.Errorf("the plugin engine %T is not a transfer.PeerLossReporter", r.eng)
	}
	connect(t, s, r, next)
	killed := dieHoldingGrant(t, s, sw, r)
	awaitReclaimed(t, r, killed, 30*time.Second, "the sender died")
	if n := r.Stats().LostPeers; n < 1 {
		t.Fatalf("LostPeers = %d, want at least 1", n)
	}
	served(t, next, r, 3)
}

// TestReceiverEnginePluginRestart: the receiver's engine is a real plugin
// process under a restart policy; it is killed (SIGKILL) between two
// transfers and restarted. The restarted process listens where the first
// did, so the sender — which loaded the receiver's descriptor once and
// never again — is served by it: the next transfer lands, verified.
func TestReceiverEnginePluginRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts plugin processes")
	}
	bin := buildTestPlugin(t)
	var victim plugins.Supervised
	w := newWorld(t)
	w.engine = func(t testing.TB, name string, opt loopback.Options) transfer.Engine {
		if name != "b" {
			return newTCPEngine(t, name, opt)
		}
		e, err := plugins.OpenEngine(plugins.Spec{Path: bin}, plugins.Restart{MaxRestarts: 1, Backoff: 20 * time.Millisecond}, name, map[string]string{"listen": "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		victim = e.(plugins.Supervised)
		return e
	}
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	connect(t, a, b)
	j := simple(t, a, b, 1)
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatalf("transfer before the kill: %v", err)
	}
	j.verify(t)
	if err := bt.Release(); err != nil {
		t.Fatal(err)
	}
	first := victim.Current()
	if err := syscall.Kill(first.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); victim.Current() == nil || victim.Current() == first; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the receiver's engine plugin was not restarted within 30s (restarts %d)", victim.Restarts())
		}
	}
	// The sender's connections to the dead process broke; a transfer that
	// raced the break may fail with ErrPeerLost, the next one dials again.
	var last error
	for i := range 3 {
		j := simple(t, a, b, uint64(10+i))
		bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
		if err != nil {
			t.Fatal(err)
		}
		last = wait(t, bt)
		if err := bt.Release(); err != nil {
			t.Fatal(err)
		}
		if last == nil {
			j.verify(t)
			break
		}
		t.Logf("transfer %d after the restart: %v", i, last)
	}
	if last != nil {
		t.Fatalf("the sender is not served after the receiver's engine plugin restarted: %v", last)
	}
	settled(t, a, b)
}
