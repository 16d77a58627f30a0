package plugins

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/controlplane/inproc"
	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/mem"
	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	gatherhost "github.com/bouncekv/bounce/stages/gather/host"
	scatterhost "github.com/bouncekv/bounce/stages/scatter/host"
	"github.com/bouncekv/bounce/stages/write"
	"github.com/bouncekv/bounce/transfer"
)

// TestMain checks for leaked goroutines. No ignores are needed: once the
// go-plugin client is closed (which also stops the in-process server
// through go-plugin's controller service), neither go-plugin nor gRPC leaves
// a goroutine behind, and the suite's own per-rule leak check passes too.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hop serves ps in-process through go-plugin's gRPC test connection and
// returns a host-side Client for kind, as Load would from a process.
func hop(t testing.TB, o ServeOpts, kind string) *Client {
	t.Helper()
	set := serverPlugins(o, newMapper())
	for k, p := range hostPlugins() {
		if s, ok := set[k].(*grpcPlugin); ok {
			s.client = p.(*grpcPlugin).client
		}
	}
	client, _ := plugin.TestPluginGRPCConn(t, false, set)
	raw, err := client.Dispense(kind)
	if err != nil {
		t.Fatal(err)
	}
	// Closing the client shuts the server down through go-plugin's
	// controller service; stopping the server as well would race with it
	// inside go-plugin.
	return newClient(kind, "in-process", raw, func() { _ = client.Close() })
}

func hopEngine(t testing.TB, name string, open func(string, map[string]string) (transfer.Engine, error)) (transfer.Engine, error) {
	return hop(t, ServeOpts{Engine: open}, KindEngine).Engine(name, nil)
}

// hopCallTimeout is the suite's CallTimeout through the gRPC hop. The
// default (one second) bounds a call that must not block; through a gRPC
// round trip under -race on a loaded two-core machine a call that does
// not block was seen taking 1.1-1.9 s (engine/notify-order: "Notify
// blocked for 1.136s"), failing about one run in ten there. A call that
// does block (a PostWrite waiting for a stalled write, a Notify waiting
// for the receiver) blocks until released, so ten seconds still catches
// it; no rule waits out CallTimeout when it passes. hopOpTimeout is the
// suite's OpTimeout there, for the same reason (engine/notify-order: "B
// received 944 of 1000 notifications within OpTimeout (10s)", on main);
// rules that wait for nothing to happen wait Settle, not OpTimeout.
const (
	hopCallTimeout = 10 * time.Second
	hopOpTimeout   = 30 * time.Second
)

// TestEngineConformanceOverGRPC runs the engine rules through the gRPC hop,
// over the loopback and the TCP engine.
func TestEngineConformanceOverGRPC(t *testing.T) {
	cfg := conformance.Config{Seed: 1, Sizes: []uint64{1, 4097, 1 << 20}, CallTimeout: hopCallTimeout, OpTimeout: hopOpTimeout}
	t.Run("loopback", func(t *testing.T) {
		conformance.Engine(t, func() (conformance.EnginePair, error) {
			fab := loopback.NewFabric()
			var valve conformance.Valve
			open := func(name string, _ map[string]string) (transfer.Engine, error) {
				o := loopback.Options{}
				if name == "a" {
					o.Hold = valve.Wait // the plugin is in-process here
				}
				return fab.NewEngine(name, o)
			}
			p, err := pairOver(t, open)
			p.StallWrites = valve.Stall
			return p, err
		}, cfg)
	})
	t.Run("tcp", func(t *testing.T) {
		c := cfg
		// Skipped as in engines/tcp (see its TestConformance): a one-sided
		// receiver cannot refuse a deregistration for a write in flight.
		c.Skip = []string{"engine/deregister-in-flight"}
		conformance.Engine(t, func() (conformance.EnginePair, error) {
			return pairOver(t, func(name string, _ map[string]string) (transfer.Engine, error) {
				return tcp.New(tcp.Config{Name: name})
			})
		}, c)
	})
}

