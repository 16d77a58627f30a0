package pipeline

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/mem"
	gatherhost "github.com/bouncekv/bounce/stages/gather/host"
	scatterhost "github.com/bouncekv/bounce/stages/scatter/host"
	"github.com/bouncekv/bounce/transfer"
)

// cudaLabelled stands in for the CUDA stages on a machine without a GPU:
// host stages over a shadow registry in which the "device" buffers are the
// host memory they really are, while the agent's registry (and the
// requests) call them CUDA memory — which the loopback engine, like tcp,
// refuses to touch.
type cudaLabelled struct {
	shadow map[string]*mem.Registry
}

type kindGatherer struct{ transfer.Gatherer }

func (kindGatherer) MemoryKinds() []transfer.MemKind {
	return []transfer.MemKind{transfer.Host, transfer.CUDA}
}

type kindScatterer struct{ transfer.Scatterer }

func (kindScatterer) MemoryKinds() []transfer.MemKind {
	return []transfer.MemKind{transfer.Host, transfer.CUDA}
}

func (c *cudaLabelled) stages(t testing.TB, name string, _ *mem.Registry, _ transfer.Engine, notify func()) (transfer.Gatherer, transfer.Scatterer, transfer.Writer) {
	reg := &mem.Registry{}
	c.shadow[name] = reg
	g, err := gatherhost.New(gatherhost.Settings{Registry: reg, Contexts: 8, Notify: notify})
	if err != nil {
		t.Fatal(err)
	}
	s, err := scatterhost.New(scatterhost.Settings{Registry: reg, Contexts: 8})
	if err != nil {
		t.Fatal(err)
	}
	return kindGatherer{g}, kindScatterer{s}, nil
}

// device registers size bytes of "device" memory on n: host memory the
// shadow registry knows as such, registered with the agent as CUDA.
func (c *cudaLabelled) device(t testing.TB, n *node, size uint64) ([]byte, transfer.Desc) {
	t.Helper()
	b, err := mem.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Free() })
	reg := c.shadow[n.Name()]
	if err := reg.Add(n.Arena()); err != nil {
		t.Fatal(err)
	}
	if err := reg.Add(b.Desc()); err != nil {
		t.Fatal(err)
	}
	d := b.Desc()
	d.Kind = transfer.CUDA
	if err := n.RegisterMemory(d); err != nil {
		t.Fatalf("register device KV with a host engine and CUDA stages: %v", err)
	}
	return b.Bytes(), d
}

func relabel(ds []transfer.Desc) []transfer.Desc {
	out := make([]transfer.Desc, len(ds))
	for i, d := range ds {
		d.Kind = transfer.CUDA
		out[i] = d
	}
	return out
}

// TestDeviceKVOverHostEngine: memory the engine cannot touch but the stages
// can (device KV over tcp with a pinned-host arena) registers with the
// stages alone, every request from or into it takes the bounce route —
// below the descriptor gates and with the cost model on — and lands byte
// for byte; the direct route asked for is refused naming why; an agent
// whose bounce path is off refuses the registration.
func TestDeviceKVOverHostEngine(t *testing.T) {
	w := newWorld(t)
	c := &cudaLabelled{shadow: map[string]*mem.Registry{}}
	w.stages = c.stages
	cfg := testConfig()
	cfg.CostModel = true
	a, b := w.node("a", cfg), w.node("b", cfg)
	connect(t, a, b)
	srcB, srcD := c.device(t, a, 1<<20)
	dstB, dstD := c.device(t, b, 1<<20)
	autoBounces(t, a, srcB, dstB, "engine cannot carry cuda memory", "the engine cannot carry cuda memory")
	if s := a.Stats(); s.Fallbacks != 0 || s.DirectSubmits != 0 {
		t.Fatalf("stats: %d fallbacks, %d direct submits, want 0 and 0", s.Fallbacks, s.DirectSubmits)
	}
	j := prepare(srcB, dstB, kvLayout{count: 8, size: 4096}, 9)
	_, err := a.Submit(Request{Peer: "b", Src: relabel(j.src), Dst: relabel(j.dst), Route: RouteDirect})
	if !errors.Is(err, transfer.ErrUnsupported) || !strings.Contains(err.Error(), "direct path cannot carry cuda memory") {
		t.Fatalf("direct route on device KV: err = %v, want ErrUnsupported naming the direct path and cuda memory", err)
	}
	settled(t, a, b)
	if err := a.DeregisterMemory(srcD); err != nil {
		t.Fatal(err)
	}
	if err := b.DeregisterMemory(dstD); err != nil {
		t.Fatal(err)
	}

	// A peer that cannot bounce leaves device KV no route: refused, naming
	// why bounce was not taken.
	nb := testConfig()
	nb.MaxChunk = 2 << 20 // a handshake mismatch with a
	c2 := w.node("c", nb)
	connect(t, a, c2)
	_, err = a.Submit(Request{Peer: "c", Src: relabel(j.src), Dst: relabel(j.dst)})
	if !errors.Is(err, transfer.ErrUnsupported) || !strings.Contains(err.Error(), "the bounce route was not taken") || !strings.Contains(err.Error(), "max chunk") {
		t.Fatalf("device KV to a peer that cannot bounce: err = %v, want ErrUnsupported naming why bounce was not taken", err)
	}

	off := testConfig()
	off.Enabled = false
	o := w.node("off", off)
	err = o.RegisterMemory(transfer.Desc{Addr: 1 << 40, Len: 4096, Kind: transfer.CUDA})
	if !errors.Is(err, transfer.ErrUnsupported) || !strings.Contains(err.Error(), "bounce path") {
		t.Fatalf("device KV with the bounce path off: err = %v, want ErrUnsupported naming the bounce path", err)
	}
}

