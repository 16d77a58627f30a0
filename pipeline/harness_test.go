package pipeline

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/bouncekv/bounce/controlplane/inproc"
	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/mem"
	gatherhost "github.com/bouncekv/bounce/stages/gather/host"
	"github.com/bouncekv/bounce/stages/hostcopy"
	scatterhost "github.com/bouncekv/bounce/stages/scatter/host"
	"github.com/bouncekv/bounce/transfer"
	"go.uber.org/goleak"
)

// world builds agents that share one in-process engine fabric and one
// control network. Other engines and control planes plug in through engine
// and ctrl.
type world struct {
	t      testing.TB
	fab    *loopback.Fabric
	net    *inproc.Network
	engine func(t testing.TB, name string, opt loopback.Options) transfer.Engine
	ctrl   func(t testing.TB, name string, eng transfer.Engine) transfer.ControlChannel
	// bufs are the nodes' buffers (node.buffer), freed after every node closed.
	bufs []*mem.Buffer
	// stages, if set, replaces the host stages: it returns a node's gather
	// and scatter stages and its writer (nil: the engine's bulk write).
	// notify wakes the node's reactor.
	stages func(t testing.TB, name string, reg *mem.Registry, eng transfer.Engine, notify func()) (transfer.Gatherer, transfer.Scatterer, transfer.Writer)
}

// newWorld also checks, when the test ends and every node is closed, that
// the test leaked no goroutine.
func newWorld(t testing.TB) *world {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		if !t.Failed() {
			goleak.VerifyNone(t, ignore)
		}
	})
	w := &world{t: t, fab: loopback.NewFabric(), net: inproc.NewNetwork()}
	// Buffers are freed once every node of the world closed (cleanups run
	// last-registered first, and the nodes register theirs later): a test
	// that gives up on a request (Abandon with a short timeout) may end
	// while a gather still reads its source or a write lands in its
	// destination.
	t.Cleanup(func() {
		for _, b := range w.bufs {
			_ = b.Free()
		}
	})
	w.engine = func(t testing.TB, name string, opt loopback.Options) transfer.Engine {
		eng, err := w.fab.NewEngine(name, opt)
		if err != nil {
			t.Fatal(err)
		}
		return eng
	}
	w.ctrl = func(t testing.TB, name string, _ transfer.Engine) transfer.ControlChannel {
		ch, err := w.net.NewChannel(name, inproc.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}
	return w
}

// node is one agent with its own engine, control channel and host stages.
type node struct {
	*Agent
	eng     transfer.Engine
	ctrl    transfer.ControlChannel
	reg     *mem.Registry
	gather  transfer.Gatherer
	scatter transfer.Scatterer
	writer  transfer.Writer
	w       *world
}

// nodeOpt adjusts a node's settings (wrapping a component with a fault
// injector, say) before its agent is built.
type nodeOpt func(*Settings)

func testConfig() Config {
	c := DefaultConfig()
	// The gates alone route: these tests drive the bounce machinery, and
	// route auto's cost model (autoroute_test.go) would send many of their
	// small in-process transfers direct.
	c.CostModel = false
	c.ArenaSize = 8 << 20
	c.Granularity = 64 << 10
	c.MaxChunk = 1 << 20
	c.MaxInflight = 4
	c.MinDescriptors = 64
	c.RequestTimeout = 5 * time.Second
	c.QuiesceTimeout = time.Second
	c.Quarantine = 250 * time.Millisecond // settled() after a peer loss waits for it
	return c
}

func (w *world) node(name string, cfg Config, opts ...nodeOpt) *node {
	t := w.t
	t.Helper()
	s := Settings{Name: name, Registry: &mem.Registry{}}
	wake := make(chan struct{}, 1)
	eng := w.engine(t, name, loopback.Options{OnComplete: hostcopy.Signal(wake)})
	g, err := gatherhost.New(gatherhost.Settings{Registry: s.Registry, Contexts: 8, Notify: hostcopy.Signal(wake)})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := scatterhost.New(scatterhost.Settings{Registry: s.Registry, Contexts: 8})
	if err != nil {
		t.Fatal(err)
	}
	s.Engine, s.Gatherer, s.Scatterer, s.Wake = eng, g, sc, wake
	if w.stages != nil {
		g.Close()
		sc.Close()
		s.Gatherer, s.Scatterer, s.Writer = w.stages(t, name, s.Registry, eng, hostcopy.Signal(wake))
	}
	s.Control = w.ctrl(t, name, eng)
	for _, o := range opts {
		o(&s)
	}
	a, err := New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{Agent: a, eng: eng, ctrl: s.Control, reg: s.Registry, gather: s.Gatherer, scatter: s.Scatterer, writer: s.Writer, w: w}
	t.Cleanup(func() { n.close(t) })
	return n
}

