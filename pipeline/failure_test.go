package pipeline

import (
	"bytes"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bouncekv/bounce/controlplane/inproc"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

func shortTimeouts() Config {
	c := testConfig()
	c.RequestTimeout = 300 * time.Millisecond
	c.QuiesceTimeout = 300 * time.Millisecond
	return c
}

func withFaultEngine(fe **faultEngine) nodeOpt {
	return func(s *Settings) {
		f := &faultEngine{Engine: s.Engine}
		s.Engine = f
		*fe = f
	}
}

func withFaultScatter(fs **faultScatterer) nodeOpt {
	return func(s *Settings) {
		f := &faultScatterer{Scatterer: s.Scatterer, released: make(chan struct{})}
		f.fail.Store(true)
		s.Scatterer = f
		*fs = f
	}
}

// withHeldScatter makes every scatter of the node stay in flight (never
// ACKed) until fs.release; the test releases them when it ends.
func withHeldScatter(t *testing.T, fs **faultScatterer) nodeOpt {
	return func(s *Settings) {
		f := &faultScatterer{Scatterer: s.Scatterer, released: make(chan struct{})}
		f.hold.Store(true)
		s.Scatterer = f
		*fs = f
		t.Cleanup(f.release)
	}
}

func withStall(sg **stallGatherer) nodeOpt {
	return func(s *Settings) {
		g := newStallGatherer(s.Gatherer)
		g.stall(true)
		s.Gatherer = g
		*sg = g
	}
}

// simple returns a small bounce-eligible job from a to b.
func simple(t *testing.T, a, b *node, seed uint64) job {
	src, dst := a.buffer(t, 1<<20), b.buffer(t, 1<<20)
	return prepare(src, dst, kvLayout{count: 256, size: 4096, fragmented: true}, seed)
}

func TestFailureNoGrant(t *testing.T) {
	w := newWorld(t)
	a, b := w.node("a", shortTimeouts()), w.node("b", shortTimeouts())
	j := simple(t, a, b, 1)
	connect(t, a, b)
	if err := b.Shutdown(t.Context()); err != nil { // b's channel stays open, unread
		t.Fatal(err)
	}
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if r, q := bt.Retirement(); !r || !q {
		t.Fatalf("retirement = (%v, %v), want (true, true)", r, q)
	}
	settled(t, a)
}

func TestFailureEngineWrite(t *testing.T) {
	for _, route := range []Route{RouteBounce, RouteDirect} {
		t.Run(route.String(), func(t *testing.T) {
			w := newWorld(t)
			var fe *faultEngine
			a, b := w.node("a", shortTimeouts(), withFaultEngine(&fe)), w.node("b", shortTimeouts())
			j := simple(t, a, b, 2)
			connect(t, a, b)
			fe.failWrites.Store(true)
			bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst, Route: route})
			if err != nil {
				t.Fatal(err)
			}
			if err := wait(t, bt); !errors.Is(err, transfer.ErrPeerLost) {
				t.Fatalf("err = %v, want the injected engine failure", err)
			}
			if r, q := bt.Retirement(); !r || !q {
				t.Fatalf("retirement = (%v, %v)", r, q)
			}
			if err := bt.Release(); err != nil {
				t.Fatal(err)
			}
			settled(t, a, b) // the cancel reclaimed b's grants
		})
	}
}

func TestFailureScatter(t *testing.T) {
	w := newWorld(t)
	var fs *faultScatterer
	a, b := w.node("a", shortTimeouts()), w.node("b", shortTimeouts(), withFaultScatter(&fs))
	j := simple(t, a, b, 3)
	connect(t, a, b)
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	// No ACK ever comes, never a report that the bytes landed: the
	// receiver NACKs with the cause, so the sender fails with it (not at
	// its request timeout).
	if err := wait(t, bt); !errors.Is(err, ErrRefused) || errors.Is(err, transfer.ErrTimeout) || !strings.Contains(err.Error(), "scatter failed: injected scatter failure") {
		t.Fatalf("err = %v, want ErrRefused with the receiver's scatter failure", err)
	}
	if bt.Status() != transfer.Failed {
		t.Fatalf("status = %v", bt.Status())
	}
	if b.Stats().ScatterFailures == 0 {
		t.Fatal("receiver counted no scatter failure")
	}
	settled(t, a, b) // the failed scatter's region was still freed
}

