package plugins

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/bouncekv/bounce/mem"
	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	"github.com/bouncekv/bounce/transfer"
)

// stageRPC is the client of the Gather or the Scatter service: the two
// have the same calls.
type stageRPC interface {
	Open(ctx context.Context, in *pb.OpenRequest, opts ...grpc.CallOption) (*pb.OpenReply, error)
	Share(ctx context.Context, in *pb.RegisterRequest, opts ...grpc.CallOption) (*pb.Reply, error)
	Unshare(ctx context.Context, in *pb.DescRequest, opts ...grpc.CallOption) (*pb.Reply, error)
	Copy(ctx context.Context, in *pb.StageRequest, opts ...grpc.CallOption) (*pb.HandleReply, error)
	Poll(ctx context.Context, in *pb.HandleRequest, opts ...grpc.CallOption) (*pb.PollReply, error)
	Wait(ctx context.Context, in *pb.WaitRequest, opts ...grpc.CallOption) (*pb.PollReply, error)
	Release(ctx context.Context, in *pb.HandleRequest, opts ...grpc.CallOption) (*pb.Reply, error)
	Close(ctx context.Context, in *pb.Empty, opts ...grpc.CallOption) (*pb.Reply, error)
}

// Gatherer opens the plugin's gather stage for agent name with opts. reg
// is the host memory the stage may use (the agent's registry): before a
// Gather names a registered range for the first time, the host shares it
// with the plugin, which maps it at the same address. The stage owns the
// Client: closing it ends the plugin process.
func (c *Client) Gatherer(name string, opts map[string]string, reg *mem.Registry) (transfer.Gatherer, error) {
	rpc, _, err := open[pb.GatherClient](c, KindGather, "gather stage", name, opts)
	if err != nil {
		return nil, err
	}
	return &remoteGatherer{newRemoteStage(c, rpc, reg, "gather stage")}, nil
}

// Scatterer opens the plugin's scatter stage, like Gatherer.
func (c *Client) Scatterer(name string, opts map[string]string, reg *mem.Registry) (transfer.Scatterer, error) {
	rpc, _, err := open[pb.ScatterClient](c, KindScatter, "scatter stage", name, opts)
	if err != nil {
		return nil, err
	}
	return &remoteScatterer{newRemoteStage(c, rpc, reg, "scatter stage")}, nil
}

type remoteGatherer struct{ *remoteStage }

// Gather copies the runs into region in the plugin: one call per chunk.
func (g *remoteGatherer) Gather(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	return g.copy("gather", region, runs)
}

type remoteScatterer struct{ *remoteStage }

// Scatter copies region out to the runs in the plugin: one call per chunk.
func (s *remoteScatterer) Scatter(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	return s.copy("scatter", region, runs)
}

// remoteStage is the host side of a stage plugin. It shares registered
// ranges with the plugin lazily, the first time a copy names them, and
// pins them (mem.Registry.Pin) while a copy runs, so DeregisterMemory
// refuses them as it does for the in-process stages.
type remoteStage struct {
	c    *Client
	rpc  stageRPC
	reg  *mem.Registry
	noun string
	hs   handles

	mu     sync.Mutex
	shared map[transfer.Desc]uint64 // range -> registration number shared
}

func newRemoteStage(c *Client, rpc stageRPC, reg *mem.Registry, noun string) *remoteStage {
	return &remoteStage{c: c, rpc: rpc, reg: reg, noun: noun, shared: map[transfer.Desc]uint64{}}
}

// used returns the distinct registered ranges region and runs touch.
func (s *remoteStage) used(region transfer.Desc, runs []transfer.Run) (map[transfer.Desc]uint64, error) {
	out := map[transfer.Desc]uint64{}
	add := func(addr, n uint64) error {
		if n == 0 {
			return nil
		}
		d, gen, err := s.reg.Lookup(addr, n)
		if err != nil {
			return err
		}
		out[d] = gen
		return nil
	}
	if err := add(region.Addr, region.Len); err != nil {
		return nil, fmt.Errorf("region %v: %w", region, err)
	}
	for i, r := range runs {
		if r.Count == 0 || r.Len == 0 {
			continue
		}
		start, end, ok := r.AddrSpan()
		if !ok {
			return nil, fmt.Errorf("run %d: address span overflows: %w", i, transfer.ErrOutOfBounds)
		}
		if err := add(start, end-start); err == nil {
			continue
		}
		// The run's span crosses ranges: each copy must lie in one.
		for k := uint64(0); k < r.Count; k++ {
			if err := add(r.Addr+k*r.AddrStride, r.Len); err != nil {
				return nil, fmt.Errorf("run %d copy %d: %w", i, k, err)
			}
		}
	}
	return out, nil
}

