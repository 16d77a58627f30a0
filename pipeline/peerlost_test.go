package pipeline

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bouncekv/bounce/controlplane/zmq"
	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/stages/write"
	"github.com/bouncekv/bounce/transfer"
)

// stallWriter passes writes to the engine until stall is set; then every
// write stays pending (a sender frozen mid-transfer, about to be killed).
type stallWriter struct {
	w     transfer.Writer
	stall atomic.Bool
}

func (s *stallWriter) Write(peer string, src, dst transfer.Desc) (transfer.Op, error) {
	if s.stall.Load() {
		return pendingOp{}, nil
	}
	return s.w.Write(peer, src, dst)
}

// TestPeerLostReclaimsFlows: a sender holding granted regions on the
// receiver dies (its control channel and engine closed at once, as kill -9
// leaves them). The receiver's tcp engine reports the peer lost and the
// receiver reclaims the flow in well under a second, not after its expiry
// (4 × the request timeout, 20 s here); the next sender is unaffected.
func TestPeerLostReclaimsFlows(t *testing.T) {
	w := tcpZMQWorld(t)
	cfg := testConfig()
	var sw *stallWriter
	s := w.node("s", cfg, func(set *Settings) {
		sw = &stallWriter{w: write.New(set.Engine)}
		set.Writer = sw
	})
	r, next := w.node("r", cfg), w.node("next", cfg)
	connect(t, s, r, next)
	killed := dieHoldingGrant(t, s, sw, r)
	awaitReclaimed(t, r, killed, 5*time.Second, "the sender died")
	// r loaded s, so it reports both its incoming and its outgoing
	// connections lost.
	if n := r.Stats().LostPeers; n < 1 || n > 2 {
		t.Fatalf("LostPeers = %d, want 1 or 2", n)
	}
	served(t, next, r, 3)
}

// TestPeerLostBeforeFirstWrite: a sender dies holding a grant it never
// wrote, its very first request to the receiver. The connection its engine
// opened when the request started (transfer.Connector; LoadPeer dials
// nothing) is what tells the receiver, which reclaims the flow at once.
func TestPeerLostBeforeFirstWrite(t *testing.T) {
	w := tcpZMQWorld(t)
	cfg := testConfig()
	s := stalledSender(w, "s", cfg)
	r := w.node("r", cfg)
	connect(t, s, r)
	j := simple(t, s, r, 1)
	if _, err := s.Submit(Request{Peer: "r", Src: j.src, Dst: j.dst}); err != nil {
		t.Fatal(err)
	}
	awaitGranted(t, r)
	deadline := time.Now().Add(20 * time.Second)
	// The sender dies once its connection is up (the receiver's engine
	// named it): killed earlier, inside that round trip, the engine has
	// nothing to report, and the control channel's report is what reclaims
	// the flow (TestSenderDeadBeforeFirstGrantReclaimed).
	for r.eng.(*tcp.Engine).Stats().IncomingConns == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the sender's engine never connected to the receiver before its first write")
		}
		time.Sleep(time.Millisecond)
	}
	killed := time.Now()
	s.ctrl.Close()
	s.eng.Close()
	awaitReclaimed(t, r, killed, 10*time.Second, "the sender died")
	conserve(t, r)
	// The sender's gathers read j's buffers, which the test frees first.
	s.close(t)
}

// TestControlPeerLostReclaimsFlows: a sender's control channel dies (its
// process would be killed) while it holds a grant, over an engine that
// reports no loss (loopback). The receiver's zmq channel sees its
// connection to the sender drop (socket monitor) and the receiver
// reclaims the flow at once instead of at its expiry (20 s here).
func TestControlPeerLostReclaimsFlows(t *testing.T) {
	w := zmqWorld(t, 0)
	cfg := testConfig()
	s := stalledSender(w, "s", cfg)
	r := w.node("r", cfg)
	connect(t, s, r)
	j := simple(t, s, r, 1)
	if _, err := s.Submit(Request{Peer: "r", Src: j.src, Dst: j.dst}); err != nil {
		t.Fatal(err)
	}
	awaitGranted(t, r)
	killed := time.Now()
	s.ctrl.Close()
	awaitReclaimed(t, r, killed, 10*time.Second, "the sender's control channel died")
	if n := r.Stats().LostPeers; n != 1 {
		t.Fatalf("LostPeers = %d, want 1", n)
	}
	conserve(t, r)
	// The sender's gathers read j's buffers, which the test frees first.
	s.close(t)
}