func (n *node) close(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		t.Errorf("%s: shutdown: %v", n.Name(), err)
	}
	n.gather.Close()
	n.scatter.Close()
	if c, ok := n.writer.(interface{ Close() error }); ok {
		c.Close()
	}
	if n.ctrl != nil {
		n.ctrl.Close()
	}
	n.eng.Close()
}

// connect loads each node's descriptor into the other.
func connect(t testing.TB, nodes ...*node) {
	t.Helper()
	for _, a := range nodes {
		for _, b := range nodes {
			if a == b {
				continue
			}
			blob, err := b.Descriptor()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.LoadPeer(blob); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// buffer allocates registered host memory on n.
func (n *node) buffer(t testing.TB, size uint64) []byte {
	t.Helper()
	b, err := mem.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.RegisterMemory(b.Desc()); err != nil {
		t.Fatal(err)
	}
	n.w.bufs = append(n.w.bufs, b)
	return b.Bytes()
}

// kvLayout describes a KV-shaped transfer: count blocks of size bytes, at
// shuffled (fragmented) or in-order block slots of src and dst buffers.
type kvLayout struct {
	count      int
	size       uint64
	fragmented bool
}

// job is one prepared transfer and its expected bytes.
type job struct {
	src, dst   []transfer.Desc
	srcB, dstB []byte
	seed       uint64
}

// prepare fills src slots with a seed-distinct pattern and returns the
// descriptors. dstOff lets several jobs share one destination buffer.
func prepare(srcB, dstB []byte, l kvLayout, seed uint64) job {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	slots := l.count
	srcSlots := rng.Perm(slots)
	dstSlots := rng.Perm(slots)
	if !l.fragmented {
		for i := range srcSlots {
			srcSlots[i], dstSlots[i] = i, i
		}
	}
	srcBase, dstBase := mem.DescOf(srcB), mem.DescOf(dstB)
	j := job{srcB: srcB, dstB: dstB, seed: seed}
	for i := 0; i < l.count; i++ {
		so := uint64(srcSlots[i]) * l.size
		do := uint64(dstSlots[i]) * l.size
		fill(srcB[so:so+l.size], seed, uint64(i))
		j.src = append(j.src, transfer.Desc{Addr: srcBase.Addr + so, Len: l.size, Kind: transfer.Host})
		j.dst = append(j.dst, transfer.Desc{Addr: dstBase.Addr + do, Len: l.size, Kind: transfer.Host})
	}
	return j
}

// fill writes a pattern unique to (seed, block) so cross-talk shows.
func fill(b []byte, seed, block uint64) {
	x := seed*0x100000001b3 ^ block*0x9e3779b97f4a7c15 ^ 0xcbf29ce484222325
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(w[:], x)
		copy(b[i:], w[:])
	}
}

// verify checks every destination block equals its source block.
func (j job) verify(t testing.TB) {
	t.Helper()
	if err := j.check(); err != nil {
		t.Fatal(err)
	}
}

func (j job) check() error {
	sb, db := mem.DescOf(j.srcB), mem.DescOf(j.dstB)
	for i := range j.src {
		s := j.srcB[j.src[i].Addr-sb.Addr:][:j.src[i].Len]
		d := j.dstB[j.dst[i].Addr-db.Addr:][:j.dst[i].Len]
		for k := range s {
			if s[k] != d[k] {
				return fmt.Errorf("seed %d block %d byte %d: got %#x want %#x", j.seed, i, k, d[k], s[k])
			}
		}
	}
	return nil
}

func wait(t testing.TB, b *Batch) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := b.Wait(ctx)
	if ctx.Err() != nil {
		t.Fatalf("batch %d did not resolve within 30s: the pipeline hung", b.ID())
	}
	return err
}

// conserve asserts the arena conservation invariant on every node.
func conserve(t testing.TB, nodes ...*node) {
	t.Helper()
	for _, n := range nodes {
		if err := n.CheckConservation(); err != nil {
			t.Errorf("%s: conservation: %v", n.Name(), err)
		}
	}
}

// settled waits until every node's arena is fully free again and checks
// conservation: nothing leaked, nothing left held.
func settled(t testing.TB, nodes ...*node) {
	t.Helper()
	for _, n := range nodes {
		deadline := time.Now().Add(10 * time.Second)
		for {
			st := n.ArenaStats()
			if st.FreeBytes == st.Capacity && st.Flows == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: arena never settled: %+v", n.Name(), st)
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	conserve(t, nodes...)
}