func TestFailureForgetPeerInFlight(t *testing.T) {
	w := newWorld(t)
	var fs *faultScatterer
	a, b := w.node("a", testConfig()), w.node("b", testConfig(), withHeldScatter(t, &fs))
	j := simple(t, a, b, 4)
	connect(t, a, b)
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return fs.held.Load() > 0 }) // in flight, never ACKed
	if err := a.ForgetPeer("b"); err != nil {
		t.Fatal(err)
	}
	if err := b.ForgetPeer("a"); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("err = %v, want ErrPeerLost", err)
	}
	fs.release()
	if _, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst}); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("submit to a forgotten peer: err = %v, want ErrUnknownPeer", err)
	}
	settled(t, a, b)
	// A fresh load re-validates the handshake and the peer is served again.
	fs.hold.Store(false)
	connect(t, a, b)
	clear(j.dstB)
	bt, err = a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	j.verify(t)
	settled(t, a, b)
}

func TestFailureShutdownInFlight(t *testing.T) {
	w := newWorld(t)
	var fs *faultScatterer
	a, b := w.node("a", testConfig()), w.node("b", testConfig(), withHeldScatter(t, &fs))
	j := simple(t, a, b, 5)
	connect(t, a, b)
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return fs.held.Load() > 0 })
	if err := a.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("err = %v, want ErrClosed", err)
	}
	if r, q := bt.Retirement(); !r || !q {
		t.Fatalf("retirement = (%v, %v)", r, q)
	}
	if err := a.Shutdown(t.Context()); err != nil {
		t.Fatalf("second shutdown: %v", err)
	}
	if _, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst}); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("submit after shutdown: err = %v", err)
	}
	fs.release()
	settled(t, b) // a's cancel reclaimed its flow on b
}

// impostor is a raw control channel speaking the wire protocol by hand.
type impostor struct {
	ch transfer.ControlChannel
}

func newImpostor(t *testing.T, w *world, target *node) *impostor {
	return newNamedImpostor(t, w, target, "evil")
}

