package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bouncekv/bounce/controlplane/inproc"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/pipeline"
	gatherhost "github.com/bouncekv/bounce/stages/gather/host"
	scatterhost "github.com/bouncekv/bounce/stages/scatter/host"
	"github.com/bouncekv/bounce/transfer"
)

// The pull path's rules: two agents over the pair's engines (an in-process
// control network and the host stages, so the engine is the one subject),
// B the holder of host memory, A pulling it (pipeline.Agent.Pull).

// pullRules are the engine rules of the pull path.
func pullRules() []rule[*enginePeer] {
	return []rule[*enginePeer]{
		{"engine/pull-byte-exact", "A pulls from B (pipeline.Agent.Pull) fragmented descriptors and a block table over several chunks: every destination byte equals its source, every other byte of A's buffer is unchanged, and both batches are quiescent (skipped for memory other than host)", rulePullByteExact},
		{"engine/pull-refused", "a pull of B's memory registered for another peer, and of memory B never registered, is refused with a reason (pipeline.ErrRefused wrapping transfer.ErrForbidden), counted by B, and changes no byte of A's buffer (skipped for memory other than host)", rulePullRefused},
	}
}

// pullPair is two agents over A and B.
type pullPair struct {
	a, b    *pipeline.Agent
	closers []func()
}

// agents builds A's and B's agents; close shuts them down (the engines
// stay the fixture's).
func (e *enginePeer) agents(c *rc) (*pullPair, error) {
	if c.memory.Kind != transfer.Host {
		return nil, c.skipf("the pull rules run on host memory (the host stages); the fixture's is %s", c.memory.Kind)
	}
	net := inproc.NewNetwork()
	p := &pullPair{}
	cfg := pipeline.DefaultConfig()
	cfg.ArenaSize, cfg.Granularity, cfg.MaxChunk, cfg.MaxInflight = 8<<20, 64<<10, 1<<20, 4
	cfg.RequestTimeout, cfg.QuiesceTimeout, cfg.CostModel = c.cfg.OpTimeout, c.cfg.OpTimeout, false
	for i, eng := range []transfer.Engine{e.A, e.B} {
		name := eng.Name()
		reg := &mem.Registry{}
		g, err := gatherhost.New(gatherhost.Settings{Registry: reg})
		if err != nil {
			p.close()
			return nil, fmt.Errorf("setup: host gather: %w", err)
		}
		s, err := scatterhost.New(scatterhost.Settings{Registry: reg})
		if err != nil {
			g.Close()
			p.close()
			return nil, fmt.Errorf("setup: host scatter: %w", err)
		}
		ch, err := net.NewChannel(name, inproc.Options{})
		if err != nil {
			g.Close()
			s.Close()
			p.close()
			return nil, fmt.Errorf("setup: control channel: %w", err)
		}
		ag, err := pipeline.New(pipeline.Settings{Name: name, Engine: eng, Control: ch, Gatherer: g, Scatterer: s, Registry: reg, RequireBounce: true}, cfg)
		if err != nil {
			g.Close()
			s.Close()
			ch.Close()
			p.close()
			return nil, fmt.Errorf("setup: agent over %s: %w", []string{"A", "B"}[i], err)
		}
		p.closers = append(p.closers, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*c.cfg.OpTimeout)
			defer cancel()
			_ = ag.Shutdown(ctx)
			g.Close()
			s.Close()
			ch.Close()
		})
		if i == 0 {
			p.a = ag
		} else {
			p.b = ag
		}
	}
	return p, nil
}

func (p *pullPair) close() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
}

// introduce loads each agent's descriptor into the other.
func (p *pullPair) introduce(c *rc) error {
	c.step("loading the agents' descriptors into each other")
	for _, x := range [][2]*pipeline.Agent{{p.a, p.b}, {p.b, p.a}} {
		d, err := x[1].Descriptor()
		if err != nil {
			return fmt.Errorf("%s.Descriptor: %w", x[1].Name(), err)
		}
		if _, err := x[0].LoadPeer(d); err != nil {
			return fmt.Errorf("%s.LoadPeer(%s): %w", x[0].Name(), x[1].Name(), err)
		}
	}
	return nil
}

// await waits for b within OpTimeout and for its quiescence.
func (c *rc) await(b *pipeline.Batch, what string) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.OpTimeout)
	defer cancel()
	err := b.Wait(ctx)
	if ctx.Err() != nil && b.Status() == transfer.Pending {
		return fmt.Errorf("%s did not resolve within %v", what, c.cfg.OpTimeout)
	}
	select {
	case <-b.Quiescent():
	case <-time.After(c.cfg.OpTimeout):
		c.tainted("%s not quiescent", what)
		return fmt.Errorf("%s resolved (%v) but was not quiescent within %v", what, err, c.cfg.OpTimeout)
	}
	return err
}