// stagingPair makes w's engines stage device memory (stagingEngine) and
// returns two nodes a and b with route auto's cost model on.
func stagingPair(w *world) (a, b *node) {
	plain := w.engine
	w.engine = func(t testing.TB, name string, opt loopback.Options) transfer.Engine {
		return stagingEngine{plain(t, name, opt)}
	}
	cfg := testConfig()
	cfg.CostModel = true
	return w.node("a", cfg), w.node("b", cfg)
}

// stagingEngine is an engine that carries CUDA memory only by staging it
// per descriptor (transfer.StagedKinder, as tcp with Config.Device): the
// loopback engine under it is handed the "device" memory, which is host
// memory, relabelled as host.
type stagingEngine struct{ transfer.Engine }

func (stagingEngine) StagedMemoryKinds() []transfer.MemKind { return []transfer.MemKind{transfer.CUDA} }

func hostKind(d transfer.Desc) transfer.Desc { d.Kind = transfer.Host; return d }

func (e stagingEngine) RegisterMemory(d transfer.Desc) error {
	return e.Engine.RegisterMemory(hostKind(d))
}

func (e stagingEngine) DeregisterMemory(d transfer.Desc) error {
	return e.Engine.DeregisterMemory(hostKind(d))
}

func (e stagingEngine) PostWrite(peer string, ops []transfer.WriteOp) (transfer.Op, error) {
	out := make([]transfer.WriteOp, len(ops))
	for i, op := range ops {
		out[i] = transfer.WriteOp{Src: hostKind(op.Src), Dst: hostKind(op.Dst)}
	}
	return e.Engine.PostWrite(peer, out)
}