func pairOver(t *testing.T, open func(string, map[string]string) (transfer.Engine, error)) (conformance.EnginePair, error) {
	a, err := hopEngine(t, "a", open)
	if err != nil {
		return conformance.EnginePair{}, err
	}
	b, err := hopEngine(t, "b", open)
	if err != nil {
		a.Close()
		return conformance.EnginePair{}, err
	}
	return conformance.EnginePair{A: a, B: b, KillB: func() { b.Close() }, Cleanup: func() { a.Close(); b.Close() }}, nil
}

// TestControlConformanceOverGRPC runs the control channel rules through
// the gRPC hop over in-process channels.
func TestControlConformanceOverGRPC(t *testing.T) {
	cfg := conformance.Config{Seed: 1, CallTimeout: hopCallTimeout, OpTimeout: hopOpTimeout}
	conformance.ControlChannel(t, func() (conformance.ControlSet, error) {
		net := inproc.NewNetwork()
		open := func(name string, _ map[string]string) (transfer.ControlChannel, error) {
			return net.NewChannel(name, inproc.Options{})
		}
		var set conformance.ControlSet
		for i, name := range []string{"a", "b", "c"} {
			ch, err := hop(t, ServeOpts{Control: open}, KindControl).Control(name, nil)
			if err != nil {
				for _, c := range []transfer.ControlChannel{set.A, set.B} {
					if c != nil {
						c.Close()
					}
				}
				return conformance.ControlSet{}, err
			}
			*[]*transfer.ControlChannel{&set.A, &set.B, &set.C}[i] = ch
		}
		return set, nil
	}, cfg)
}

// TestErrorsCrossTheWire checks every sentinel survives the round trip.
func TestErrorsCrossTheWire(t *testing.T) {
	// Every sentinel of package transfer, listed here independently of the
	// codec's table, so one missing from the table fails.
	for _, sentinel := range []error{
		transfer.ErrBusy, transfer.ErrQueueFull, transfer.ErrTimeout, transfer.ErrClosed,
		transfer.ErrUnknownPeer, transfer.ErrPeerLost, transfer.ErrOutOfBounds, transfer.ErrNotRegistered,
		transfer.ErrInUse, transfer.ErrBadEndpoint, transfer.ErrBadMetadata, transfer.ErrNotQuiescent,
		transfer.ErrDeviceFault, transfer.ErrUnsupported,
	} {
		err := fromProtoError(toProtoError(errors.Join(errors.New("context"), sentinel)))
		if !errors.Is(err, sentinel) {
			t.Errorf("%v: decoded %v does not wrap it", sentinel, err)
		}
		if !strings.Contains(err.Error(), "context") {
			t.Errorf("%v: message lost: %q", sentinel, err)
		}
	}
	both := fromProtoError(toProtoError(errors.Join(transfer.ErrTimeout, transfer.ErrNotQuiescent)))
	if !errors.Is(both, transfer.ErrTimeout) || !errors.Is(both, transfer.ErrNotQuiescent) {
		t.Fatalf("two sentinels: %v", both)
	}
	if fromProtoError(nil) != nil || toProtoError(nil) != nil {
		t.Fatal("nil error must stay nil")
	}
	if err := fromProtoError(&pb.Error{Codes: []pb.Code{99}}); err == nil || errors.Is(err, transfer.ErrBusy) {
		t.Fatalf("unknown code: %v", err)
	}
}

