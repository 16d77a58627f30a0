package node

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/workload"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testConfig(name, engine, control string) config.Config {
	c := config.Default()
	c.Bounce.CostModel = false // route by the gates (see pipeline's testConfig)
	c.Agent.Name = name
	c.Engine.Kind = engine
	c.ControlPlane.Kind = control
	c.ControlPlane.BindAddress = "127.0.0.1"
	c.Bounce.ArenaSize = 16 * config.MiB
	c.Bounce.MaxChunk = 2 * config.MiB
	c.Bounce.MinDescriptors = 64
	c.Bounce.RequestTimeout = 10 * time.Second
	return c
}

func build(t testing.TB, cfg config.Config, f Factories) *Node {
	t.Helper()
	n, err := Build(cfg, f, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			t.Error(err)
		}
		if err := n.Close(ctx); err != nil {
			t.Errorf("second close: %v", err)
		}
	})
	return n
}

// moveAndVerify sends a fragmented KV-shaped workload from a to b.
func moveAndVerify(t *testing.T, a, b *Node, want pipeline.Route) {
	t.Helper()
	s := workload.Spec{DescSize: 4096, Count: 2048, Fragmented: true, Seed: 11}
	src, err := mem.Alloc(s.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Free()
	dst, err := mem.Alloc(s.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	if err := a.Agent.RegisterMemory(src.Desc()); err != nil {
		t.Fatal(err)
	}
	if err := b.Agent.RegisterMemory(dst.Desc()); err != nil {
		t.Fatal(err)
	}
	for _, pair := range [][2]*Node{{a, b}, {b, a}} {
		blob, err := pair[1].Agent.Descriptor()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pair[0].Agent.LoadPeer(blob); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Fill(src.Bytes()); err != nil {
		t.Fatal(err)
	}
	sd, dd := s.Descs(src.Desc(), dst.Desc())
	bt, err := a.Agent.Submit(pipeline.Request{Peer: b.Agent.Name(), Src: sd, Dst: dd})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := bt.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if bt.Route() != want {
		t.Fatalf("route %v (%s), want %v", bt.Route(), bt.RouteReason(), want)
	}
	if err := s.Verify(dst.Bytes()); err != nil {
		t.Fatal(err)
	}
	if err := bt.Release(); err != nil {
		t.Fatal(err)
	}
	if err := a.Agent.DeregisterMemory(src.Desc()); err != nil {
		t.Fatal(err)
	}
	if err := b.Agent.DeregisterMemory(dst.Desc()); err != nil {
		t.Fatal(err)
	}
}

// TestSwapByConfig builds the same transfer over every engine and control
// plane pairing by changing configuration only.
func TestSwapByConfig(t *testing.T) {
	for _, tc := range []struct{ engine, control string }{
		{"loopback", "inproc"},
		{"loopback", "nixlnotif"},
		{"tcp", "zmq"},
		{"tcp", "nixlnotif"},
		{"ucx", "zmq"},
	} {
		t.Run(tc.engine+"+"+tc.control, func(t *testing.T) {
			f := Builtin()
			a := build(t, testConfig("a", tc.engine, tc.control), f)
			b := build(t, testConfig("b", tc.engine, tc.control), f)
			moveAndVerify(t, a, b, pipeline.RouteBounce)
		})
	}
}

// TestMismatchedControlPlanesGoDirect: peers on different control planes
// fail the handshake and still move the bytes on the direct path.
func TestMismatchedControlPlanesGoDirect(t *testing.T) {
	f := Builtin()
	a := build(t, testConfig("a", "tcp", "zmq"), f)
	b := build(t, testConfig("b", "tcp", "nixlnotif"), f)
	moveAndVerify(t, a, b, pipeline.RouteDirect)
	_, reason, _ := a.Agent.PeerRoute("b")
	if !strings.Contains(reason, `control plane "zmq" here vs "nixlnotif" on b`) {
		t.Fatalf("reason %q does not name the control kind", reason)
	}
}

// TestBounceBuildFailureDegrades: a control plane that cannot start leaves
// the node up on the direct path.
func TestBounceBuildFailureDegrades(t *testing.T) {
	f := Builtin()
	cfg := testConfig("a", "tcp", "zmq")
	cfg.ControlPlane.BindAddress = ""
	cfg.ControlPlane.Interface = "no-such-nic0"
	a := build(t, cfg, f)
	if on, why := a.Agent.BounceEnabled(); on || why == "" {
		t.Fatalf("BounceEnabled = %v, %q", on, why)
	}
	b := build(t, testConfig("b", "tcp", "zmq"), f)
	moveAndVerify(t, a, b, pipeline.RouteDirect)
}

func TestBuildErrors(t *testing.T) {
	f := Builtin()
	delete(f.Engines, "ucx")
	cfg := testConfig("a", "ucx", "zmq")
	if _, err := Build(cfg, f, nil); err == nil || !strings.Contains(err.Error(), `engine.kind "ucx"`) {
		t.Fatalf("missing engine factory: err = %v", err)
	}
	cfg = testConfig("a", "tcp", "zmq")
	cfg.Bounce.MaxInflight = 0
	if _, err := Build(cfg, f, nil); err == nil || !strings.Contains(err.Error(), "bounce.max_inflight") {
		t.Fatalf("invalid config: err = %v", err)
	}
	cfg = testConfig("a", "tcp", "zmq")
	cfg.Engine.Options = map[string]string{"colour": "blue"}
	if _, err := Build(cfg, f, nil); err == nil || !strings.Contains(err.Error(), "engine.options.colour") {
		t.Fatalf("unknown engine option: err = %v", err)
	}
	if _, err := MakeFactories([]EngineFactory{TCPFactory{}, TCPFactory{}}, nil, nil, nil); err == nil {
		t.Fatal("duplicate factories accepted")
	}
}

// TestBuildRefusesArenaBeyondMemory asks for an arena larger than this
// machine's available memory: Build fails naming bounce.arena_size before
// anything is mapped (a populated arena that large would be OOM-killed).
func TestBuildRefusesArenaBeyondMemory(t *testing.T) {
	budget, err := mem.ReadBudget(os.DirFS("/"))
	if err != nil || !budget.Known() {
		t.Skip("no memory budget readable here")
	}
	cfg := testConfig("a", "tcp", "zmq")
	// The arena's usable capacity is a power of two: take the first one
	// above the budget.
	size := config.Size(1 << 20)
	for uint64(size) <= budget.Bytes {
		size *= 2
	}
	cfg.Bounce.ArenaSize = size
	_, err = Build(cfg, Builtin(), nil)
	var ke *config.KeyError
	if !errors.As(err, &ke) || ke.Key != "bounce.arena_size" || !strings.Contains(err.Error(), "does not fit in memory") {
		t.Fatalf("Build with a %v arena: %v, want a bounce.arena_size error", cfg.Bounce.ArenaSize, err)
	}
}

// loopbackInterface is the name of this host's loopback interface.
func loopbackInterface(t *testing.T) string {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback != 0 {
			return i.Name
		}
	}
	t.Skip("no loopback interface")
	return ""
}

// TestLoopbackWarningNamesTheAddress: with control_plane.interface a
// routable interface of this host, the warning names its address to
// listen on, not "this host's address on" it.
func TestLoopbackWarningNamesTheAddress(t *testing.T) {
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback != 0 || i.Flags&net.FlagUp == 0 {
			continue
		}
		a := interfaceAddr(&i)
		if a == "" {
			continue
		}
		cfg := config.Default()
		cfg.ControlPlane.Interface = i.Name
		if why := loopbackMismatch(cfg); !strings.Contains(why, "set engine.listen to "+net.JoinHostPort(a, "<port>")) {
			t.Fatalf("interface %s (%s): %q", i.Name, a, why)
		}
		return
	}
	t.Skip("no routable interface with an address here")
}

func TestLoopbackEngineWithRoutableControlPlaneWarns(t *testing.T) {
	cfg := config.Default()
	cfg.ControlPlane.Interface = "eth0"
	if why := loopbackMismatch(cfg); !strings.Contains(why, "engine.listen 127.0.0.1:0 is a loopback address while control_plane.interface eth0") {
		t.Fatalf("got %q", why)
	}
	cfg.ControlPlane.Interface, cfg.ControlPlane.BindAddress = "", "10.0.0.2"
	if why := loopbackMismatch(cfg); !strings.Contains(why, "set engine.listen to 10.0.0.2:<port>") {
		t.Fatalf("got %q", why)
	}
	for _, c := range []func(*config.Config){
		func(c *config.Config) { c.ControlPlane.BindAddress = "127.0.0.1" },
		func(c *config.Config) { c.Engine.Listen = "10.0.0.2:0" },
		func(c *config.Config) {},
		// The loopback interface is loopback too: nothing to warn about.
		func(c *config.Config) {
			c.ControlPlane.Interface, c.Engine.Listen = loopbackInterface(t), "127.0.0.1:7000"
		},
	} {
		cfg := config.Default()
		c(&cfg)
		if why := loopbackMismatch(cfg); why != "" {
			t.Fatalf("%+v: unexpected warning %q", cfg.ControlPlane, why)
		}
	}
}

// TestCheckKindsRejectsWhatThisBuildLacks: a kind the schema accepts but
// the factory table lacks is a configuration error naming the key, the kind
// and why; a stage of a disabled bounce path is not checked.
func TestCheckKindsRejectsWhatThisBuildLacks(t *testing.T) {
	f := Builtin()
	cfg := config.Default()
	if err := CheckKinds(cfg, f); err != nil {
		t.Fatal(err)
	}
	cfg.Engine.Kind = "nixl"
	if err := CheckKinds(cfg, f); err == nil || !strings.Contains(err.Error(), `engine.kind "nixl" is unavailable: built without NIXL`) {
		t.Fatalf("nixl: %v", err)
	}
	if _, err := Build(cfg, f, nil); err == nil || !strings.Contains(err.Error(), "built without NIXL") {
		t.Fatalf("Build with nixl: %v", err)
	}
	cfg = config.Default()
	cfg.Stages.Gather.Kind = "cuda"
	f.Gatherers = maps.Clone(f.Gatherers)
	delete(f.Gatherers, "cuda") // a build without the CUDA stages
	if err := CheckKinds(cfg, f); err == nil || !strings.Contains(err.Error(), `stages.gather "cuda" is unavailable`) {
		t.Fatalf("cuda: %v", err)
	}
	cfg.Bounce.Enabled = false
	if err := CheckKinds(cfg, f); err != nil {
		t.Fatalf("cuda with bounce off: %v", err)
	}
	var nixl *Component
	for _, c := range Components(f) {
		if c.Kind == "nixl" && c.Role == "engine" {
			nixl = &c
		}
	}
	if nixl == nil || nixl.Available || !strings.Contains(nixl.Why, "-tags nixl") {
		t.Fatalf("components: nixl = %+v", nixl)
	}
}

// TestOneSourceOfDefaults: the configuration's bounce and security
// defaults map to exactly the runtime's defaults.
func TestOneSourceOfDefaults(t *testing.T) {
	d := config.Default()
	if got, want := PipelineConfig(d.Bounce, d.Security), pipeline.DefaultConfig(); got != want {
		t.Fatalf("config defaults map to\n%+v\nthe runtime's are\n%+v", got, want)
	}
}

// TestDeviceArenasTakeTheirWindow: W is bounce.device_max_inflight on a
// device arena and bounce.max_inflight on every other.
func TestDeviceArenasTakeTheirWindow(t *testing.T) {
	d := config.Default()
	d.Bounce.MaxInflight, d.Bounce.DeviceMaxInflight = 5, 40
	for mem, want := range map[string]int{"device": 40, "pinned-host": 5, "host": 5, "": 5} {
		if got := runtimeConfig(d, mem).MaxInflight; got != want {
			t.Errorf("arena memory %q: W %d, want %d", mem, got, want)
		}
	}
	if got := runtimeConfig(config.Default(), "device").MaxInflight; got != config.DefaultDeviceMaxInflight {
		t.Errorf("default W on device arenas %d, want %d", got, config.DefaultDeviceMaxInflight)
	}
}

// TestReadmeShowsTheExample: the README's embedding code is the Example's.
func TestReadmeShowsTheExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	ex, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	code := string(ex[bytes.Index(ex, []byte("func embed() error {")):])
	if !strings.Contains(string(readme), "```go\n"+code+"```") {
		t.Fatal("README.md's embedding code differs from node/example_test.go's embed (copy it over)")
	}
}

// TestComponentsSayWhatRunsHere: without a loadable CUDA driver the CUDA
// kinds this build has are listed as not runnable on this machine, with
// the driver's error; the others are not.
func TestComponentsSayWhatRunsHere(t *testing.T) {
	f := Builtin()
	f.CUDA = &cuda.Lib{Path: "libcuda-missing.so.1"}
	seen := 0
	for _, c := range Components(f) {
		cudaKind := c.Kind == "cudacopy" || c.Kind == "cuda"
		switch {
		case cudaKind && c.Available:
			seen++
			if !strings.Contains(c.NotHere, "libcuda-missing.so.1") {
				t.Errorf("%s %s: NotHere %q, want the driver's error", c.Role, c.Kind, c.NotHere)
			}
		case !cudaKind && c.NotHere != "":
			t.Errorf("%s %s: NotHere %q", c.Role, c.Kind, c.NotHere)
		}
	}
	if seen != 3 {
		t.Fatalf("%d CUDA kinds in the build, want cudacopy and the cuda gather and scatter stages", seen)
	}
}
