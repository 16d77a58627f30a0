package pipeline

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bouncekv/bounce/controlplane/nixlnotif"
	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// nthFailEngine wraps a real engine; PostWrite calls after the first ok
// succeed normally, the rest return an op that fails.
type nthFailEngine struct {
	transfer.Engine
	ok    int64
	calls atomic.Int64
}

func (e *nthFailEngine) PostWrite(peer string, ops []transfer.WriteOp) (transfer.Op, error) {
	if e.calls.Add(1) > e.ok {
		return &doneOp{err: errors.New("injected write failure")}, nil
	}
	return e.Engine.PostWrite(peer, ops)
}

// nthFailScatterer wraps a real scatterer: scatters after the first ok fail.
type nthFailScatterer struct {
	transfer.Scatterer
	ok    int64
	calls atomic.Int64
}

func (s *nthFailScatterer) Scatter(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	if s.calls.Add(1) > s.ok {
		return &doneOp{err: errors.New("injected scatter failure")}, nil
	}
	return s.Scatterer.Scatter(region, runs)
}

func withReceived(ch chan<- Received) nodeOpt {
	return func(s *Settings) { s.Received = ch }
}

// newTCPEngine is a world.engine that gives a node a real tcp engine.
func newTCPEngine(t testing.TB, name string, _ loopback.Options) transfer.Engine {
	e, err := tcp.New(tcp.Config{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// tcpZMQWorld is a world of tcp engines and zmq control channels.
func tcpZMQWorld(t testing.TB) *world {
	w := zmqWorld(t, 0)
	w.engine = newTCPEngine
	return w
}

func TestReceivedInproc(t *testing.T) { receivedSuite(t, newWorld) }

func TestReceivedTCPZMQ(t *testing.T) { receivedSuite(t, tcpZMQWorld) }

// TestReceivedNixlNotif: over a control plane carried by the engine's own
// notifications, the agent reads none itself, and a direct-only peer's DONE
// notice still arrives (through the channel when the receiver has it).
func TestReceivedNixlNotif(t *testing.T) {
	receivedSuite(t, func(t testing.TB) *world {
		w := newWorld(t)
		w.ctrl = func(t testing.TB, name string, eng transfer.Engine) transfer.ControlChannel {
			ch, err := nixlnotif.New(eng)
			if err != nil {
				t.Fatal(err)
			}
			return ch
		}
		return w
	})
}

// receivedSuite checks the receiver's completion events over one world:
// success on both routes (the bytes are in place when the event arrives),
// and failures half way through a request, on the sender and on the
// receiver, each told to the receiver.
func receivedSuite(t *testing.T, mk func(testing.TB) *world) {
	const total = 4 << 20 // 1024 × 4 KiB in 1 MiB chunks: 4 chunks
	layout := kvLayout{count: 1024, size: 4096, fragmented: true}
	one := func(t *testing.T, route Route, sendOpt, recvOpt nodeOpt, recvCfg ...func(*Config)) (*node, *node, job, <-chan Received, *Batch) {
		w := mk(t)
		cfg := testConfig()
		cfg.MaxInflight = 1 // chunk k+1 starts only once chunk k landed
		rcfg := cfg
		for _, f := range recvCfg {
			f(&rcfg)
		}
		events := make(chan Received, 8)
		var sopts, ropts []nodeOpt
		if sendOpt != nil {
			sopts = append(sopts, sendOpt)
		}
		ropts = append(ropts, withReceived(events))
		if recvOpt != nil {
			ropts = append(ropts, recvOpt)
		}
		a, b := w.node("a", cfg, sopts...), w.node("b", rcfg, ropts...)
		src, dst := a.buffer(t, total), b.buffer(t, total)
		connect(t, a, b)
		j := prepare(src, dst, layout, 11)
		bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst, Route: route, Tag: []byte("kv-req-11")})
		if err != nil {
			t.Fatal(err)
		}
		return a, b, j, events, bt
	}
	next := func(t *testing.T, events <-chan Received) Received {
		t.Helper()
		select {
		case ev := <-events:
			return ev
		case <-time.After(20 * time.Second):
			t.Fatal("the receiver was never told: no Received event within 20s")
			return Received{}
		}
	}
	check := func(t *testing.T, ev Received, route Route, bytes uint64) {
		t.Helper()
		if ev.Peer != "a" || string(ev.Tag) != "kv-req-11" || ev.Route != route || ev.Bytes != bytes {
			t.Fatalf("event = {peer %q tag %q route %v bytes %d err %v}, want {a kv-req-11 %v %d}", ev.Peer, ev.Tag, ev.Route, ev.Bytes, ev.Err, route, bytes)
		}
	}
	for _, route := range []Route{RouteBounce, RouteDirect} {
		t.Run(route.String()+"-success", func(t *testing.T) {
			a, b, j, events, bt := one(t, route, nil, nil)
			ev := next(t, events)
			// Every byte is in place when the event arrives, whatever the
			// sender's Wait says yet.
			if err := j.check(); err != nil {
				t.Fatalf("event arrived before the bytes: %v", err)
			}
			check(t, ev, route, total)
			if ev.Err != nil {
				t.Fatalf("event error %v", ev.Err)
			}
			if err := wait(t, bt); err != nil || bt.Route() != route {
				t.Fatalf("sender: %v on %v", err, bt.Route())
			}
			if ev.Request != bt.ID() {
				t.Fatalf("event request %d, batch %d", ev.Request, bt.ID())
			}
			if s := b.Stats(); s.Events != 1 || s.DroppedEvents != 0 {
				t.Fatalf("receiver stats: %d events, %d dropped", s.Events, s.DroppedEvents)
			}
			settled(t, a, b)
		})
	}
	t.Run("bounce-sender-fails-half-way", func(t *testing.T) {
		var eng *nthFailEngine
		a, b, _, events, bt := one(t, RouteBounce, func(s *Settings) {
			eng = &nthFailEngine{Engine: s.Engine, ok: 1}
			s.Engine = eng
		}, nil)
		ev := next(t, events)
		check(t, ev, RouteBounce, 1<<20) // the first chunk landed
		if !errors.Is(ev.Err, ErrSenderCancelled) {
			t.Fatalf("event error %v, want ErrSenderCancelled", ev.Err)
		}
		if err := wait(t, bt); err == nil || !strings.Contains(err.Error(), "injected write failure") {
			t.Fatalf("sender: %v", err)
		}
		settled(t, a, b)
	})
	t.Run("bounce-receiver-scatter-fails-half-way", func(t *testing.T) {
		a, b, _, events, bt := one(t, RouteBounce, nil, func(s *Settings) {
			s.Scatterer = &nthFailScatterer{Scatterer: s.Scatterer, ok: 2}
		})
		ev := next(t, events)
		check(t, ev, RouteBounce, 2<<20)
		if ev.Err == nil || !strings.Contains(ev.Err.Error(), "injected scatter failure") {
			t.Fatalf("event error %v, want the scatter failure", ev.Err)
		}
		bt.Abandon(time.Millisecond) // the sender would time out; do not wait for that
		select {
		case ev := <-events:
			t.Fatalf("a second event for the same request: %+v", ev)
		case <-time.After(50 * time.Millisecond):
		}
		settled(t, a, b)
	})
	t.Run("bounce-peer-forgotten-half-way", func(t *testing.T) {
		_, b, _, events, bt := one(t, RouteBounce, func(s *Settings) {
			// The second write never lands: the flow stays live on b.
			s.Engine = &stallEngine{Engine: s.Engine, after: 1}
		}, nil)
		eventually(t, func() bool { return b.Stats().Grants >= 2 })
		if err := b.ForgetPeer("a"); err != nil {
			t.Fatal(err)
		}
		ev := next(t, events)
		check(t, ev, RouteBounce, 1<<20)
		if !errors.Is(ev.Err, transfer.ErrPeerLost) {
			t.Fatalf("event error %v, want ErrPeerLost", ev.Err)
		}
		bt.Abandon(time.Millisecond)
	})
	// A peer without a control path to the sender still hears of a direct
	// request: the DONE notice travels as an engine notification. The
	// receiver here either has no control channel at all or has bounce
	// off (no handshake, so not bounce-capable: route auto goes direct).
	directOnly := map[string]struct {
		opt nodeOpt
		cfg func(*Config)
	}{
		"no-control": {opt: func(s *Settings) {
			s.Control.Close()
			s.Control = nil
		}},
		"bounce-off": {cfg: func(c *Config) { c.Enabled = false }},
	}
	for _, name := range []string{"no-control", "bounce-off"} {
		peer := directOnly[name]
		var cfgs []func(*Config)
		if peer.cfg != nil {
			cfgs = append(cfgs, peer.cfg)
		}
		t.Run("direct-only-peer-"+name+"-success", func(t *testing.T) {
			a, b, j, events, bt := one(t, RouteAuto, nil, peer.opt, cfgs...)
			if ok, reason, _ := a.PeerRoute("b"); ok {
				t.Fatal("b is bounce-capable; the case needs a direct-only peer")
			} else if reason == "" {
				t.Fatal("no reason for the direct-only peer")
			}
			ev := next(t, events)
			if err := j.check(); err != nil {
				t.Fatalf("event arrived before the bytes: %v", err)
			}
			check(t, ev, RouteDirect, total)
			if ev.Err != nil || ev.Request != bt.ID() {
				t.Fatalf("event error %v request %d, want nil and %d", ev.Err, ev.Request, bt.ID())
			}
			if err := wait(t, bt); err != nil || bt.Route() != RouteDirect {
				t.Fatalf("sender: %v on %v", err, bt.Route())
			}
			if s := b.Stats(); s.Events != 1 || s.BadMessages != 0 {
				t.Fatalf("receiver stats: %d events, %d bad messages", s.Events, s.BadMessages)
			}
		})
		t.Run("direct-only-peer-"+name+"-fails-half-way", func(t *testing.T) {
			var eng *halfEngine
			_, _, j, events, bt := one(t, RouteAuto, func(s *Settings) {
				eng = &halfEngine{notifyingEngine: s.Engine.(notifyingEngine)}
				s.Engine = eng
			}, peer.opt, cfgs...)
			ev := next(t, events)
			check(t, ev, RouteDirect, 0)
			if !errors.Is(ev.Err, ErrSenderFailed) || !strings.Contains(ev.Err.Error(), "injected failure half way") {
				t.Fatalf("event error %v, want ErrSenderFailed with the cause", ev.Err)
			}
			if err := wait(t, bt); err == nil {
				t.Fatal("sender succeeded")
			}
			// Half of the descriptors landed before the failure.
			if landed := j.landed(); landed != eng.half.Load() || landed == 0 || landed == int64(len(j.src)) {
				t.Fatalf("%d of %d descriptors landed, want the %d written before the failure", landed, len(j.src), eng.half.Load())
			}
		})
	}
	t.Run("direct-fails", func(t *testing.T) {
		_, _, _, events, bt := one(t, RouteDirect, func(s *Settings) {
			s.Engine = &nthFailEngine{Engine: s.Engine, ok: 0}
		}, nil)
		ev := next(t, events)
		check(t, ev, RouteDirect, 0)
		if !errors.Is(ev.Err, ErrSenderFailed) || !strings.Contains(ev.Err.Error(), "injected write failure") {
			t.Fatalf("event error %v, want ErrSenderFailed with the cause", ev.Err)
		}
		if err := wait(t, bt); err == nil {
			t.Fatal("sender succeeded")
		}
	})
}

// stallEngine wraps a real engine: writes after the first `after` return an
// op that stays pending until the engine is closed.
type stallEngine struct {
	transfer.Engine
	after int64
	calls atomic.Int64
}

func (e *stallEngine) PostWrite(peer string, ops []transfer.WriteOp) (transfer.Op, error) {
	if e.calls.Add(1) > e.after {
		return pendingOp{}, nil
	}
	return e.Engine.PostWrite(peer, ops)
}

// pendingOp never completes; it touched nothing, so releasing it is safe.
type pendingOp struct{}

func (pendingOp) Poll() (transfer.Status, error) { return transfer.Pending, nil }
func (pendingOp) Release() error                 { return nil }

// TestReceivedEventsOverflowIsCounted: a consumer that does not read loses
// events, counted, and the reactor never blocks on it.
func TestReceivedEventsOverflowIsCounted(t *testing.T) {
	w := newWorld(t)
	events := make(chan Received) // unbuffered, never read
	a, b := w.node("a", testConfig()), w.node("b", testConfig(), withReceived(events))
	src, dst := a.buffer(t, 4<<20), b.buffer(t, 4<<20)
	connect(t, a, b)
	for i := range 4 {
		o := uint64(i) << 20
		j := prepare(src[o:o+1<<20], dst[o:o+1<<20], kvLayout{count: 256, size: 4096, fragmented: true}, uint64(i))
		bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst, Route: RouteBounce, Tag: []byte(fmt.Sprint(i))})
		if err != nil {
			t.Fatal(err)
		}
		if err := wait(t, bt); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, func() bool { return b.Stats().DroppedEvents == 4 })
	if s := b.Stats(); s.Events != 4 {
		t.Fatalf("events = %d, want 4", s.Events)
	}
}

