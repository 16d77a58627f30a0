package pipeline

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/controlplane/zmq"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// TestHandshakeMatrix loads a real receiver's descriptor with one handshake
// field altered at a time and checks the route, and that an incompatible peer
// never receives a WANT.
func TestHandshakeMatrix(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(d *wire.AgentDesc)
		bounce bool
		reason string
	}{
		{"same", func(*wire.AgentDesc) {}, true, ""},
		{"other-version", func(d *wire.AgentDesc) { d.Handshake.Version++ }, false, "wire version"},
		{"other-control-kind", func(d *wire.AgentDesc) { d.Handshake.ControlKind = "zmq" }, false, "control plane \"inproc\" here vs \"zmq\" on b"},
		{"other-max-chunk", func(d *wire.AgentDesc) { d.Handshake.MaxChunk /= 2 }, false, "max chunk 1 MiB here vs 512 KiB on b"},
		{"no-handshake", func(d *wire.AgentDesc) { d.Handshake = nil }, false, "no bounce handshake"},
		{"malformed-handshake", func(d *wire.AgentDesc) { d.Handshake.Endpoint = "" }, false, "malformed handshake"},
		{"bad-endpoint", func(d *wire.AgentDesc) { d.Handshake.Endpoint = "inproc://nobody" }, false, "endpoint unusable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			a, b := w.node("a", testConfig()), w.node("b", testConfig())
			j := simple(t, a, b, 20)
			blob, err := b.Descriptor()
			if err != nil {
				t.Fatal(err)
			}
			d, err := wire.UnmarshalAgentDesc(blob)
			if err != nil {
				t.Fatal(err)
			}
			tc.mutate(&d)
			if _, err := a.LoadPeer(wire.MarshalAgentDesc(d)); err != nil {
				t.Fatal(err)
			}
			on, reason, known := a.PeerRoute("b")
			if !known || on != tc.bounce || !strings.Contains(reason, tc.reason) {
				t.Fatalf("PeerRoute = (%v, %q, %v), want bounce=%v with reason containing %q", on, reason, known, tc.bounce, tc.reason)
			}
			bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
			if err != nil {
				t.Fatal(err)
			}
			if err := wait(t, bt); err != nil {
				t.Fatal(err)
			}
			j.verify(t)
			wantRoute := RouteDirect
			if tc.bounce {
				wantRoute = RouteBounce
			}
			if bt.Route() != wantRoute {
				t.Fatalf("route = %v (%s)", bt.Route(), bt.RouteReason())
			}
			if !tc.bounce && (a.Stats().Wants != 0 || b.Stats().Grants != 0) {
				t.Fatalf("incompatible peer saw WANTs: sent %d, granted %d", a.Stats().Wants, b.Stats().Grants)
			}
			if !tc.bounce && a.Stats().IncompatiblePeers != 1 {
				t.Fatalf("incompatible peers = %d, want 1", a.Stats().IncompatiblePeers)
			}
		})
	}
	t.Run("malformed-blob", func(t *testing.T) {
		w := newWorld(t)
		a, b := w.node("a", testConfig()), w.node("b", testConfig())
		blob, err := b.Descriptor()
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range [][]byte{nil, blob[:len(blob)/2], append([]byte{0xff}, blob[1:]...)} {
			if _, err := a.LoadPeer(bad); !errors.Is(err, transfer.ErrBadMetadata) {
				t.Fatalf("LoadPeer(malformed) err = %v, want ErrBadMetadata", err)
			}
		}
		if _, _, known := a.PeerRoute("b"); known {
			t.Fatal("a malformed blob registered the peer")
		}
		if a.Stats().BadPeerDescriptors != 3 {
			t.Fatalf("bad peer descriptors = %d", a.Stats().BadPeerDescriptors)
		}
	})
	t.Run("no-usable-endpoint-advertises-nothing", func(t *testing.T) {
		w := newWorld(t)
		n := w.node("a", testConfig(), func(s *Settings) { s.Control = noEndpoint{s.Control} })
		if n.Handshake() != nil {
			t.Fatal("an agent without an endpoint advertised a handshake")
		}
		if on, why := n.BounceEnabled(); on || !strings.Contains(why, "endpoint") {
			t.Fatalf("BounceEnabled = %v, %q", on, why)
		}
	})
}

type noEndpoint struct{ transfer.ControlChannel }

func (noEndpoint) LocalEndpoint() string { return "" }

func zmqWorld(t testing.TB, hwm int) *world {
	w := newWorld(t)
	w.ctrl = func(t testing.TB, name string, _ transfer.Engine) transfer.ControlChannel {
		ch, err := zmq.New(zmq.Config{Name: name, BindAddress: "127.0.0.1", SendHWM: hwm})
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}
	return w
}

// TestStalledPeerDoesNotBlock: a peer that stops reading fills its zmq queue;
// its requests fail by timeout while another peer keeps flowing.
func TestStalledPeerDoesNotBlock(t *testing.T) {
	w := zmqWorld(t, 4)
	cfg := shortTimeouts()
	cfg.RequestTimeout = time.Second
	a, b, s := w.node("a", cfg), w.node("b", cfg), w.node("stalled", cfg)
	connect(t, a, b, s)
	if err := s.Shutdown(t.Context()); err != nil { // its socket stays open, unread
		t.Fatal(err)
	}
	jb := simple(t, a, b, 30)
	src := a.buffer(t, 1<<20)
	dsts := s.buffer(t, 1<<20)
	var stalled []*Batch
	for i := 0; i < 64; i++ {
		js := prepare(src, dsts, kvLayout{count: 256, size: 4096}, uint64(31+i))
		bt, err := a.Submit(Request{Peer: "stalled", Src: js.src, Dst: js.dst})
		if err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, bt)
	}
	good, err := a.Submit(Request{Peer: "b", Src: jb.src, Dst: jb.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, good); err != nil {
		t.Fatalf("healthy peer blocked by a stalled one: %v", err)
	}
	jb.verify(t)
	for _, bt := range stalled {
		if err := wait(t, bt); err == nil {
			t.Fatal("request to a stalled peer succeeded")
		} else if !errors.Is(err, transfer.ErrTimeout) && !errors.Is(err, transfer.ErrQueueFull) {
			t.Fatalf("stalled request failed with %v, want a timeout or a full queue", err)
		}
	}
}

// TestReconnectSameIdentity: a forgotten peer that comes back under the same
// name (a restarted process) is served again over zmq.
func TestReconnectSameIdentity(t *testing.T) {
	w := zmqWorld(t, 0)
	a := w.node("a", testConfig())
	b1 := w.node("b", testConfig())
	connect(t, a, b1)
	j := simple(t, a, b1, 40)
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	if err := a.ForgetPeer("b"); err != nil {
		t.Fatal(err)
	}
	b1.close(t)
	b2 := w.node("b", testConfig())
	connect(t, a, b2)
	j2 := simple(t, a, b2, 41)
	bt, err = a.Submit(Request{Peer: "b", Src: j2.src, Dst: j2.dst})
	if err != nil {
		t.Fatal(err)
	}
	if bt.Route() != RouteBounce {
		t.Fatalf("route %v: %s", bt.Route(), bt.RouteReason())
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	j2.verify(t)
	settled(t, a, b2)
}