// TestRegisterNeedsSharedMemory: Go heap memory cannot be shared with a
// plugin, and the error says so.
func TestRegisterNeedsSharedMemory(t *testing.T) {
	fab := loopback.NewFabric()
	e, err := hopEngine(t, "a", func(name string, _ map[string]string) (transfer.Engine, error) {
		return fab.NewEngine(name, loopback.Options{})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	heap := make([]byte, 1<<16)
	err = e.RegisterMemory(mem.DescOf(heap))
	if !errors.Is(err, transfer.ErrUnsupported) || !strings.Contains(err.Error(), "memfd") {
		t.Fatalf("register heap memory: %v, want ErrUnsupported naming memfd", err)
	}
	err = e.RegisterMemory(transfer.Desc{Addr: 1 << 40, Len: 10, Kind: transfer.CUDA})
	if !errors.Is(err, transfer.ErrUnsupported) || !strings.Contains(err.Error(), "not yet: device memory cannot cross to a plugin") {
		t.Fatalf("register CUDA memory: %v", err)
	}
	buf, err := mem.Alloc(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	if err := e.RegisterMemory(buf.Desc()); err != nil {
		t.Fatalf("register mem.Alloc memory: %v", err)
	}
	if err := e.DeregisterMemory(buf.Desc()); err != nil {
		t.Fatal(err)
	}
}

// TestShareFindsMemfd checks the host-side lookup of a sub-range of an arena.
func TestShareFindsMemfd(t *testing.T) {
	a, err := mem.NewArena("share", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	d := a.Desc()
	sub := transfer.Desc{Addr: d.Addr + 5000, Len: 3000, Kind: transfer.Host}
	s, err := shareOf(sub)
	if err != nil {
		t.Fatal(err)
	}
	if s.GetFd() != int64(a.Fd()) || s.GetOffset() != 5000 {
		t.Fatalf("share = %v, want fd %d offset 5000", s, a.Fd())
	}
	past := transfer.Desc{Addr: d.Addr + d.Len - 10, Len: 20, Kind: transfer.Host}
	if _, err := shareOf(past); err == nil {
		t.Fatal("a range past the arena's end was shared")
	}
}

// TestMapperRefusesTakenAddress: when the host's address is taken in the
// plugin process, registration fails with a clear error instead of
// mapping elsewhere. (Here the "plugin" is this process pretending to be
// another one, so the address is taken by the host's own mapping.)
func TestMapperRefusesTakenAddress(t *testing.T) {
	buf, err := mem.Alloc(3 * 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	s, err := shareOf(buf.Desc())
	if err != nil {
		t.Fatal(err)
	}
	m := newMapper()
	m.self = -1 // treat our own pid as a foreign host
	err = m.Map(buf.Desc(), s)
	if !errors.Is(err, transfer.ErrUnsupported) || !strings.Contains(err.Error(), "already in use") {
		t.Fatalf("map over a taken address: %v", err)
	}
	if len(m.pages) != 0 {
		t.Fatalf("failed map left %d pages behind", len(m.pages))
	}
	bad := &pb.Share{Pid: s.Pid, Fd: s.Fd, Offset: s.Offset, Inode: s.Inode + 1, Dev: s.Dev}
	if err := m.Map(buf.Desc(), bad); !errors.Is(err, transfer.ErrBadMetadata) {
		t.Fatalf("map of the wrong inode: %v", err)
	}
	if err := m.Map(buf.Desc(), nil); !errors.Is(err, transfer.ErrUnsupported) {
		t.Fatalf("map without a share: %v", err)
	}
}

// badEngine is a plugin engine whose replies are malformed.
type badEngine struct {
	pb.UnimplementedEngineServer
	handle uint64
	status uint32
}

func (b *badEngine) Open(context.Context, *pb.OpenRequest) (*pb.OpenReply, error) {
	return &pb.OpenReply{Name: []byte("bad")}, nil
}

func (b *badEngine) PostWrite(context.Context, *pb.PostWriteRequest) (*pb.HandleReply, error) {
	return &pb.HandleReply{Handle: b.handle}, nil
}

func (b *badEngine) Poll(context.Context, *pb.HandleRequest) (*pb.PollReply, error) {
	return &pb.PollReply{Status: b.status}, nil
}

func (b *badEngine) Wait(context.Context, *pb.WaitRequest) (*pb.PollReply, error) {
	return &pb.PollReply{Status: b.status}, nil
}

func (b *badEngine) Release(context.Context, *pb.HandleRequest) (*pb.Reply, error) {
	return &pb.Reply{}, nil
}

func (b *badEngine) Close(context.Context, *pb.Empty) (*pb.Reply, error) { return &pb.Reply{}, nil }

func badHop(t *testing.T, b *badEngine) transfer.Engine {
	set := plugin.PluginSet{KindEngine: &grpcPlugin{
		server: func(_ *plugin.GRPCBroker, s *grpc.Server) { pb.RegisterEngineServer(s, b) },
		client: hostPlugins()[KindEngine].(*grpcPlugin).client,
	}}
	client, _ := plugin.TestPluginGRPCConn(t, false, set)
	raw, err := client.Dispense(KindEngine)
	if err != nil {
		t.Fatal(err)
	}
	e, err := newClient(KindEngine, "bad", raw, func() { _ = client.Close() }).Engine("x", nil)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestMalformedReplies: bad handles and out-of-range statuses are clear
// errors, never a panic or a hang.
func TestMalformedReplies(t *testing.T) {
	t.Run("handle 0", func(t *testing.T) {
		e := badHop(t, &badEngine{handle: 0})
		defer e.Close()
		_, err := e.PostWrite("p", nil)
		if !errors.Is(err, transfer.ErrNotQuiescent) || !strings.Contains(err.Error(), "handle 0") {
			t.Fatalf("handle 0: %v", err)
		}
	})
	t.Run("duplicate handle", func(t *testing.T) {
		e := badHop(t, &badEngine{handle: 7})
		defer e.Close()
		if _, err := e.PostWrite("p", nil); err != nil {
			t.Fatal(err)
		}
		_, err := e.PostWrite("p", nil)
		if err == nil || !strings.Contains(err.Error(), "already in use") {
			t.Fatalf("duplicate handle: %v", err)
		}
	})
	t.Run("status out of range", func(t *testing.T) {
		e := badHop(t, &badEngine{handle: 1, status: 9})
		defer e.Close()
		op, err := e.PostWrite("p", nil)
		if err != nil {
			t.Fatal(err)
		}
		st, err := pollTerminal(t, op)
		if st != transfer.Failed || !errors.Is(err, transfer.ErrNotQuiescent) || !strings.Contains(err.Error(), "status 9") {
			t.Fatalf("poll = %v, %v", st, err)
		}
		if st2, err2 := op.Poll(); st2 != st || err2 != err {
			t.Fatal("terminal poll changed")
		}
		if err := op.Release(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("failed without cause", func(t *testing.T) {
		e := badHop(t, &badEngine{handle: 1, status: uint32(transfer.Failed)})
		defer e.Close()
		op, err := e.PostWrite("p", nil)
		if err != nil {
			t.Fatal(err)
		}
		if st, err := pollTerminal(t, op); st != transfer.Failed || err == nil {
			t.Fatalf("poll = %v, %v", st, err)
		}
	})
}

// pollTerminal polls op until it is terminal (the watcher's Wait reply
// arrives a moment after the post), bounded.
func pollTerminal(t *testing.T, op transfer.Op) (transfer.Status, error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := op.Poll()
		if st.Terminal() || time.Now().After(deadline) {
			return st, err
		}
		time.Sleep(time.Millisecond)
	}
}

// TestClosedClient: after Close every call fails at once with ErrClosed and
// pending ops resolve Failed.
func TestClosedClient(t *testing.T) {
	e := badHop(t, &badEngine{handle: 3, status: uint32(transfer.Pending)})
	op, err := e.PostWrite("p", nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := op.Poll(); st != transfer.Pending {
		t.Fatalf("poll = %v, want pending", st)
	}
	if err := op.Release(); !errors.Is(err, transfer.ErrInUse) {
		t.Fatalf("release pending: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if st, err := op.Poll(); st != transfer.Failed || !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("poll after close = %v, %v", st, err)
	}
	if _, err := e.Metadata(); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("metadata after close: %v", err)
	}
	if err := op.Release(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > CallTimeout {
		t.Fatalf("calls after close took %v", d)
	}
}

// hostStages serves the in-tree host gather and scatter stages, as a
// plugin binary would.
func hostStages() ServeOpts {
	return ServeOpts{
		Gatherer: func(_ string, _ map[string]string, reg *mem.Registry) (transfer.Gatherer, error) {
			return gatherhost.New(gatherhost.Settings{Registry: reg, Contexts: 8})
		},
		Scatterer: func(_ string, _ map[string]string, reg *mem.Registry) (transfer.Scatterer, error) {
			return scatterhost.New(scatterhost.Settings{Registry: reg, Contexts: 8})
		},
	}
}

// TestStageConformanceOverGRPC runs the gather and scatter rules through
// the gRPC hop: the host's registry decides what is shared, the plugin's
// stage validates against what it was shared.
func TestStageConformanceOverGRPC(t *testing.T) {
	cfg := conformance.Config{Seed: 1, CallTimeout: hopCallTimeout, OpTimeout: hopOpTimeout}
	t.Run("gather", func(t *testing.T) {
		conformance.Gatherer(t, func() (conformance.GathererFixture, error) {
			reg := &mem.Registry{}
			g, err := hop(t, hostStages(), KindGather).Gatherer("g", nil, reg)
			if err != nil {
				return conformance.GathererFixture{}, err
			}
			return conformance.GathererFixture{Gatherer: g, Register: reg.Add}, nil
		}, cfg)
	})
	t.Run("scatter", func(t *testing.T) {
		conformance.Scatterer(t, func() (conformance.ScattererFixture, error) {
			reg := &mem.Registry{}
			s, err := hop(t, hostStages(), KindScatter).Scatterer("s", nil, reg)
			if err != nil {
				return conformance.ScattererFixture{}, err
			}
			return conformance.ScattererFixture{Scatterer: s, Register: reg.Add}, nil
		}, cfg)
	})
}

// TestWriterConformanceOverGRPC runs the writer rules through the gRPC
// hop: the plugin's writer posts through the host's engine, lent back to
// it over the broker.
func TestWriterConformanceOverGRPC(t *testing.T) {
	cfg := conformance.Config{Seed: 1, Sizes: []uint64{1, 4097, 1 << 20}, CallTimeout: hopCallTimeout, OpTimeout: hopOpTimeout}
	conformance.Writer(t, func() (conformance.WriterFixture, error) {
		fab := loopback.NewFabric()
		a, err := fab.NewEngine("a", loopback.Options{})
		if err != nil {
			return conformance.WriterFixture{}, err
		}
		b, err := fab.NewEngine("b", loopback.Options{})
		if err != nil {
			a.Close()
			return conformance.WriterFixture{}, err
		}
		w, err := hop(t, ServeOpts{Writer: func(_ string, _ map[string]string, e transfer.Engine) (transfer.Writer, error) {
			return write.New(e), nil
		}}, KindWriter).Writer("a", nil, a)
		if err != nil {
			a.Close()
			b.Close()
			return conformance.WriterFixture{}, err
		}
		return conformance.WriterFixture{
			Writer: w, Peer: "b", RegisterSource: a.RegisterMemory,
			Grant: func(d transfer.Desc) error {
				if err := b.RegisterMemory(d); err != nil {
					return err
				}
				md, err := b.Metadata()
				if err != nil {
					return err
				}
				_, err = a.LoadPeer(md)
				return err
			},
			Cleanup: func() { w.Close(); a.Close(); b.Close() },
		}, nil
	}, cfg)
}

// TestStageRefusesDeviceMemory: a stage plugin is given no device memory;
// the copy fails at once with the "not yet" error, nothing is sent.
func TestStageRefusesDeviceMemory(t *testing.T) {
	reg := &mem.Registry{}
	g, err := hop(t, hostStages(), KindGather).Gatherer("g", nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	region := transfer.Desc{Addr: 1 << 40, Len: 4096, Kind: transfer.CUDA}
	if _, err := g.Gather(region, nil); !errors.Is(err, transfer.ErrUnsupported) || !strings.Contains(err.Error(), "not yet: device memory cannot cross to a plugin") {
		t.Fatalf("gather into device memory: %v", err)
	}
}
