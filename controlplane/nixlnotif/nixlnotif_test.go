package nixlnotif

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/engines/ucx"
	"github.com/bouncekv/bounce/transfer"
)

func TestMain(m *testing.M) {
	// Loopback only: never let UCX pick a non-loopback network device.
	if os.Getenv("UCX_NET_DEVICES") == "" {
		os.Setenv("UCX_NET_DEVICES", "lo")
	}
	goleak.VerifyTestMain(m)
}

// hangGuard bounds waits that only end early on success; it detects hangs
// and is not a performance threshold.
const hangGuard = 30 * time.Second

// engineKind makes engines of one in-tree implementation that implements
// transfer.Notifier. Engines made by one factory can load each other.
type engineKind struct {
	name string
	// factory returns a function making named engines, or skips.
	factory func(t *testing.T) func(name string) transfer.Engine
}

func engineKinds() []engineKind {
	return []engineKind{
		{"loopback", func(t *testing.T) func(string) transfer.Engine {
			fab := loopback.NewFabric()
			return func(name string) transfer.Engine {
				e, err := fab.NewEngine(name)
				if err != nil {
					t.Fatalf("loopback engine %q: %v", name, err)
				}
				t.Cleanup(func() { e.Close() })
				return e
			}
		}},
		{"tcp", func(t *testing.T) func(string) transfer.Engine {
			return func(name string) transfer.Engine {
				e, err := tcp.New(tcp.Config{Name: name, Listen: "127.0.0.1:0"})
				if err != nil {
					t.Fatalf("tcp engine %q: %v", name, err)
				}
				t.Cleanup(func() { e.Close() })
				return e
			}
		}},
		{"ucx", func(t *testing.T) func(string) transfer.Engine {
			probe, err := ucx.New(ucx.Config{Name: "probe"})
			if err != nil {
				t.Skipf("ucx unavailable here: %v", err)
			}
			probe.Close()
			return func(name string) transfer.Engine {
				e, err := ucx.New(ucx.Config{Name: name})
				if err != nil {
					t.Fatalf("ucx engine %q: %v", name, err)
				}
				t.Cleanup(func() { e.Close() })
				return e
			}
		}},
	}
}

// forEachEngine runs f once per engine kind.
func forEachEngine(t *testing.T, f func(t *testing.T, newEngine func(string) transfer.Engine)) {
	for _, k := range engineKinds() {
		t.Run(k.name, func(t *testing.T) {
			f(t, k.factory(t))
		})
	}
}

