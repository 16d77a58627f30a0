package zmq

import (
	"errors"
	"strings"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/transfer"
)

// agentKeys is one test agent's identity and its admitted-peer set.
type agentKeys struct {
	id    security.Identity
	peers *security.Peers
}

func newKeys(t *testing.T) agentKeys {
	t.Helper()
	id, err := security.Generate(nil)
	if err != nil {
		t.Fatal(err)
	}
	return agentKeys{id: id, peers: security.NewPeers(security.Authenticate, id, security.Policy{Loaded: true})}
}

func (k agentKeys) introduce(t *testing.T, name string, other agentKeys) {
	t.Helper()
	if err := k.peers.Introduce(name, other.id.Public); err != nil {
		t.Fatal(err)
	}
}

func curveChannel(t *testing.T, name string, k agentKeys, mod ...func(*Config)) *Channel {
	return newTestChannel(t, name, append([]func(*Config){func(c *Config) { c.Peers = k.peers }}, mod...)...)
}

// waitStats polls until ok(stats) or the hang guard, and fails if any
// message is delivered meanwhile.
func waitStats(t *testing.T, c *Channel, what string, ok func(Stats) bool) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for !ok(c.Stats()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: never happened; stats %+v", what, c.Stats())
		}
		if m, err := c.Recv(10 * time.Millisecond); !errors.Is(err, transfer.ErrTimeout) {
			t.Fatalf("%s: message delivered: %+v, %v", what, m, err)
		}
	}
}

// TestCurveAdmitsOnlyKnownKeys: admitted peers talk and are named by their
// key; an unknown key, a NULL-mechanism client and a client that claims an
// admitted peer's identity with its own key are refused and counted.
func TestCurveAdmitsOnlyKnownKeys(t *testing.T) {
	ka, kb, kx := newKeys(t), newKeys(t), newKeys(t)
	ka.introduce(t, "b", kb)
	kb.introduce(t, "a", ka)
	a := curveChannel(t, "a", ka)
	b := curveChannel(t, "b", kb)
	connect(t, a, b)
	mustSend(t, a, "b", "hello")
	expectMsg(t, b, "a", "hello")
	mustSend(t, b, "a", "back")
	expectMsg(t, a, "b", "back")
	if st := b.Stats(); st.Admitted != 1 || st.Refused != 0 {
		t.Fatalf("b stats %+v, want admitted 1 refused 0", st)
	}

	// x knows b's key, but b does not know x's.
	kx.introduce(t, "b", kb)
	x := curveChannel(t, "x", kx)
	if err := x.AddPeer("b", b.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	mustSend(t, x, "b", "forged WANT")
	waitStats(t, b, "unknown key refused", func(s Stats) bool { return s.Refused >= 1 })

	// A client without CURVE never completes the handshake (no ZAP call).
	zctx, _ := zmq4.NewContext()
	defer zctx.Term()
	raw, _ := zctx.NewSocket(zmq4.DEALER)
	defer raw.Close()
	raw.SetLinger(0)
	raw.SetIdentity("a")
	raw.Connect(b.LocalEndpoint())
	raw.SendBytes([]byte("plain"), 0)

	// x claims to be "a" (its DEALER identity), with its own key: refused
	// by ZAP since x's key is unknown. With a's key it would be a.
	spoof := curveChannel(t, "a", kx)
	if err := spoof.AddPeer("b", b.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	mustSend(t, spoof, "b", "spoofed")
	waitStats(t, b, "spoofing client refused", func(s Stats) bool { return s.Refused >= 2 })

	// The legitimate pair still works, and nothing else got through.
	mustSend(t, a, "b", "still here")
	expectMsg(t, b, "a", "still here")
	if st := b.Stats(); st.Received != 2 {
		t.Fatalf("b received %d messages, want the 2 from a; stats %+v", st.Received, st)
	}
}

// TestCurveDeclaredIdentityMustMatchKey: an admitted peer that declares
// another admitted peer's routing identity is dropped (counted as spoofed):
// Message.Peer comes from the key, never from the declared identity.
func TestCurveDeclaredIdentityMustMatchKey(t *testing.T) {
	ka, kb, kc := newKeys(t), newKeys(t), newKeys(t)
	kb.introduce(t, "a", ka)
	kb.introduce(t, "c", kc)
	kc.introduce(t, "b", kb)
	b := curveChannel(t, "b", kb)
	// c's channel, with c's key, calling itself "a".
	liar := curveChannel(t, "a", kc)
	if err := liar.AddPeer("b", b.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	mustSend(t, liar, "b", "I am a")
	waitStats(t, b, "spoofed identity dropped", func(s Stats) bool { return s.Spoofed == 1 })
	if st := b.Stats(); st.Received != 0 || st.Admitted != 1 {
		t.Fatalf("stats %+v, want the connection admitted (as c) and its message dropped", st)
	}
}

// TestCurveWrongServerKey: a DEALER pinned to a key other than the
// server's never delivers (the server would have to hold the secret).
func TestCurveWrongServerKey(t *testing.T) {
	ka, kb, kimp := newKeys(t), newKeys(t), newKeys(t)
	kb.introduce(t, "a", ka)
	// a believes b's key is kimp's.
	ka.introduce(t, "b", kimp)
	a := curveChannel(t, "a", ka)
	b := curveChannel(t, "b", kb)
	if err := a.AddPeer("b", b.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	mustSend(t, a, "b", "to the wrong key")
	if m, err := b.Recv(500 * time.Millisecond); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("message to a server holding another key was delivered: %+v, %v", m, err)
	}
	if st := b.Stats(); st.Admitted != 0 {
		t.Fatalf("stats %+v: a connection with a mismatched server key was admitted", st)
	}
	// Without a key for the peer, AddPeer refuses at once.
	if err := a.AddPeer("nobody", b.LocalEndpoint()); !errors.Is(err, security.ErrNotAdmitted) {
		t.Fatalf("AddPeer of a peer without a key: %v", err)
	}
}

// TestCurveMaxMessageSize: an admitted peer sending a 128 MiB message is
// disconnected before it is buffered; the channel keeps serving others.
func TestCurveMaxMessageSize(t *testing.T) {
	ka, kb, kc := newKeys(t), newKeys(t), newKeys(t)
	kb.introduce(t, "a", ka)
	kb.introduce(t, "c", kc)
	ka.introduce(t, "b", kb)
	kc.introduce(t, "b", kb)
	b := curveChannel(t, "b", kb, func(c *Config) { c.MaxMessageSize = 1 << 20 })
	a := curveChannel(t, "a", ka)
	c := curveChannel(t, "c", kc)
	for _, ch := range []*Channel{a, c} {
		if err := ch.AddPeer("b", b.LocalEndpoint()); err != nil {
			t.Fatal(err)
		}
	}
	huge := strings.Repeat("x", 128<<20)
	mustSend(t, a, "b", huge)
	mustSend(t, c, "b", "small")
	expectMsg(t, b, "c", "small")
	if m, err := b.Recv(time.Second); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("128 MiB message delivered (%d bytes from %q), want it refused", len(m.Payload), m.Peer)
	}
}