// newNamedImpostor is a raw control channel named name, speaking to target.
func newNamedImpostor(t *testing.T, w *world, target *node, name string) *impostor {
	ch, err := w.net.NewChannel(name, inproc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	if err := ch.AddPeer(target.Name(), target.ctrl.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	return &impostor{ch: ch}
}

func (im *impostor) send(t *testing.T, to string, m wire.Message) {
	t.Helper()
	b, err := wire.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := im.ch.Send(to, b); err != nil {
		t.Fatal(err)
	}
}

// recv returns the next message, or nil after a short wait.
func (im *impostor) recv(t *testing.T, d time.Duration) wire.Message {
	t.Helper()
	m, err := im.ch.Recv(d)
	if errors.Is(err, transfer.ErrTimeout) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	msg, err := wire.Unmarshal(m.Payload)
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

func (im *impostor) grant(t *testing.T, b *node, req uint64, n uint64) wire.Credit {
	t.Helper()
	im.send(t, b.Name(), &wire.Want{Request: req, ChunkBytes: []uint64{n}, Endpoint: im.ch.LocalEndpoint()})
	g, ok := im.recv(t, 5*time.Second).(*wire.Grant)
	if !ok || len(g.Credits) != 1 || g.Request != req {
		t.Fatalf("expected a GRANT for request %d, got %#v", req, g)
	}
	return g.Credits[0]
}

func TestMalformedWantEndpoint(t *testing.T) {
	w := newWorld(t)
	b := w.node("b", testConfig())
	im := newImpostor(t, w, b)
	im.send(t, "b", &wire.Want{Request: 1, ChunkBytes: []uint64{1 << 20}, Endpoint: "tcp://not an endpoint"})
	if m := im.recv(t, 200*time.Millisecond); m != nil {
		t.Fatalf("a WANT with a malformed endpoint got %#v", m)
	}
	eventually(t, func() bool { return b.Stats().RejectedWants == 1 })
	// A valid WANT is granted; a cancel with a bad endpoint still reclaims it.
	im.grant(t, b, 2, 1<<20)
	if st := b.ArenaStats(); st.FreeBytes == st.Capacity {
		t.Fatal("granted region not held")
	}
	im.send(t, "b", &wire.Want{Request: 2, Endpoint: "garbage"})
	settled(t, b)
}

func TestScatterRunsOutOfBounds(t *testing.T) {
	w := newWorld(t)
	b := w.node("b", testConfig())
	dst := b.buffer(t, 1<<20)
	im := newImpostor(t, w, b)
	d := mem.DescOf(dst)
	cases := []struct {
		name string
		runs []transfer.Run
	}{
		{"past-the-region", []transfer.Run{{RegionOff: 0, Addr: d.Addr, Len: 128 << 10, Count: 1}}},
		{"stride-past-the-region", []transfer.Run{{RegionOff: 0, Addr: d.Addr, Len: 4096, Count: 32, RegionStride: 4096, AddrStride: 8192}}},
		{"one-byte-past-the-grant", []transfer.Run{{RegionOff: 64<<10 - 4095, Addr: d.Addr, Len: 4096, Count: 1}}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := uint64(10 + i)
			cr := im.grant(t, b, req, 64<<10)
			im.send(t, "b", &wire.Data{Request: req, Chunk: 0, Region: cr.Region, Runs: tc.runs})
			n, ok := im.recv(t, 5*time.Second).(*wire.Nack)
			if !ok || n.Request != req {
				t.Fatalf("expected a NACK for request %d", req)
			}
			if !bytes.Equal(dst, make([]byte, len(dst))) {
				t.Fatal("bytes were written for rejected runs")
			}
			settled(t, b)
		})
	}
	if got := b.Stats().BadRuns; got != uint64(len(cases)) {
		t.Fatalf("bad runs = %d, want %d", got, len(cases))
	}
	// Runs inside the grant but aimed at unregistered memory are refused
	// too, before the scatter stage: a NACK, nothing written, region freed.
	cr := im.grant(t, b, 99, 64<<10)
	im.send(t, "b", &wire.Data{Request: 99, Region: cr.Region, Runs: []transfer.Run{{Addr: d.Addr + 2<<20, Len: 4096, Count: 1}}})
	if n, ok := im.recv(t, 5*time.Second).(*wire.Nack); !ok || n.Request != 99 || n.Code != wire.NackForbidden {
		t.Fatalf("runs into unregistered memory got %#v, want a NACK %v", n, wire.NackForbidden)
	}
	if st := b.Stats(); st.ScatterFailures != 0 || st.BadRuns != uint64(len(cases))+1 {
		t.Fatalf("scatter failures %d, bad runs %d", st.ScatterFailures, st.BadRuns)
	}
	settled(t, b)
}

func TestLateDataAfterCancel(t *testing.T) {
	w := newWorld(t)
	b := w.node("b", testConfig())
	dst := b.buffer(t, 1<<20)
	im := newImpostor(t, w, b)
	cr := im.grant(t, b, 7, 64<<10)
	im.send(t, "b", &wire.Want{Request: 7, Endpoint: im.ch.LocalEndpoint()})
	im.send(t, "b", &wire.Data{Request: 7, Region: cr.Region, Runs: []transfer.Run{{Addr: mem.DescOf(dst).Addr, Len: 4096, Count: 1}}})
	eventually(t, func() bool { return b.Stats().LateData == 1 })
	if !bytes.Equal(dst, make([]byte, len(dst))) {
		t.Fatal("late DATA was scattered")
	}
	settled(t, b)
}

func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestRetirementNotQuiescent(t *testing.T) {
	w := newWorld(t)
	var sg *stallGatherer
	a, b := w.node("a", shortTimeouts(), withStall(&sg)), w.node("b", shortTimeouts())
	j := simple(t, a, b, 8)
	connect(t, a, b)
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if r, q := bt.Retirement(); !r || q {
		t.Fatalf("retirement = (%v, %v), want retired and NOT quiescent", r, q)
	}
	if err := bt.Release(); !errors.Is(err, transfer.ErrNotQuiescent) {
		t.Fatalf("Release of a non-quiescent batch: err = %v, want ErrNotQuiescent", err)
	}
	close(sg.release) // the stuck gathers finally stop
	select {
	case <-bt.Quiescent():
	case <-time.After(10 * time.Second):
		t.Fatal("batch never became quiescent")
	}
	if err := bt.Release(); err != nil {
		t.Fatal(err)
	}
	settled(t, a, b)
}

func TestAbandonOutcomes(t *testing.T) {
	cases := []struct {
		name    string
		release time.Duration // when the stalled gathers stop; <0 = during cleanup
		outcome error
		want    transfer.AbandonOutcome
	}{
		{"recoverable", 20 * time.Millisecond, nil, transfer.Recoverable},
		{"device-fault", 0, transfer.ErrDeviceFault, transfer.DeviceFault},
		{"not-quiescent", -1, nil, transfer.NotQuiescent},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			var sg *stallGatherer
			a, b := w.node("a", testConfig(), withStall(&sg)), w.node("b", testConfig())
			sg.outcome = tc.outcome
			j := simple(t, a, b, 9)
			connect(t, a, b)
			bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
			if err != nil {
				t.Fatal(err)
			}
			if tc.release >= 0 {
				time.AfterFunc(tc.release, func() { close(sg.release) })
			} else {
				t.Cleanup(func() { close(sg.release) })
			}
			if got := bt.Abandon(300 * time.Millisecond); got != tc.want {
				t.Fatalf("Abandon = %v, want %v", got, tc.want)
			}
			if err := wait(t, bt); err == nil {
				t.Fatal("abandoned batch succeeded")
			}
			_, q := bt.Retirement()
			if q != (tc.want == transfer.Recoverable) {
				t.Fatalf("quiescent = %v after %v", q, tc.want)
			}
			if err := bt.Release(); (err == nil) != (tc.want == transfer.Recoverable) {
				t.Fatalf("Release after %v: err = %v", tc.want, err)
			}
		})
	}
}

