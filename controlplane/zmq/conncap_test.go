package zmq

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/bouncekv/bounce/transfer"
)

// waitUntil polls ok until it holds or the hang guard passes.
func waitUntil(t *testing.T, what string, ok func() bool, state func() string) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: never happened; %s", what, state())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rawDealers opens n DEALERs with distinct identities in their own
// context, connected to endpoint from the local address src ("" for the
// kernel's choice), and closes them when the test ends.
func rawDealers(t *testing.T, n int, src, endpoint string) []*zmq4.Socket {
	t.Helper()
	zctx, err := zmq4.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	var socks []*zmq4.Socket
	t.Cleanup(func() {
		for _, s := range socks {
			s.Close()
		}
		zctx.Term()
	})
	ep := endpoint
	if src != "" {
		ep = "tcp://" + src + ":0;" + strings.TrimPrefix(endpoint, "tcp://")
	}
	for i := range n {
		s, err := zctx.NewSocket(zmq4.DEALER)
		if err != nil {
			t.Fatal(err)
		}
		socks = append(socks, s)
		s.SetLinger(0)
		s.SetIdentity(fmt.Sprintf("flood-%s-%d", src, i))
		if err := s.Connect(ep); err != nil {
			t.Fatal(err)
		}
	}
	return socks
}

// secondLoopback skips the test when 127.0.0.2 cannot be bound (the
// second host the caps tell apart).
func secondLoopback(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no second loopback address: %v", err)
	}
	ln.Close()
}

// TestConnCapPerHostAndTotal (issue 26 item 5): with security off (plain
// ZMTP, no key to refuse) a ROUTER capped at 3 connections per host and 4
// in all admits 3 of 10 DEALERs from 127.0.0.1 and refuses the rest at
// their handshake (over_cap), so it holds 3 connections, not 10; a second
// host (127.0.0.2) still gets one, the total's last, and its second is
// refused; a legitimate channel from the first host is refused while it
// is full and delivers once the flood closed; and when every connection
// closed, none is counted.
func TestConnCapPerHostAndTotal(t *testing.T) {
	secondLoopback(t)
	var warns warnCounter
	b := newTestChannel(t, "b", func(c *Config) {
		c.MaxConnsPerHost, c.MaxConns = 3, 4
		c.Logger = slog.New(&warns)
	})
	state := func() string { return fmt.Sprintf("b stats %+v", b.Stats()) }
	flood := rawDealers(t, 10, "127.0.0.1", b.LocalEndpoint())
	waitUntil(t, "7 of 10 connections from one host refused", func() bool { return b.Stats().OverCap >= 7 }, state)
	waitUntil(t, "the refused connections closed", func() bool { return b.Stats().Conns == 3 }, state)
	if st := b.Stats(); st.Admitted != 3 || st.OverCap != 7 || st.Refused != 0 {
		t.Fatalf("stats %+v: want 3 admitted, 7 over the cap, none refused for a key", st)
	}
	if r := b.Refusals(); r["over_cap"] != 7 || r["not_admitted"] != 0 {
		t.Fatalf("Refusals %v: want over_cap 7", r)
	}
	// Warned once per doubling: the 1st, 2nd and 4th refusal.
	if n := warns.count("zmq: control connection refused: connection cap"); n != 3 {
		t.Fatalf("%d warnings for 7 refusals, want 3 (one per doubling)", n)
	}

	other := rawDealers(t, 2, "127.0.0.2", b.LocalEndpoint())
	waitUntil(t, "the second host's second connection refused", func() bool { return b.Stats().OverCap >= 8 }, state)
	waitUntil(t, "4 connections held", func() bool { return b.Stats().Conns == 4 }, state)
	if st := b.Stats(); st.Admitted != 4 || st.OverCap != 8 {
		t.Fatalf("stats %+v: want the second host's first connection admitted (4 in all), its second over the total", st)
	}

	// A channel from the first host while it is full: refused (ErrBusy,
	// naming the cap); once the flood closed, its next send dials again
	// and is delivered.
	a := newTestChannel(t, "a")
	var refusals refusalLog
	a.SetPeerRefused(refusals.add)
	if err := a.AddPeer("b", b.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	mustSend(t, a, "b", "while full")
	waitUntil(t, "a refused over the cap", func() bool { return len(refusals.get("b")) >= 1 }, state)
	if err := refusals.get("b")[0]; !errors.Is(err, transfer.ErrBusy) || !strings.Contains(err.Error(), "max_control_conns") {
		t.Fatalf("refusal %v: want one wrapping transfer.ErrBusy naming max_control_conns", err)
	}
	for _, s := range append(flood, other...) {
		s.Close()
	}
	waitUntil(t, "the flood's connections closed", func() bool { return b.Stats().Conns == 0 }, state)
	mustSend(t, a, "b", "after")
	expectMsg(t, b, "a", "after")
	if st := b.Stats(); st.Conns != 1 {
		t.Fatalf("stats %+v: want a's one connection", st)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "no connection counted", func() bool { return b.Stats().Conns == 0 }, state)
}

// TestConnCapWithCurve: with CURVE the cap holds for admitted keys too,
// after the key check: a peer whose key is admitted is refused over the
// cap (counted over_cap), an unknown key is refused for its key first.
func TestConnCapWithCurve(t *testing.T) {
	ka, kb, kx := newKeys(t), newKeys(t), newKeys(t)
	ka.introduce(t, "b", kb)
	kb.introduce(t, "a", ka)
	kb.introduce(t, "c", kx)
	kx.introduce(t, "b", kb)
	b := curveChannel(t, "b", kb, func(c *Config) { c.MaxConnsPerHost = 1 })
	state := func() string { return fmt.Sprintf("b stats %+v", b.Stats()) }
	a := curveChannel(t, "a", ka)
	connect(t, a, b)
	mustSend(t, a, "b", "first")
	expectMsg(t, b, "a", "first")
	// c's key is admitted, but a holds the host's one connection.
	c := curveChannel(t, "c", kx)
	var refusals refusalLog
	c.SetPeerRefused(refusals.add)
	if err := c.AddPeer("b", b.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	mustSend(t, c, "b", "over")
	waitUntil(t, "c refused over the cap", func() bool { return len(refusals.get("b")) >= 1 }, state)
	if err := refusals.get("b")[0]; !errors.Is(err, transfer.ErrBusy) {
		t.Fatalf("refusal %v: want transfer.ErrBusy (the cap), not a key refusal", err)
	}
	if st := b.Stats(); st.OverCap != 1 || st.Refused != 0 || st.Admitted != 1 {
		t.Fatalf("stats %+v: want 1 admitted, 1 over the cap", st)
	}
	if m, err := b.Recv(200 * time.Millisecond); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("a message over the cap was delivered: %+v, %v", m, err)
	}
}
