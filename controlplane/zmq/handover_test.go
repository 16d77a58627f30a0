package zmq

import (
	"fmt"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"
)

// readUntil reads c until a message with payload want from peer arrives,
// within hangGuard, and returns how many other messages it read first.
func readUntil(t *testing.T, c *Channel, peer, want string) int {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	others := 0
	for time.Now().Before(deadline) {
		m, err := c.Recv(100 * time.Millisecond)
		if err != nil {
			continue
		}
		if m.Peer == peer && string(m.Payload) == want {
			return others
		}
		if m.Peer != peer {
			t.Fatalf("message from %q, want only %q", m.Peer, peer)
		}
		others++
	}
	t.Fatalf("%q from %q never read within %v (%d others read)", want, peer, hangGuard, others)
	return others
}

// TestReaddedPeerWhileBusy: while the receiver is busy (reads nothing), a
// peer removes and re-adds it (a new DEALER), or restarts under its name
// (a new channel), and sends again. Every DEALER's routing id is unique
// to its incarnation, so the new connection is a pipe of its own, not a
// ROUTER_HANDOVER of the old one's identity: its messages are read, and
// named after the peer.
func TestReaddedPeerWhileBusy(t *testing.T) {
	for _, mode := range []string{"readd", "restart", "overlap"} {
		t.Run(mode, func(t *testing.T) {
			r := newTestChannel(t, "r")
			a := newTestChannel(t, "a")
			if err := a.AddPeer("r", r.LocalEndpoint()); err != nil {
				t.Fatal(err)
			}
			mustSend(t, a, "r", "first")
			expectMsg(t, r, "a", "first")
			// r is busy: a's messages queue on its old connection.
			for i := range 200 {
				mustSend(t, a, "r", fmt.Sprintf("old-%d", i))
			}
			switch mode {
			case "restart":
				a.Close()
				a = newTestChannel(t, "a")
			case "overlap": // the old process is still connected (frozen, partitioned)
				a = newTestChannel(t, "a")
			default:
				if err := a.RemovePeer("r"); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.AddPeer("r", r.LocalEndpoint()); err != nil {
				t.Fatal(err)
			}
			mustSend(t, a, "r", "new")
			readUntil(t, r, "a", "new")
		})
	}
}

// rawRouter is a plain libzmq ROUTER on loopback that reports the routing
// id of each message it receives.
func rawRouter(t *testing.T) (*zmq4.Socket, string) {
	t.Helper()
	s, err := zmq4.NewSocket(zmq4.ROUTER)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.SetLinger(0)
	if err := s.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, err := s.GetLastEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	s.SetRcvtimeo(hangGuard)
	return s, ep
}

func routedID(t *testing.T, s *zmq4.Socket) []byte {
	t.Helper()
	frames, err := s.RecvMessageBytes(0)
	if err != nil || len(frames) != 2 {
		t.Fatalf("raw ROUTER: %d frames, %v", len(frames), err)
	}
	return frames[0]
}

// TestRoutingIDPerDealer: each DEALER a channel opens (each AddPeer, each
// process) announces a routing id of its own, the agent name plus a zero
// byte and an incarnation suffix; the receiving channel names the message
// after the agent. A bare name (an older build's DEALER) is still
// accepted as that name.
func TestRoutingIDPerDealer(t *testing.T) {
	raw, ep := rawRouter(t)
	a := newTestChannel(t, "a")
	seen := map[string]bool{}
	for i := range 3 {
		if err := a.AddPeer("x", ep); err != nil {
			t.Fatal(err)
		}
		mustSend(t, a, "x", "hi")
		id := routedID(t, raw)
		if len(id) != len("a")+9 || string(peerName(id)) != "a" || id[1] != 0 {
			t.Fatalf("DEALER %d routing id %q, want \"a\\x00\" and 8 bytes", i, id)
		}
		if seen[string(id)] {
			t.Fatalf("DEALER %d reuses routing id %q", i, id)
		}
		seen[string(id)] = true
		if err := a.RemovePeer("x"); err != nil {
			t.Fatal(err)
		}
	}
	r := newTestChannel(t, "r")
	for _, id := range []string{"old-build", "new-build\x00\x01\x02\x03\x04\x05\x06\x07\x08"} {
		d, err := zmq4.NewSocket(zmq4.DEALER)
		if err != nil {
			t.Fatal(err)
		}
		d.SetLinger(0)
		d.SetIdentity(id)
		if err := d.Connect(r.LocalEndpoint()); err != nil {
			t.Fatal(err)
		}
		if _, err := d.SendBytes([]byte("ping"), 0); err != nil {
			t.Fatal(err)
		}
		want := string(peerName([]byte(id)))
		expectMsg(t, r, want, "ping")
		d.Close()
	}
}