// share makes every range of used visible to the plugin. Before sharing a
// new range it drops the shares of ranges no longer registered (or
// registered anew), so a stale mapping never shadows new memory.
func (s *remoteStage) share(used map[transfer.Desc]uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	pruned := false
	for d, gen := range used {
		if s.shared[d] == gen {
			continue
		}
		if !pruned {
			s.prune()
			pruned = true
		}
		sh, err := shareOf(d)
		if err != nil {
			return err
		}
		err = call(s.c, s.noun, fmt.Sprintf("share %v", d), func(cx context.Context) (*pb.Reply, error) {
			return s.rpc.Share(cx, &pb.RegisterRequest{Desc: toProtoDesc(d), Share: sh})
		})
		if err != nil {
			return err
		}
		s.shared[d] = gen
	}
	return nil
}

// prune unshares what is no longer registered as it was shared. Unpinned
// by definition: a range in use cannot be deregistered.
func (s *remoteStage) prune() {
	for d, gen := range s.shared {
		if cur, g, err := s.reg.Lookup(d.Addr, d.Len); err == nil && cur == d && g == gen {
			continue
		}
		delete(s.shared, d)
		_ = call(s.c, s.noun, fmt.Sprintf("unshare %v", d), func(cx context.Context) (*pb.Reply, error) {
			return s.rpc.Unshare(cx, &pb.DescRequest{Desc: toProtoDesc(d)})
		})
	}
}

func (s *remoteStage) copy(verb string, region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	what := fmt.Sprintf("%s %d run(s) of %v", verb, len(runs), region)
	if s.c.closed() {
		return nil, fmt.Errorf("plugin %s: %s: %s closed: %w", s.c.name, what, s.noun, transfer.ErrClosed)
	}
	if region.Kind != transfer.Host {
		return nil, fmt.Errorf("plugin %s: %s: not yet: device memory cannot cross to a plugin (region %v): %w", s.c.name, what, region, transfer.ErrUnsupported)
	}
	used, err := s.used(region, runs)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %s: %w", s.c.name, what, err)
	}
	starts := make([]uint64, 0, len(used))
	for d := range used {
		starts = append(starts, d.Addr)
	}
	if err := s.reg.Pin(starts); err != nil {
		return nil, fmt.Errorf("plugin %s: %s: %w", s.c.name, what, err)
	}
	unpin := func() { s.reg.Unpin(starts) }
	if err := s.share(used); err != nil {
		unpin()
		return nil, err
	}
	var rep *pb.HandleReply
	err = call(s.c, s.noun, what, func(cx context.Context) (_ *pb.HandleReply, err error) {
		rep, err = s.rpc.Copy(cx, &pb.StageRequest{Region: toProtoDesc(region), Runs: toProtoRuns(runs)})
		return rep, err
	})
	if err != nil {
		unpin()
		return nil, err
	}
	// A malformed handle keeps the pins: the plugin may run a copy the
	// host cannot poll.
	return started(s.c, &s.hs, s.rpc, what, rep.GetHandle(), unpin)
}

// Close closes the stage in the plugin and ends the plugin process.
func (s *remoteStage) Close() error { return closeRemote(s.c, s.noun, s.rpc.Close) }

// stageImpl is a gather or scatter stage seen as one copy direction.
type stageImpl interface {
	copy(region transfer.Desc, runs []transfer.Run) (transfer.Op, error)
	Close() error
}

type gatherImpl struct{ transfer.Gatherer }

func (g gatherImpl) copy(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	return g.Gather(region, runs)
}

type scatterImpl struct{ transfer.Scatterer }

func (s scatterImpl) copy(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	return s.Scatter(region, runs)
}

// stageServer is the plugin side of the Gather or Scatter service. Shared
// ranges are mapped at the host's addresses and added to reg, the registry
// the stage validates against.
type stageServer struct {
	kind string
	maps *mapper
	open func(name string, opts map[string]string, reg *mem.Registry) (stageImpl, error)
	reg  mem.Registry

	mu     sync.Mutex
	impl   stageImpl
	closed bool
	shares map[transfer.Desc]*pb.Share
	ops    opTable
}

