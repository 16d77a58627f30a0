package zmq

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

// fakeLookup resolves a few fixed names, maps "empty.example"
// to no address, and fails everything else, without DNS.
func fakeLookup(_ context.Context, host string) ([]string, error) {
	switch host {
	case "localhost", "peer.example", "node-1.cluster.local":
		return []string{"127.0.0.1"}, nil
	case "empty.example":
		return nil, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func newFakeLookupChannel(t *testing.T, name string) *Channel {
	t.Helper()
	c, err := newChannel(Config{Name: name, BindAddress: "127.0.0.1"}, hostProbe(), fakeLookup)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestAddPeerEndpointValidation(t *testing.T) {
	bad := []string{
		"",
		"garbage",
		"127.0.0.1:5555",
		"tcp://",
		"tcp://127.0.0.1",
		"tcp://127.0.0.1:",
		"tcp://:5555",
		"tcp://127.0.0.1:0",
		"tcp://127.0.0.1:99999",
		"tcp://127.0.0.1:65536",
		"tcp://127.0.0.1:-1",
		"tcp://127.0.0.1:+80",
		"tcp://127.0.0.1:080",
		"tcp://127.0.0.1:*",
		"tcp://127.0.0.1:http",
		"tcp://127.0.0.1:5555/path",
		"ipc:///tmp/bounce.sock",
		"inproc://bounce",
		"udp://127.0.0.1:5555",
		"TCP://127.0.0.1:5555",
		"tcp://::1:5555",
		"tcp://fd00::1:5555",
		"tcp://[::1]",
		"tcp://[127.0.0.1]:5555",
		"tcp://[peer.example]:5555",
		"tcp://[fe80::1%eth0]:5555",
		"tcp://0.0.0.0:5555",
		"tcp://[::]:5555",
		"tcp://224.0.0.1:5555",
		"tcp://999.1.1.1:5555",
		"tcp://1.2.3:5555",
		"tcp://host_name:5555",
		"tcp://-bad.example:5555",
		"tcp://bad-.example:5555",
		"tcp://a..b:5555",
		"tcp://" + strings.Repeat("a", 64) + ".example:5555",
		"tcp://host\x00name:5555",
		"tcp://no-such-host.invalid:5555",
		"tcp://empty.example:5555",
		"tcp://" + strings.Repeat("a.", 300) + "example:5555",
	}
	// Accepted by validation; checked without connecting anywhere.
	valid := []string{
		"tcp://10.0.0.1:1",
		"tcp://10.0.0.1:65535",
		"tcp://[fd00::1]:5555",
		"tcp://[::ffff:10.0.0.1]:5555",
		"tcp://peer.example:5555",
		"tcp://node-1.cluster.local:5555",
	}
	for _, ep := range valid {
		if err := validateEndpoint(context.Background(), ep, fakeLookup); err != nil {
			t.Errorf("validateEndpoint(%q) = %v, want nil", ep, err)
		}
	}
	// Accepted by AddPeer, which connects: loopback only.
	good := []string{
		"tcp://127.0.0.1:1",
		"tcp://127.0.0.1:65535",
		"tcp://[::1]:5555",
		"tcp://[::ffff:127.0.0.1]:5555",
		"tcp://localhost:5555",
	}

	c := newFakeLookupChannel(t, "a")
	b := newTestChannel(t, "b")
	if err := c.AddPeer("b", b.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	for i, ep := range bad {
		err := c.AddPeer("b", ep)
		if !errors.Is(err, transfer.ErrBadEndpoint) {
			t.Errorf("AddPeer(%q) = %v, want ErrBadEndpoint", ep, err)
		}
		if got := c.Stats().BadEndpoints; got != uint64(i+1) {
			t.Fatalf("after %q BadEndpoints = %d, want %d", ep, got, i+1)
		}
	}
	// The rejected endpoints left the existing entry for b untouched.
	mustSend(t, c, "b", "still here")
	expectMsg(t, b, "a", "still here")

	for i, ep := range good {
		peer := "p" + strconv.Itoa(i)
		if err := c.AddPeer(peer, ep); err != nil {
			t.Errorf("AddPeer(%q) = %v, want nil", ep, err)
		}
	}
	if got := c.Stats().BadEndpoints; got != uint64(len(bad)) {
		t.Fatalf("BadEndpoints = %d, want %d", got, len(bad))
	}
}

func TestAddPeerBadName(t *testing.T) {
	c := newFakeLookupChannel(t, "a")
	for _, name := range []string{"", "\x00x", strings.Repeat("x", 256)} {
		if err := c.AddPeer(name, "tcp://127.0.0.1:5555"); !errors.Is(err, transfer.ErrBadEndpoint) {
			t.Errorf("AddPeer(name %q) = %v, want ErrBadEndpoint", name, err)
		}
	}
}

func TestParseEndpointRoundTrip(t *testing.T) {
	for _, ep := range []string{"tcp://127.0.0.1:1", "tcp://[::1]:65535", "tcp://peer.example:80"} {
		eh, err := parseEndpoint(ep)
		if err != nil {
			t.Fatalf("parseEndpoint(%q): %v", ep, err)
		}
		if got := "tcp://" + net.JoinHostPort(eh.host, strconv.Itoa(eh.port)); got != ep {
			t.Fatalf("round trip %q -> %q", ep, got)
		}
	}
}

// FuzzParseEndpoint checks that parsing never panics and that every
// accepted endpoint is exactly tcp://host:port with a valid port.
func FuzzParseEndpoint(f *testing.F) {
	for _, s := range []string{"tcp://127.0.0.1:5555", "tcp://[::1]:1", "tcp://host.example:65535", "tcp://::1:80", "ipc://x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		eh, err := parseEndpoint(s)
		if err != nil {
			return
		}
		if eh.port < 1 || eh.port > 65535 {
			t.Fatalf("%q accepted with port %d", s, eh.port)
		}
		if got := "tcp://" + net.JoinHostPort(eh.host, strconv.Itoa(eh.port)); got != s {
			t.Fatalf("%q accepted but reassembles as %q", s, got)
		}
		if eh.ip == nil && checkHostname(eh.host) != nil {
			t.Fatalf("%q accepted with invalid host %q", s, eh.host)
		}
	})
}