// TestDeviceKVStagedDirect: with an engine that carries device memory only
// by staging each descriptor (the per-descriptor baseline), device KV
// registers with the engine as well as the stages; route auto still takes
// bounce for it (above and below the descriptor gates, cost model on),
// saying why; the direct route asked for is carried, byte for byte.
func TestDeviceKVStagedDirect(t *testing.T) {
	w := newWorld(t)
	c := &cudaLabelled{shadow: map[string]*mem.Registry{}}
	w.stages = c.stages
	a, b := stagingPair(w)
	srcB, srcD := c.device(t, a, 1<<20)
	dstB, dstD := c.device(t, b, 1<<20)
	connect(t, a, b) // after registering: b's metadata names its device KV
	autoBounces(t, a, srcB, dstB, "only by staging each descriptor", "the engine only stages cuda memory")
	j := prepare(srcB, dstB, kvLayout{count: 64, size: 4096, fragmented: true}, 77)
	clear(dstB)
	bt, err := a.Submit(Request{Peer: "b", Src: relabel(j.src), Dst: relabel(j.dst), Route: RouteDirect})
	if err != nil {
		t.Fatalf("direct route on device KV over a staging engine: %v", err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	if bt.Route() != RouteDirect {
		t.Fatalf("route %v, want direct", bt.Route())
	}
	j.verify(t)
	if err := bt.Release(); err != nil {
		t.Fatal(err)
	}
	if s := a.Stats(); s.Fallbacks != 0 || s.DirectSubmits != 1 {
		t.Fatalf("stats: %d fallbacks, %d direct submits, want 0 and 1", s.Fallbacks, s.DirectSubmits)
	}
	settled(t, a, b)
	if err := a.DeregisterMemory(srcD); err != nil {
		t.Fatal(err)
	}
	if err := b.DeregisterMemory(dstD); err != nil {
		t.Fatal(err)
	}
}

// autoBounces submits fragmented device KV of 3 and of 256 descriptors
// (below and above MinDescriptors) from a's srcB to b's dstB on route
// auto: each lands byte-exact on the bounce route with a reason that
// contains reason (why says it in the failure).
func autoBounces(t *testing.T, a *node, srcB, dstB []byte, reason, why string) {
	t.Helper()
	for _, n := range []int{3, 256} {
		j := prepare(srcB, dstB, kvLayout{count: n, size: 4096, fragmented: true}, uint64(n))
		clear(dstB)
		bt, err := a.Submit(Request{Peer: "b", Src: relabel(j.src), Dst: relabel(j.dst)})
		if err != nil {
			t.Fatalf("%d descriptors: %v", n, err)
		}
		if err := wait(t, bt); err != nil {
			t.Fatalf("%d descriptors: %v", n, err)
		}
		if bt.Route() != RouteBounce || !strings.Contains(bt.RouteReason(), reason) {
			t.Fatalf("%d descriptors: route %v (%s), want bounce because %s", n, bt.Route(), bt.RouteReason(), why)
		}
		j.verify(t)
		if err := bt.Release(); err != nil {
			t.Fatal(err)
		}
	}
}

// pinnedGatherer is a device gather stage (kindGatherer) that reads host
// memory only when it is pinned for the device, as the cuda stage does: it
// answers Reachable from pinned.
type pinnedGatherer struct {
	kindGatherer
	pinned *mem.Registry
}

func (g pinnedGatherer) Reachable(d transfer.Desc) (transfer.Desc, error) {
	if d.Kind != transfer.Host {
		return d, nil
	}
	r, err := g.pinned.FindAny(d.Addr, d.Len)
	if err != nil {
		return transfer.Desc{}, fmt.Errorf("%v is host memory not pinned for the device: %w", d, transfer.ErrUnsupported)
	}
	return r, nil
}

// TestDeviceKVFromUnpinnedHost: pageable host sources to device
// destinations over an engine that stages device memory (tcp with the cuda
// stages): route auto does not pick the bounce route, whose first gather
// would fail (the device gather stage cannot read unpinned host memory),
// but the direct route, which moves the bytes exactly; once the sources
// are pinned, auto bounces again.
func TestDeviceKVFromUnpinnedHost(t *testing.T) {
	w := newWorld(t)
	c := &cudaLabelled{shadow: map[string]*mem.Registry{}}
	pinned := &mem.Registry{}
	w.stages = func(t testing.TB, name string, r *mem.Registry, e transfer.Engine, notify func()) (transfer.Gatherer, transfer.Scatterer, transfer.Writer) {
		g, s, wr := c.stages(t, name, r, e, notify)
		return pinnedGatherer{g.(kindGatherer), pinned}, s, wr
	}
	a, b := stagingPair(w)
	src, err := mem.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Free() })
	if err := a.RegisterMemory(src.Desc()); err != nil {
		t.Fatal(err)
	}
	for _, d := range []transfer.Desc{a.Arena(), src.Desc()} {
		if err := c.shadow["a"].Add(d); err != nil {
			t.Fatal(err)
		}
	}
	dstB, _ := c.device(t, b, 1<<20)
	connect(t, a, b)
	for _, tc := range []struct {
		pin    bool
		route  Route
		reason string
	}{
		{false, RouteDirect, "host memory not pinned for the device"},
		{true, RouteBounce, "only by staging each descriptor"},
	} {
		if tc.pin {
			if err := pinned.Add(src.Desc()); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range []int{3, 256} {
			j := prepare(src.Bytes(), dstB, kvLayout{count: n, size: 4096, fragmented: true}, uint64(n))
			clear(dstB)
			bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: relabel(j.dst)})
			if err != nil {
				t.Fatalf("pinned %v, %d descriptors: %v", tc.pin, n, err)
			}
			if err := wait(t, bt); err != nil {
				t.Fatalf("pinned %v, %d descriptors: %v (route %v: %s)", tc.pin, n, err, bt.Route(), bt.RouteReason())
			}
			if bt.Route() != tc.route || !strings.Contains(bt.RouteReason(), tc.reason) {
				t.Fatalf("pinned %v, %d descriptors: route %v (%s), want %v because %s", tc.pin, n, bt.Route(), bt.RouteReason(), tc.route, tc.reason)
			}
			j.verify(t)
			if err := bt.Release(); err != nil {
				t.Fatal(err)
			}
		}
	}
	settled(t, a, b)
}