func newStageServer(kind string, m *mapper, open func(string, map[string]string, *mem.Registry) (stageImpl, error)) *stageServer {
	return &stageServer{kind: kind, maps: m, open: open, shares: map[transfer.Desc]*pb.Share{}}
}

func (s *stageServer) stage() (stageImpl, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.impl == nil || s.closed {
		return nil, fmt.Errorf("plugin: %s stage not open: %w", s.kind, transfer.ErrClosed)
	}
	return s.impl, nil
}

func (s *stageServer) Open(_ context.Context, r *pb.OpenRequest) (*pb.OpenReply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.impl != nil || s.closed {
		return &pb.OpenReply{Error: toProtoError(fmt.Errorf("plugin: this process already opened its %s stage", s.kind))}, nil
	}
	impl, err := s.open(string(r.GetName()), r.GetOptions(), &s.reg)
	if err != nil {
		return &pb.OpenReply{Error: toProtoError(err)}, nil
	}
	s.impl = impl
	return &pb.OpenReply{Name: []byte(s.kind)}, nil
}

func (s *stageServer) Share(_ context.Context, r *pb.RegisterRequest) (*pb.Reply, error) {
	if _, err := s.stage(); err != nil {
		return reply(err), nil
	}
	d := fromProtoDesc(r.GetDesc())
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.shares[d]; dup {
		return reply(fmt.Errorf("plugin: share %v: already shared", d)), nil
	}
	if err := s.maps.Map(d, r.GetShare()); err != nil {
		return reply(err), nil
	}
	if err := s.reg.Add(d); err != nil {
		s.maps.Unmap(d, r.GetShare())
		return reply(fmt.Errorf("plugin: share %v: %w", d, err)), nil
	}
	s.shares[d] = r.GetShare()
	return &pb.Reply{}, nil
}

func (s *stageServer) Unshare(_ context.Context, r *pb.DescRequest) (*pb.Reply, error) {
	d := fromProtoDesc(r.GetDesc())
	s.mu.Lock()
	defer s.mu.Unlock()
	sh, ok := s.shares[d]
	if !ok {
		return reply(fmt.Errorf("plugin: unshare %v: %w", d, transfer.ErrNotRegistered)), nil
	}
	if err := s.reg.Remove(d); err != nil {
		return reply(fmt.Errorf("plugin: unshare %v: %w", d, err)), nil
	}
	delete(s.shares, d)
	s.maps.Unmap(d, sh)
	return &pb.Reply{}, nil
}

func (s *stageServer) Copy(_ context.Context, r *pb.StageRequest) (*pb.HandleReply, error) {
	impl, err := s.stage()
	if err != nil {
		return &pb.HandleReply{Error: toProtoError(err)}, nil
	}
	return s.ops.posted(impl.copy(fromProtoDesc(r.GetRegion()), fromProtoRuns(r.GetRuns()))), nil
}

func (s *stageServer) Poll(_ context.Context, r *pb.HandleRequest) (*pb.PollReply, error) {
	return s.ops.poll(r.GetHandle()), nil
}

func (s *stageServer) Wait(cx context.Context, r *pb.WaitRequest) (*pb.PollReply, error) {
	return s.ops.wait(cx, r.GetHandle(), time.Duration(r.GetTimeoutNs())), nil
}

func (s *stageServer) Release(_ context.Context, r *pb.HandleRequest) (*pb.Reply, error) {
	return s.ops.release(r.GetHandle()), nil
}

func (s *stageServer) Close(context.Context, *pb.Empty) (*pb.Reply, error) {
	s.mu.Lock()
	impl, closed := s.impl, s.closed
	s.closed = true
	shares := s.shares
	s.shares = map[transfer.Desc]*pb.Share{}
	s.mu.Unlock()
	if impl == nil || closed {
		return &pb.Reply{}, nil
	}
	err := impl.Close()
	for d, sh := range shares {
		if rerr := s.reg.Remove(d); rerr != nil && !errors.Is(rerr, transfer.ErrNotRegistered) {
			// Still pinned by a copy the stage did not end: leave it mapped.
			continue
		}
		s.maps.Unmap(d, sh)
	}
	return reply(err), nil
}