func newChannel(t *testing.T, eng transfer.Engine) *Channel {
	t.Helper()
	c, err := New(eng)
	if err != nil {
		t.Fatalf("New(%s): %v", eng.Name(), err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// pair returns two channels on engines "a" and "b" that have added each
// other.
func pair(t *testing.T, newEngine func(string) transfer.Engine) (a, b *Channel) {
	t.Helper()
	a = newChannel(t, newEngine("a"))
	b = newChannel(t, newEngine("b"))
	if err := a.AddPeer("b", b.LocalEndpoint()); err != nil {
		t.Fatalf("a.AddPeer(b): %v", err)
	}
	if err := b.AddPeer("a", a.LocalEndpoint()); err != nil {
		t.Fatalf("b.AddPeer(a): %v", err)
	}
	return a, b
}

func expectMsg(t *testing.T, c *Channel, peer string, payload []byte) {
	t.Helper()
	m, err := c.Recv(hangGuard)
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	if m.Peer != peer || !bytes.Equal(m.Payload, payload) {
		t.Fatalf("received (%q, %q), want (%q, %q)", m.Peer, m.Payload, peer, payload)
	}
}

func TestRoundTrip(t *testing.T) {
	forEachEngine(t, func(t *testing.T, newEngine func(string) transfer.Engine) {
		a, b := pair(t, newEngine)
		if a.Kind() != "nixlnotif" {
			t.Fatalf("Kind = %q", a.Kind())
		}
		req := []byte{'W', 'A', 'N', 'T', 0, 1, 2, 0xff}
		if err := a.Send("b", req); err != nil {
			t.Fatal(err)
		}
		expectMsg(t, b, "a", req)
		if err := b.Send("a", []byte("GRANT")); err != nil {
			t.Fatal(err)
		}
		expectMsg(t, a, "b", []byte("GRANT"))
		if _, err := a.Recv(0); !errors.Is(err, transfer.ErrTimeout) {
			t.Fatalf("Recv on empty channel = %v, want ErrTimeout", err)
		}
	})
}

func TestOrder(t *testing.T) {
	forEachEngine(t, func(t *testing.T, newEngine func(string) transfer.Engine) {
		a, b := pair(t, newEngine)
		const n = 200 // below every engine's default notification queue
		for i := range n {
			if err := a.Send("b", fmt.Appendf(nil, "m%04d", i)); err != nil {
				t.Fatalf("Send #%d: %v", i, err)
			}
		}
		for i := range n {
			expectMsg(t, b, "a", fmt.Appendf(nil, "m%04d", i))
		}
	})
}

// TestReversePathBootstrap: the receiver hears a sender it never added (the
// first WANT), then adds it from the endpoint the message carried and
// replies.
func TestReversePathBootstrap(t *testing.T) {
	forEachEngine(t, func(t *testing.T, newEngine func(string) transfer.Engine) {
		snd := newChannel(t, newEngine("sender"))
		rcv := newChannel(t, newEngine("receiver"))
		if err := snd.AddPeer("receiver", rcv.LocalEndpoint()); err != nil {
			t.Fatal(err)
		}
		want := []byte(snd.LocalEndpoint())
		if err := snd.Send("receiver", want); err != nil {
			t.Fatal(err)
		}
		m, err := rcv.Recv(hangGuard)
		if err != nil {
			t.Fatal(err)
		}
		if m.Peer != "sender" || !bytes.Equal(m.Payload, want) {
			t.Fatalf("got (%q, %d bytes)", m.Peer, len(m.Payload))
		}
		if err := rcv.AddPeer(m.Peer, string(m.Payload)); err != nil {
			t.Fatal(err)
		}
		if err := rcv.Send("sender", []byte("GRANT")); err != nil {
			t.Fatal(err)
		}
		expectMsg(t, snd, "receiver", []byte("GRANT"))
	})
}

func TestNameMismatchRejected(t *testing.T) {
	forEachEngine(t, func(t *testing.T, newEngine func(string) transfer.Engine) {
		a := newChannel(t, newEngine("a"))
		b := newChannel(t, newEngine("b"))
		err := a.AddPeer("not-b", b.LocalEndpoint())
		if !errors.Is(err, transfer.ErrBadEndpoint) {
			t.Fatalf("AddPeer with b's endpoint as not-b = %v, want ErrBadEndpoint", err)
		}
		if err := a.Send("not-b", []byte("x")); !errors.Is(err, transfer.ErrUnknownPeer) {
			t.Fatalf("Send to rejected peer = %v, want ErrUnknownPeer", err)
		}
		if err := a.Send("b", []byte("x")); !errors.Is(err, transfer.ErrUnknownPeer) {
			t.Fatalf("Send to never-added b = %v, want ErrUnknownPeer", err)
		}
	})
}

func TestBadEndpointRejected(t *testing.T) {
	forEachEngine(t, func(t *testing.T, newEngine func(string) transfer.Engine) {
		a := newChannel(t, newEngine("a"))
		b := newChannel(t, newEngine("b"))
		good := b.LocalEndpoint()
		md, err := base64.RawURLEncoding.DecodeString(good)
		if err != nil {
			t.Fatalf("LocalEndpoint %q is not base64url: %v", good, err)
		}
		bad := map[string]string{
			"empty":             "",
			"not base64":        "!!not base64!!",
			"zmq endpoint":      "tcp://127.0.0.1:5555",
			"padded":            base64.URLEncoding.EncodeToString(md) + "==",
			"std alphabet":      "+/+/",
			"garbage metadata":  base64.RawURLEncoding.EncodeToString([]byte("garbage")),
			"truncated":         base64.RawURLEncoding.EncodeToString(md[:len(md)/2]),
			"trailing bytes":    base64.RawURLEncoding.EncodeToString(append(bytes.Clone(md), 0xde, 0xad)),
			"one byte metadata": base64.RawURLEncoding.EncodeToString([]byte{0}),
		}
		for what, ep := range bad {
			if ep == good {
				continue // e.g. the padded form of a length that needs none
			}
			if err := a.AddPeer("b", ep); !errors.Is(err, transfer.ErrBadEndpoint) {
				t.Errorf("%s: AddPeer(b, %.40q) = %v, want ErrBadEndpoint", what, ep, err)
			}
		}
		if err := a.AddPeer("", good); !errors.Is(err, transfer.ErrBadEndpoint) {
			t.Errorf("AddPeer with empty name = %v, want ErrBadEndpoint", err)
		}
		if err := a.Send("b", []byte("x")); !errors.Is(err, transfer.ErrUnknownPeer) {
			t.Fatalf("Send after only bad AddPeers = %v, want ErrUnknownPeer", err)
		}
		// The good endpoint still works after the bad ones.
		if err := a.AddPeer("b", good); err != nil {
			t.Fatal(err)
		}
		if err := a.Send("b", []byte("ok")); err != nil {
			t.Fatal(err)
		}
		expectMsg(t, b, "a", []byte("ok"))
	})
}

// TestBadMetadataCauseKept: the engine's own error stays visible.
func TestBadMetadataCauseKept(t *testing.T) {
	a := newChannel(t, mustLoopback(t, loopback.NewFabric(), "a"))
	err := a.AddPeer("b", base64.RawURLEncoding.EncodeToString([]byte("garbage")))
	if !errors.Is(err, transfer.ErrBadEndpoint) || !errors.Is(err, transfer.ErrBadMetadata) {
		t.Fatalf("AddPeer(garbage) = %v, want ErrBadEndpoint and ErrBadMetadata", err)
	}
}

func mustLoopback(t *testing.T, fab *loopback.Fabric, name string, opts ...loopback.Options) *loopback.Engine {
	t.Helper()
	e, err := fab.NewEngine(name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// plainEngine hides every method but those of transfer.Engine.
type plainEngine struct{ transfer.Engine }

func TestNonNotifierRejected(t *testing.T) {
	e := mustLoopback(t, loopback.NewFabric(), "a")
	if _, err := New(plainEngine{e}); !errors.Is(err, transfer.ErrUnsupported) {
		t.Fatalf("New(non-Notifier) = %v, want ErrUnsupported", err)
	}
	if _, err := New(nil); !errors.Is(err, transfer.ErrUnsupported) {
		t.Fatalf("New(nil) = %v, want ErrUnsupported", err)
	}
}

func TestRemovePeerKeepsEngine(t *testing.T) {
	forEachEngine(t, func(t *testing.T, newEngine func(string) transfer.Engine) {
		a, b := pair(t, newEngine)
		if err := a.RemovePeer("b"); err != nil {
			t.Fatal(err)
		}
		if err := a.Send("b", []byte("x")); !errors.Is(err, transfer.ErrUnknownPeer) {
			t.Fatalf("Send after RemovePeer = %v, want ErrUnknownPeer", err)
		}
		if err := a.RemovePeer("b"); !errors.Is(err, transfer.ErrUnknownPeer) {
			t.Fatalf("second RemovePeer = %v, want ErrUnknownPeer", err)
		}
		// The engine still knows b (no ForgetPeer), and b is still heard.
		if err := a.eng.Notify("b", []byte("engine")); err != nil {
			t.Fatalf("engine Notify after channel RemovePeer: %v", err)
		}
		expectMsg(t, b, "a", []byte("engine"))
		if err := b.Send("a", []byte("from b")); err != nil {
			t.Fatal(err)
		}
		expectMsg(t, a, "b", []byte("from b"))
	})
}

func TestQueueFullPropagates(t *testing.T) {
	fab := loopback.NewFabric()
	a := newChannel(t, mustLoopback(t, fab, "a"))
	b := newChannel(t, mustLoopback(t, fab, "b", loopback.Options{InboxSize: 2}))
	if err := a.AddPeer("b", b.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := a.Send("b", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Send("b", []byte{2}); !errors.Is(err, transfer.ErrQueueFull) {
		t.Fatalf("Send to a full inbox = %v, want ErrQueueFull", err)
	}
	expectMsg(t, b, "a", []byte{0})
	expectMsg(t, b, "a", []byte{1})
}

func TestCloseLeavesEngineOpen(t *testing.T) {
	forEachEngine(t, func(t *testing.T, newEngine func(string) transfer.Engine) {
		a, b := pair(t, newEngine)
		for range 2 {
			if err := a.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
		}
		checks := map[string]error{
			"Send":       a.Send("b", []byte("x")),
			"AddPeer":    a.AddPeer("b", b.LocalEndpoint()),
			"RemovePeer": a.RemovePeer("b"),
		}
		_, checks["Recv"] = a.Recv(hangGuard)
		for op, err := range checks {
			if !errors.Is(err, transfer.ErrClosed) {
				t.Errorf("%s after Close = %v, want ErrClosed", op, err)
			}
		}
		// The engine is not the channel's: it still works.
		if _, err := a.eng.Metadata(); err != nil {
			t.Fatalf("engine Metadata after channel Close: %v", err)
		}
		if err := a.eng.Notify("b", []byte("still open")); err != nil {
			t.Fatalf("engine Notify after channel Close: %v", err)
		}
		expectMsg(t, b, "a", []byte("still open"))
	})
}

func TestCloseWakesRecv(t *testing.T) {
	a := newChannel(t, mustLoopback(t, loopback.NewFabric(), "a"))
	res := make(chan error, 1)
	go func() {
		_, err := a.Recv(time.Hour)
		res <- err
	}()
	// Let Recv park in the engine first, so the close check is what ends it.
	time.Sleep(3 * closeCheckInterval)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res:
		if !errors.Is(err, transfer.ErrClosed) {
			t.Fatalf("Recv across Close = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second): // far below Recv's hour, far above closeCheckInterval
		t.Fatal("a parked Recv did not notice Close")
	}
}

func TestEngineClosedUnderneath(t *testing.T) {
	e := mustLoopback(t, loopback.NewFabric(), "a")
	a := newChannel(t, e)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Recv(hangGuard); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("Recv on closed engine = %v, want ErrClosed", err)
	}
	if ep := a.LocalEndpoint(); ep != "" {
		t.Fatalf("LocalEndpoint of closed engine = %q, want empty", ep)
	}
}

func TestRecvHugeTimeoutStillWaits(t *testing.T) {
	fab := loopback.NewFabric()
	a := newChannel(t, mustLoopback(t, fab, "a"))
	b := newChannel(t, mustLoopback(t, fab, "b"))
	if err := b.AddPeer("a", a.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		_, err := a.Recv(time.Duration(1<<63 - 1))
		res <- err
	}()
	if err := b.Send("a", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil {
		t.Fatalf("Recv(max duration) = %v, want the message", err)
	}
}

// TestMaxMessageSizeIsTheEngines: the channel states its engine's
// notification limit, a message of exactly that size travels and one byte
// more is refused by the engine; an engine with no limit states 0.
func TestMaxMessageSizeIsTheEngines(t *testing.T) {
	fab := loopback.NewFabric()
	if got := newChannel(t, mustLoopback(t, fab, "free")).MaxMessageSize(); got != 0 {
		t.Fatalf("MaxMessageSize without a limit = %d, want 0", got)
	}
	const limit = 1000
	a := newChannel(t, mustLoopback(t, fab, "a", loopback.Options{MaxNotifySize: limit}))
	b := newChannel(t, mustLoopback(t, fab, "b"))
	if got := a.MaxMessageSize(); got != limit {
		t.Fatalf("MaxMessageSize = %d, want %d", got, limit)
	}
	if err := a.AddPeer("b", b.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	full := bytes.Repeat([]byte{7}, limit)
	if err := a.Send("b", full); err != nil {
		t.Fatalf("Send of %d bytes: %v", limit, err)
	}
	expectMsg(t, b, "a", full)
	if err := a.Send("b", append(full, 8)); err == nil {
		t.Fatalf("Send of %d bytes over a %d-byte limit succeeded", limit+1, limit)
	}
	for _, k := range engineKinds()[1:] {
		t.Run(k.name, func(t *testing.T) {
			c := newChannel(t, k.factory(t)("x"))
			if c.MaxMessageSize() <= 0 {
				t.Fatalf("%s engine states no notification limit", k.name)
			}
		})
	}
}