// TestSubmitRefusesLongTag: a tag over wire.MaxTag is an argument error at
// Submit, naming the limit.
func TestSubmitRefusesLongTag(t *testing.T) {
	w := newWorld(t)
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	j := simple(t, a, b, 1)
	connect(t, a, b)
	_, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst, Tag: bytes.Repeat([]byte{1}, 257)})
	if err == nil || !strings.Contains(err.Error(), "257 bytes") || !strings.Contains(err.Error(), "at most 256") {
		t.Fatalf("err = %v, want a refusal naming 257 bytes and the 256-byte limit", err)
	}
}

// notifyingEngine is an engine with notifications.
type notifyingEngine interface {
	transfer.Engine
	transfer.Notifier
}

// halfEngine wraps a real engine with notifications: a write of several
// descriptors lands its first half for real, then fails.
type halfEngine struct {
	notifyingEngine
	half atomic.Int64 // descriptors written before the failure
}

func (e *halfEngine) PostWrite(peer string, ops []transfer.WriteOp) (transfer.Op, error) {
	if len(ops) < 2 {
		return e.notifyingEngine.PostWrite(peer, ops)
	}
	n := len(ops) / 2
	op, err := e.notifyingEngine.PostWrite(peer, ops[:n])
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := op.Poll()
		if st == transfer.Done {
			break
		}
		if st == transfer.Failed || time.Now().After(deadline) {
			_ = op.Release()
			return nil, fmt.Errorf("first half: %v %w", st, err)
		}
		time.Sleep(time.Millisecond)
	}
	if err := op.Release(); err != nil {
		return nil, err
	}
	e.half.Store(int64(n))
	return &doneOp{err: errors.New("injected failure half way")}, nil
}

// landed counts the job's descriptors whose destination holds their source
// bytes.
func (j job) landed() int64 {
	sb, db := mem.DescOf(j.srcB), mem.DescOf(j.dstB)
	var n int64
	for i := range j.src {
		if bytes.Equal(j.srcB[j.src[i].Addr-sb.Addr:][:j.src[i].Len], j.dstB[j.dst[i].Addr-db.Addr:][:j.dst[i].Len]) {
			n++
		}
	}
	return n
}
