package security_test

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pebbe/zmq4"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/security"
)

// caps returns the receiver's open descriptors and the control
// connections it refused over a cap.
func (v *victim) caps() (fds, overCap uint64) {
	v.t.Helper()
	f := strings.Fields(v.ask("CAPS", "CAPS "))
	fds, _ = strconv.ParseUint(f[0], 10, 64)
	overCap, _ = strconv.ParseUint(f[1], 10, 64)
	return fds, overCap
}

// TestControlConnFloodBounded (issue 26 item 5, the ZeroMQ connections):
// with security.mode off, a client on one host (127.0.0.2) opens 1,000
// ZeroMQ DEALER connections, each with its own identity, to the ROUTER of
// a receiver in another process, and holds them. The receiver refuses
// every one past security.max_control_conns_per_host at its handshake
// (the NULL mechanism's ZAP request) and closes it, so its descriptors
// stay within the cap of where they were; a legitimate sender on another
// host (127.0.0.1) transfers byte-exact while the flood is held and
// after it ended. Before, nothing refused a connection without CURVE:
// every one held a descriptor (fds 31 -> 1,034).
func TestControlConnFloodBounded(t *testing.T) {
	const n = 1000
	if ln, err := net.Listen("tcp", "127.0.0.2:0"); err != nil {
		t.Skipf("no second loopback address: %v", err)
	} else {
		ln.Close()
	}
	v := startVictim(t, "", "BOUNCE_SECURITY_TEST_MODE=off")
	alice := v.aliceNode(func(c *config.Config) { c.Security.Mode = "off" })
	b, sum := v.aliceSends(alice, 1)
	v.aliceLands(b, sum)
	base, _ := v.caps()

	zctx, err := zmq4.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	if err := zctx.SetMaxSockets(2*n + 16); err != nil {
		t.Fatal(err)
	}
	ep := "tcp://127.0.0.2:0;" + strings.TrimPrefix(v.rd.Handshake.Endpoint, "tcp://")
	flood := make([]*zmq4.Socket, 0, n)
	defer func() {
		for _, s := range flood {
			s.Close()
		}
	}()
	for i := range n {
		s, err := zctx.NewSocket(zmq4.DEALER)
		if err != nil {
			t.Fatal(err)
		}
		flood = append(flood, s)
		s.SetLinger(0)
		s.SetIdentity(fmt.Sprintf("flood%04d", i))
		if err := s.Connect(ep); err != nil {
			t.Fatal(err)
		}
	}
	perHost := uint64(security.DefaultMaxControlConnsPerHost)
	// Bound: the cap's connections, and what alice's transfers hold
	// (engine and control connections, reverse path); 1,000 if unbounded.
	bound := base + perHost + 48
	var fds, overCap uint64
	deadline := time.Now().Add(hangTime)
	for {
		fds, overCap = v.caps()
		if overCap >= n-perHost && fds <= bound {
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("receiver fds %d, with %d DEALER connections held from one host %d (%d refused over the cap)", base, n, fds, overCap)
	if fds > bound {
		t.Fatalf("receiver fds grew from %d to %d under %d connections from one host; want at most %d (max_control_conns_per_host %d)", base, fds, n, bound, perHost)
	}
	if overCap < n-perHost {
		t.Fatalf("%d connections refused over the cap, want at least %d", overCap, n-perHost)
	}
	// While the flood is held, alice (another host) is served.
	for seed := uint64(2); seed < 4; seed++ {
		b, sum := v.aliceSends(alice, seed)
		v.aliceLands(b, sum)
	}
	if fds, _ := v.caps(); fds > bound {
		t.Fatalf("receiver fds %d while alice sends under the flood, want at most %d", fds, bound)
	}
	for _, s := range flood {
		s.Close()
	}
	flood = nil
	deadline = time.Now().Add(hangTime)
	for fds, _ = v.caps(); fds > base+16 && time.Now().Before(deadline); fds, _ = v.caps() {
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("receiver fds %d once the flood closed", fds)
	if fds > base+16 {
		t.Fatalf("receiver fds %d after the flood closed, were %d before it", fds, base)
	}
	b, sum = v.aliceSends(alice, 9)
	v.aliceLands(b, sum)
}