func TestCallbackNeverOutlivesRelease(t *testing.T) {
	w := newWorld(t)
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	j := simple(t, a, b, 10)
	connect(t, a, b)
	var calls, finished atomic.Int32
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst, OnComplete: func(b *Batch) {
		calls.Add(1)
		time.Sleep(50 * time.Millisecond)
		if b.Status() != transfer.Done {
			panic("callback saw a non-terminal batch")
		}
		finished.Add(1)
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	if err := bt.Release(); err != nil {
		t.Fatal(err)
	}
	if finished.Load() != 1 {
		t.Fatal("Release returned while the completion callback was still running")
	}
	time.Sleep(20 * time.Millisecond)
	if calls.Load() != 1 {
		t.Fatalf("callback ran %d times", calls.Load())
	}
	j.verify(t)
}

// TestPeerLostFailsEveryRequest: once the engine reports the peer lost on
// one write, requests to that peer that only wait for ACKs fail with the
// same cause instead of waiting for their timeout.
func TestPeerLostFailsEveryRequest(t *testing.T) {
	w := newWorld(t)
	var fe *faultEngine
	var fs *faultScatterer
	cfg := testConfig()
	cfg.RequestTimeout = time.Minute // a timeout would be the wrong cause
	a, b := w.node("a", cfg, withFaultEngine(&fe)), w.node("b", cfg, withHeldScatter(t, &fs))
	j1, j2 := simple(t, a, b, 50), simple(t, a, b, 51)
	connect(t, a, b)
	waiting, err := a.Submit(Request{Peer: "b", Src: j1.src, Dst: j1.dst})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return fs.held.Load() > 0 }) // written, never ACKed
	fe.failWrites.Store(true)
	failing, err := a.Submit(Request{Peer: "b", Src: j2.src, Dst: j2.dst})
	if err != nil {
		t.Fatal(err)
	}
	for _, bt := range []*Batch{failing, waiting} {
		if err := wait(t, bt); !errors.Is(err, transfer.ErrPeerLost) {
			t.Fatalf("batch %d: err = %v, want ErrPeerLost", bt.ID(), err)
		}
	}
}

// TestSilentSenderFlowExpires: a sender that gets its grant and then goes
// silent (it crashed) does not hold the receiver's arena forever.
func TestSilentSenderFlowExpires(t *testing.T) {
	w := newWorld(t)
	cfg := testConfig()
	cfg.RequestTimeout = 100 * time.Millisecond // FlowExpiry defaults to 400ms
	b := w.node("b", cfg)
	im := newImpostor(t, w, b)
	im.grant(t, b, 1, 1<<20)
	if st := b.ArenaStats(); st.FreeBytes == st.Capacity {
		t.Fatal("granted region not held")
	}
	settled(t, b)
	if got := b.Stats().ExpiredFlows; got != 1 {
		t.Fatalf("expired flows = %d, want 1", got)
	}
}

// TestDeregisterRefusedByEngineKeepsMemoryRegistered: when the engine
// refuses a deregister (a write still uses the memory), the agent leaves the
// memory registered everywhere, so the caller may retry and must not free
// it; the retry succeeds once the engine lets go, and only once.
func TestDeregisterRefusedByEngineKeepsMemoryRegistered(t *testing.T) {
	w := newWorld(t)
	var fe *faultEngine
	a := w.node("a", testConfig(), withFaultEngine(&fe))
	buf, err := mem.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	if err := a.RegisterMemory(buf.Desc()); err != nil {
		t.Fatal(err)
	}
	fe.inUse.Store(true)
	if err := a.DeregisterMemory(buf.Desc()); !errors.Is(err, transfer.ErrInUse) {
		t.Fatalf("deregister while the engine uses it: %v, want ErrInUse", err)
	}
	if _, err := a.set.Registry.Find(buf.Desc().Addr, buf.Desc().Len); err != nil {
		t.Fatalf("the stages lost the memory after a refused deregister: %v", err)
	}
	fe.inUse.Store(false)
	if err := a.DeregisterMemory(buf.Desc()); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if err := a.DeregisterMemory(buf.Desc()); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("second deregister: %v, want ErrNotRegistered", err)
	}
}