func rulePullByteExact(c *rc, e *enginePeer) error {
	p, err := e.agents(c)
	if err != nil {
		return err
	}
	defer p.close()
	const n, size = 600, 2048 // 1.2 MiB a side: two chunks of at most 1 MiB
	src, err := c.buf(2 * n * size)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	dst, err := c.buf(2*n*size + 64)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	c.fill(src)
	c.fill(dst)
	before := bytes.Clone(dst)
	sd, dd := c.desc(src), c.desc(dst)
	if err := p.b.RegisterMemory(sd); err != nil {
		return fmt.Errorf("B.RegisterMemory(source): %w", err)
	}
	if err := p.a.RegisterMemory(dd); err != nil {
		return fmt.Errorf("A.RegisterMemory(destination): %w", err)
	}
	// The first half by descriptors, in a random order; the second as a
	// pool of blocks, ids shuffled, landing 32 bytes into A's half.
	var s, d []transfer.Desc
	perm := c.rng.Perm(n)
	for i := range n {
		s = append(s, transfer.Desc{Addr: sd.Addr + uint64(perm[i])*size, Len: size, Kind: transfer.Host})
		d = append(d, transfer.Desc{Addr: dd.Addr + uint64(i)*size, Len: size, Kind: transfer.Host})
	}
	hp := transfer.Pool{BlockLen: size, Stride: size, Blocks: n, Kind: transfer.Host, Regions: []uint64{sd.Addr + n*size}}
	ap := transfer.Pool{BlockLen: size, Stride: size, Blocks: n, Kind: transfer.Host, Regions: []uint64{dd.Addr + n*size + 32}}
	if err := p.b.RegisterPool("conformance-src", hp); err != nil {
		return fmt.Errorf("B.RegisterPool: %w", err)
	}
	if err := p.a.RegisterPool("conformance-dst", ap); err != nil {
		return fmt.Errorf("A.RegisterPool: %w", err)
	}
	if err := p.introduce(c); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	sids, dids := make([]uint32, n), make([]uint32, n)
	for i, v := range c.rng.Perm(n) {
		sids[i], dids[i] = uint32(v), uint32(i)
	}
	c.step("A pulls %d descriptors from B", n)
	b1, err := p.a.Pull(pipeline.PullRequest{Peer: p.b.Name(), Src: s, Dst: d})
	if err != nil {
		return fmt.Errorf("A.Pull(descriptors): %w", err)
	}
	c.step("A pulls %d blocks from B", n)
	b2, err := p.a.Pull(pipeline.PullRequest{Peer: p.b.Name(), Blocks: &pipeline.BlockRequest{SrcPool: "conformance-src", SrcIDs: sids, DstPool: "conformance-dst", DstIDs: dids}})
	if err != nil {
		return fmt.Errorf("A.Pull(blocks): %w", err)
	}
	for i, b := range []*pipeline.Batch{b1, b2} {
		if err := c.await(b, fmt.Sprintf("pull %d", i)); err != nil {
			return err
		}
	}
	want := bytes.Clone(before)
	for i := range n {
		copy(want[i*size:], src[perm[i]*size:(perm[i]+1)*size])
		off := n*size + 32 + i*size
		copy(want[off:], src[n*size+int(sids[i])*size:][:size])
	}
	if i := firstDiff(dst, want); i >= 0 {
		return fmt.Errorf("A's buffer byte %d is %#x after the pulls, want %#x (a piece misplaced, or a byte outside them written)", i, dst[i], want[i])
	}
	// B counts a pull served once A's last ACK reached it, after A's batch
	// resolved.
	for deadline := time.Now().Add(c.cfg.OpTimeout); p.b.Stats().PullsServed != 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("B served %d pulls within %v, want 2", p.b.Stats().PullsServed, c.cfg.OpTimeout)
		}
	}
	return nil
}

func rulePullRefused(c *rc, e *enginePeer) error {
	p, err := e.agents(c)
	if err != nil {
		return err
	}
	defer p.close()
	const size = 64 << 10
	other, err := c.buf(size)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	unreg, err := c.buf(size)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	dst, err := c.buf(size)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	c.fill(dst)
	before := bytes.Clone(dst)
	if err := p.b.RegisterMemoryFor(c.desc(other), "conformance-someone-else"); err != nil {
		return fmt.Errorf("B.RegisterMemoryFor: %w", err)
	}
	if err := p.a.RegisterMemory(c.desc(dst)); err != nil {
		return fmt.Errorf("A.RegisterMemory: %w", err)
	}
	if err := p.introduce(c); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	for i, src := range []transfer.Desc{c.desc(other), c.desc(unreg)} {
		what := []string{"memory B registered for another peer", "memory B never registered"}[i]
		c.step("A pulls %s", what)
		b, err := p.a.Pull(pipeline.PullRequest{Peer: p.b.Name(), Src: []transfer.Desc{src}, Dst: []transfer.Desc{c.desc(dst)}})
		if err != nil {
			return fmt.Errorf("A.Pull(%s): %w", what, err)
		}
		err = c.await(b, "the pull of "+what)
		switch {
		case err == nil:
			return fmt.Errorf("a pull of %s succeeded; B must refuse it", what)
		case !errors.Is(err, pipeline.ErrRefused) || !errors.Is(err, transfer.ErrForbidden):
			return fmt.Errorf("a pull of %s failed with %q, which does not wrap pipeline.ErrRefused and transfer.ErrForbidden", what, err)
		}
		if got := p.b.Stats().RefusedPulls; got != uint64(i+1) {
			return fmt.Errorf("B counted %d refused pulls after %d", got, i+1)
		}
	}
	if i := firstDiff(dst, before); i >= 0 {
		return fmt.Errorf("A's buffer byte %d changed (%#x, was %#x) though every pull was refused", i, dst[i], before[i])
	}
	return nil
}