// rawZMQSender is a zmq control channel named "s" that speaks to r with
// no agent behind it (the test plays the sender's messages).
func rawZMQSender(t *testing.T, r *node) *zmq.Channel {
	t.Helper()
	s, err := zmq.New(zmq.Config{Name: "s", BindAddress: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.AddPeer("r", r.ctrl.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSenderDeadBeforeFirstGrantReclaimed: a sender dies after its WANT
// and before the receiver's first control connection to it is up (the
// GRANT dials it), with no engine connection either (loopback reports
// nothing): the receiver's failed dial to the endpoint the WANT named
// reports the sender lost, and its flow is reclaimed at once, not at its
// expiry (20 s here).
func TestSenderDeadBeforeFirstGrantReclaimed(t *testing.T) {
	w := zmqWorld(t, 0)
	r := w.node("r", testConfig())
	s := rawZMQSender(t, r)
	// The endpoint the sender's WANT names: bound, then gone with its
	// process.
	dead, err := zmq.New(zmq.Config{Name: "s", BindAddress: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	endpoint := dead.LocalEndpoint()
	if err := dead.Close(); err != nil {
		t.Fatal(err)
	}
	im := &impostor{ch: s}
	died := time.Now()
	im.send(t, "r", &wire.Want{Request: 1, ChunkBytes: []uint64{64 << 10}, Endpoint: endpoint})
	eventually(t, func() bool { return r.Stats().LostPeers == 1 })
	awaitReclaimed(t, r, died, 10*time.Second, "the sender died")
	conserve(t, r)
}

// TestUnreachedSenderReclaimed: a sender whose loss is never reported —
// the endpoint its WANT names accepts the receiver's control connection
// and never completes the handshake (a host that stopped answering; a kill
// as the connection came up that no event reports), and no engine
// connection exists to break — held its granted flow until flow expiry
// (2 min here; 4 × request_timeout = 2 min by default). The receiver now
// handles a sender whose control path stayed without a handshake for
// UnreachedGrace (1 s here) while its flow held grants as lost.
func TestUnreachedSenderReclaimed(t *testing.T) {
	w := zmqWorld(t, 0)
	cfg := testConfig()
	cfg.FlowExpiry, cfg.UnreachedGrace = 2*time.Minute, time.Second
	r := w.node("r", cfg)
	s := rawZMQSender(t, r)
	// The endpoint the WANT names: the kernel accepts connections there
	// (the listen backlog) and nothing ever answers.
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	im := &impostor{ch: s}
	sent := time.Now()
	im.send(t, "r", &wire.Want{Request: 1, ChunkBytes: []uint64{64 << 10}, Endpoint: "tcp://" + hole.Addr().String()})
	awaitGranted(t, r)
	awaitReclaimed(t, r, sent, 30*time.Second, "the WANT of a sender whose control path never comes up")
	if n := r.Stats().LostPeers; n != 1 {
		t.Fatalf("LostPeers = %d, want 1 (the unreached sender)", n)
	}
	conserve(t, r)
}

// TestPeerLostFailsWaitingRequests: a receiver dies while the sender's
// request waits for its GRANT (no write in flight to fail). The sender's
// engine reports the receiver lost (its first connection, opened when the
// request started, broke) and the request fails with ErrPeerLost at once, not at
// its 5 s timeout.
func TestPeerLostFailsWaitingRequests(t *testing.T) {
	w := tcpZMQWorld(t)
	cfg := testConfig()
	s, r := w.node("s", cfg), w.node("r", cfg)
	connect(t, s, r)
	j := simple(t, s, r, 1)
	// r never answers: its control channel is gone before the WANT.
	r.ctrl.Close()
	b, err := s.Submit(Request{Peer: "r", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	killed := time.Now()
	r.eng.Close()
	select {
	case <-b.Done():
	case <-time.After(3 * time.Second):
		t.Fatalf("the request waiting for a GRANT from a dead receiver is unresolved 3 s later (timeout %v)", cfg.RequestTimeout)
	}
	if err := b.Err(); !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("err %v, want ErrPeerLost", err)
	}
	if _, quiet := b.Retirement(); !quiet {
		t.Fatal("not quiescent")
	}
	t.Logf("resolved %v after the receiver died: %v", time.Since(killed), b.Err())
}

// dieHoldingGrant moves one request from s to r (which opens s's
// connections), then stalls s's writer (sw), submits a second request,
// waits until r granted it, and kills s (its control channel and engine
// closed at once, as kill -9 leaves them). It returns when s died.
func dieHoldingGrant(t *testing.T, s *node, sw *stallWriter, r *node) time.Time {
	t.Helper()
	j := simple(t, s, r, 1)
	b, err := s.Submit(Request{Peer: r.Name(), Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, b); err != nil {
		t.Fatal(err)
	}
	j.verify(t)
	// The second one is granted and never written.
	sw.stall.Store(true)
	j2 := simple(t, s, r, 2)
	if _, err := s.Submit(Request{Peer: r.Name(), Src: j2.src, Dst: j2.dst}); err != nil {
		t.Fatal(err)
	}
	awaitGranted(t, r)
	killed := time.Now()
	s.ctrl.Close()
	s.eng.Close()
	return killed
}

// served checks that next moves one request (seed) to r byte-exact and
// that r's arena is conserved: a survivor keeps serving.
func served(t *testing.T, next, r *node, seed uint64) {
	t.Helper()
	jn := simple(t, next, r, seed)
	b, err := next.Submit(Request{Peer: r.Name(), Src: jn.src, Dst: jn.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, b); err != nil {
		t.Fatal(err)
	}
	jn.verify(t)
	conserve(t, r)
}

// stalledSender is a node whose writes never start (its Writer stalls):
// its requests hold their grants on the receiver.
func stalledSender(w *world, name string, cfg Config) *node {
	return w.node(name, cfg, func(set *Settings) {
		sw := &stallWriter{w: write.New(set.Engine)}
		sw.stall.Store(true)
		set.Writer = sw
	})
}

// awaitGranted waits until r holds arena bytes for a stalled request.
func awaitGranted(t *testing.T, r *node) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for r.ArenaStats().HeldBytes == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the receiver never granted the stalled request")
		}
		time.Sleep(time.Millisecond)
	}
}

// awaitReclaimed waits until r holds no flow and no arena bytes, at most
// within after since (what happened then: "the sender died"), and logs how
// long it took.
func awaitReclaimed(t *testing.T, r *node, since time.Time, within time.Duration, what string) {
	t.Helper()
	for {
		st := r.ArenaStats()
		if st.HeldBytes == 0 && st.Flows == 0 {
			break
		}
		if time.Since(since) > within {
			t.Fatalf("%v after %s the receiver still holds its flow: %+v (lost peers %d; flow expiry %v)",
				within, what, st, r.Stats().LostPeers, 4*r.cfg.RequestTimeout)
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("flow reclaimed %v after %s", time.Since(since), what)
}

// loadInto loads b's descriptor into a only (a sends to b; b learns a from
// its WANTs and its engine connections).
func loadInto(t testing.TB, a, b *node) {
	t.Helper()
	blob, err := b.Descriptor()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.LoadPeer(blob); err != nil {
		t.Fatal(err)
	}
}

// TestLostSenderFencedReleasesAtOnce is the quarantine burst: senders
// killed holding grants left their regions quarantined for the whole
// quarantine (192 of 256 MiB after three kills with defaults). The tcp
// engine fences a forgotten peer, so the receiver fences each lost sender
// it only learned and releases its regions as soon as the fence holds,
// not after the quarantine (1 min here); the next senders get the whole
// arena.
func TestLostSenderFencedReleasesAtOnce(t *testing.T) {
	w := tcpZMQWorld(t)
	cfg := testConfig()
	cfg.Quarantine = time.Minute
	r := w.node("r", cfg)
	for round := range 3 {
		s := stalledSender(w, fmt.Sprintf("victim-%d", round), cfg)
		loadInto(t, s, r)
		j := simple(t, s, r, uint64(1+round))
		if _, err := s.Submit(Request{Peer: "r", Src: j.src, Dst: j.dst}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for r.ArenaStats().HeldBytes == 0 || r.eng.(*tcp.Engine).Stats().IncomingConns == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the receiver never granted the stalled request (or the sender never connected)", round)
			}
			time.Sleep(time.Millisecond)
		}
		held := r.ArenaStats().HeldBytes
		killed := time.Now()
		s.ctrl.Close()
		s.eng.Close()
		for {
			st, as := r.Stats(), r.ArenaStats()
			if as.FreeBytes == as.Capacity && as.Flows == 0 && st.QuarantinedBytes == 0 {
				break
			}
			if time.Since(killed) > 10*time.Second {
				t.Fatalf("round %d: 10 s after the sender died the receiver holds %+v, quarantined %d B (quarantine %v)", round, as, st.QuarantinedBytes, cfg.Quarantine)
			}
			time.Sleep(time.Millisecond)
		}
		t.Logf("round %d: %d B the dead sender held free again %v after the kill", round, held, time.Since(killed))
		s.close(t)
	}
	if n := r.Stats().FencedReleases; n == 0 {
		t.Fatal("FencedReleases = 0")
	}
	// The fence holds: the dead senders stay refused for the quarantine.
	if n := r.eng.(*tcp.Engine).Stats().Fenced; n != 3 {
		t.Fatalf("the receiver's engine fences %d names, want the 3 dead senders", n)
	}
	next := w.node("next", cfg)
	loadInto(t, next, r)
	jn := simple(t, next, r, 9)
	b, err := next.Submit(Request{Peer: "r", Src: jn.src, Dst: jn.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, b); err != nil {
		t.Fatal(err)
	}
	jn.verify(t)
	// A dead sender restarted under its name and loaded by the receiver
	// is trusted again at once: loading lifts the engine's fence, and its
	// WANTs must no longer be dropped for the rest of the quarantine.
	again := w.node("victim-0", cfg)
	loadInto(t, again, r)
	loadInto(t, r, again)
	ja := simple(t, again, r, 11)
	ba, err := again.Submit(Request{Peer: "r", Src: ja.src, Dst: ja.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, ba); err != nil {
		t.Fatalf("the restarted sender the receiver loaded again: %v", err)
	}
	if ba.Route() != RouteBounce {
		t.Fatalf("the restarted sender's request took %v (%s)", ba.Route(), ba.RouteReason())
	}
	ja.verify(t)
	conserve(t, r)
}

// syncBuffer is a log sink the reactor writes while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// awaitLogLine waits (bounded) for a line of logs containing every one
// of want and returns it.
func awaitLogLine(t *testing.T, logs *syncBuffer, want ...string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		for _, line := range strings.Split(logs.String(), "\n") {
			all := true
			for _, w := range want {
				all = all && strings.Contains(line, w)
			}
			if all {
				return line
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q within 20s:\n%s", want, logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLostSenderLogLevel: a sender lost while its flow only waits for a
// grant (another sender holds the whole arena) held nothing on the
// receiver: the reclaim is logged at Debug with regions=0, not warned. The
// sender lost while holding the arena is still warned, naming its regions.
func TestLostSenderLogLevel(t *testing.T) {
	msg := "flows reclaimed: their sender is lost"
	logs := &syncBuffer{}
	w := zmqWorld(t, 0)
	cfg := testConfig()
	rcfg := cfg
	rcfg.MaxArenaShare = 1   // one sender may hold the whole arena,
	rcfg.ArenaSize = 4 << 20 // which is MaxInflight (4) chunks: one flow's most
	holder := stalledSender(w, "holder", cfg)
	waiter := w.node("waiter", cfg)
	r := w.node("r", rcfg, func(set *Settings) {
		set.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	connect(t, holder, waiter, r)
	// holder is granted the whole arena and never writes.
	src, dst := holder.buffer(t, cfg.ArenaSize), r.buffer(t, cfg.ArenaSize)
	j := prepare(src, dst, kvLayout{count: int(cfg.ArenaSize / 4096), size: 4096, fragmented: true}, 1)
	if _, err := holder.Submit(Request{Peer: "r", Src: j.src, Dst: j.dst}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for r.ArenaStats().HeldBytes < rcfg.ArenaSize {
		if time.Now().After(deadline) {
			t.Fatalf("holder never held the whole arena: %+v", r.ArenaStats())
		}
		time.Sleep(time.Millisecond)
	}
	// waiter's flow is open on r, waiting for credits.
	jw := simple(t, waiter, r, 2)
	if _, err := waiter.Submit(Request{Peer: "r", Src: jw.src, Dst: jw.dst}); err != nil {
		t.Fatal(err)
	}
	for r.ArenaStats().Flows < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("waiter's flow never opened on the receiver: %+v", r.ArenaStats())
		}
		time.Sleep(time.Millisecond)
	}
	waiter.ctrl.Close()
	line := awaitLogLine(t, logs, msg, "peer=waiter")
	if !strings.Contains(line, "level=DEBUG") || !strings.Contains(line, "regions=0") {
		t.Fatalf("reclaim of a sender holding nothing logged as %q, want level=DEBUG with regions=0", line)
	}
	holder.ctrl.Close()
	line = awaitLogLine(t, logs, msg, "peer=holder")
	if !strings.Contains(line, "level=WARN") || strings.Contains(line, "regions=0") {
		t.Fatalf("reclaim of a sender holding the arena logged as %q, want level=WARN with its regions", line)
	}
	holder.close(t)
	waiter.close(t)
}

// TestSubmitToLostPeerFails: the receiver's control channel dies and the
// sender's socket monitor reports it lost while no request is in flight.
// A request submitted afterwards (the next pass of `bounce send --repeat`,
// or one whose source was still being filled at the kill) fails as lost
// within about a second (lostPeerGrace), not at its request timeout: no
// second loss report comes for it.
func TestSubmitToLostPeerFails(t *testing.T) {
	w := zmqWorld(t, 0)
	cfg := testConfig()
	cfg.RequestTimeout = 20 * time.Second
	s, r := w.node("s", cfg), w.node("r", cfg)
	connect(t, s, r)
	served(t, s, r, 1) // the connection is up (handshake done)
	r.ctrl.Close()
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().LostPeers == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the sender's control channel never reported the receiver lost")
		}
		time.Sleep(time.Millisecond)
	}
	j := simple(t, s, r, 2)
	submitted := time.Now()
	b, err := s.Submit(Request{Peer: "r", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.Done():
	case <-time.After(cfg.RequestTimeout / 2):
		t.Fatalf("a request to a receiver reported lost is unresolved %v later (timeout %v)", cfg.RequestTimeout/2, cfg.RequestTimeout)
	}
	if err := b.Err(); !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("err %v, want ErrPeerLost", err)
	}
	if _, quiet := b.Retirement(); !quiet {
		t.Fatal("not quiescent")
	}
	t.Logf("resolved %v after submit: %v", time.Since(submitted), b.Err())
}

// TestRequireBounceRefusesUnmappableArena: an arena that cannot be
// allocated turns bounce off (every transfer direct, the reason given),
// unless Settings.RequireBounce: then New fails, wrapping
// ErrBounceUnavailable and naming the arena's error.
func TestRequireBounceRefusesUnmappableArena(t *testing.T) {
	w := newWorld(t)
	var set Settings
	a := w.node("a", testConfig(), func(s *Settings) {
		s.NewArena = func(name string, size uint64) (Arena, error) {
			return nil, fmt.Errorf("mmap %d bytes: cannot allocate memory", size)
		}
		set = *s
	})
	if on, why := a.BounceEnabled(); on || !strings.Contains(why, "cannot allocate memory") {
		t.Fatalf("BounceEnabled = %v, %q; want off, naming the arena's error", on, why)
	}
	set.RequireBounce = true
	b, err := New(set, testConfig())
	if err == nil {
		b.Shutdown(t.Context())
		t.Fatal("New with RequireBounce and an unmappable arena succeeded")
	}
	if !errors.Is(err, ErrBounceUnavailable) || !strings.Contains(err.Error(), "cannot allocate memory") {
		t.Fatalf("err %v, want ErrBounceUnavailable naming the arena's error", err)
	}
}
