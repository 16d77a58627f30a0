package zmq

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/bouncekv/bounce/transfer"
)

func TestRoundTrip(t *testing.T) {
	a := newTestChannel(t, "a")
	b := newTestChannel(t, "b")
	if a.Kind() != "zmq" {
		t.Fatalf("Kind = %q", a.Kind())
	}
	if !strings.HasPrefix(a.LocalEndpoint(), "tcp://127.0.0.1:") || strings.HasSuffix(a.LocalEndpoint(), ":*") {
		t.Fatalf("LocalEndpoint = %q, want tcp://127.0.0.1:<port>", a.LocalEndpoint())
	}
	connect(t, a, b)

	want := []byte{0, 1, 2, 0xff, 'W', 'A', 'N', 'T'}
	if err := a.Send("b", want); err != nil {
		t.Fatal(err)
	}
	m := mustRecv(t, b)
	if m.Peer != "a" || !bytes.Equal(m.Payload, want) {
		t.Fatalf("b got (%q, %x), want (a, %x)", m.Peer, m.Payload, want)
	}
	// Empty payloads are messages too.
	mustSend(t, b, "a", "")
	expectMsg(t, a, "b", "")

	// Each ROUTER admitted (ZAP, NULL mechanism) the other's one
	// connection and holds it.
	if st := a.Stats(); st != (Stats{Sent: 1, Received: 1, Admitted: 1, Conns: 1}) {
		t.Fatalf("a stats %+v", st)
	}
	if st := b.Stats(); st != (Stats{Sent: 1, Received: 1, Admitted: 1, Conns: 1}) {
		t.Fatalf("b stats %+v", st)
	}
	if _, err := a.Recv(0); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("Recv on empty channel = %v, want ErrTimeout", err)
	}
}

func TestOrderPerPeer(t *testing.T) {
	a := newTestChannel(t, "a")
	b := newTestChannel(t, "b")
	connect(t, a, b)
	const n = 900 // below SendHWM: none may be dropped
	for i := range n {
		mustSend(t, a, "b", fmt.Sprintf("m%04d", i))
	}
	for i := range n {
		expectMsg(t, b, "a", fmt.Sprintf("m%04d", i))
	}
}

func TestNoCrossTalk(t *testing.T) {
	chans := []*Channel{newTestChannel(t, "a"), newTestChannel(t, "b"), newTestChannel(t, "c")}
	connect(t, chans...)
	const n = 100
	for i := range n {
		for _, from := range chans {
			for _, to := range chans {
				if from != to {
					mustSend(t, from, to.Name(), fmt.Sprintf("%s>%s#%d", from.Name(), to.Name(), i))
				}
			}
		}
	}
	for _, to := range chans {
		next := map[string]int{}
		for range 2 * n {
			m := mustRecv(t, to)
			want := fmt.Sprintf("%s>%s#%d", m.Peer, to.Name(), next[m.Peer])
			if string(m.Payload) != want {
				t.Fatalf("%s got %q from %q, want %q", to.Name(), m.Payload, m.Peer, want)
			}
			next[m.Peer]++
		}
		if len(next) != 2 {
			t.Fatalf("%s heard from %v, want the two others", to.Name(), next)
		}
		if _, err := to.Recv(0); !errors.Is(err, transfer.ErrTimeout) {
			t.Fatalf("%s has extra messages: %v", to.Name(), err)
		}
	}
}

// stalledPeer accepts TCP connections and never reads from them, so a
// DEALER connected to it never completes the ZMTP handshake and its queue
// fills.
func stalledPeer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
	})
	return "tcp://" + ln.Addr().String()
}

func TestQueueFullDropsWithoutBlocking(t *testing.T) {
	const hwm = 8
	a := newTestChannel(t, "a", func(c *Config) { c.SendHWM = hwm })
	b := newTestChannel(t, "b")
	connect(t, a, b)
	if err := a.AddPeer("stalled", stalledPeer(t)); err != nil {
		t.Fatal(err)
	}

	// Every Send below runs on this goroutine; a blocking Send would hang
	// the test rather than pass.
	accepted, full := 0, 0
	for i := 0; full == 0; i++ {
		if i == 100*hwm {
			t.Fatalf("no ErrQueueFull after %d sends to a stalled peer", i)
		}
		switch err := a.Send("stalled", []byte("x")); {
		case err == nil:
			accepted++
		case errors.Is(err, transfer.ErrQueueFull):
			full++
		default:
			t.Fatalf("Send to stalled peer: %v", err)
		}
	}
	// The queue stays full while traffic to b keeps flowing.
	const n = 50
	for i := range n {
		if err := a.Send("stalled", []byte("x")); !errors.Is(err, transfer.ErrQueueFull) {
			t.Fatalf("Send to stalled peer after full = %v, want ErrQueueFull", err)
		}
		full++
		// Lockstep keeps b's queue (same small SendHWM) from filling.
		mustSend(t, a, "b", fmt.Sprintf("flow-%d", i))
		expectMsg(t, b, "a", fmt.Sprintf("flow-%d", i))
	}
	st := a.Stats()
	if st.Dropped != uint64(full) || st.Sent != uint64(accepted+n) {
		t.Fatalf("stats %+v, want dropped %d sent %d", st, full, accepted+n)
	}
	if accepted < 1 || accepted > hwm {
		t.Fatalf("stalled peer accepted %d messages, want 1..%d (SendHWM)", accepted, hwm)
	}
}

func TestUnknownPeerAndRemove(t *testing.T) {
	a := newTestChannel(t, "a")
	b := newTestChannel(t, "b")
	if err := a.Send("b", []byte("x")); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("Send to unknown = %v, want ErrUnknownPeer", err)
	}
	if err := a.RemovePeer("b"); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("RemovePeer unknown = %v, want ErrUnknownPeer", err)
	}
	connect(t, a, b)
	mustSend(t, a, "b", "one")
	expectMsg(t, b, "a", "one")
	if err := a.RemovePeer("b"); err != nil {
		t.Fatal(err)
	}
	if err := a.Send("b", []byte("x")); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("Send after RemovePeer = %v, want ErrUnknownPeer", err)
	}
	// b can still reach a: removal only drops a's send side.
	mustSend(t, b, "a", "still heard")
	expectMsg(t, a, "b", "still heard")
}

func TestAddPeerReplaces(t *testing.T) {
	a := newTestChannel(t, "a")
	b1 := newTestChannel(t, "b1")
	b2 := newTestChannel(t, "b2")
	if err := a.AddPeer("b", b1.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	mustSend(t, a, "b", "to-b1")
	expectMsg(t, b1, "a", "to-b1")
	// Same endpoint again keeps the connection; a new one replaces it.
	if err := a.AddPeer("b", b1.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	if err := a.AddPeer("b", b2.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	mustSend(t, a, "b", "to-b2")
	expectMsg(t, b2, "a", "to-b2")
	if _, err := b1.Recv(0); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("b1 got a message after replacement: %v", err)
	}
}

// TestForgottenPeerReconnects: A forgets B, B comes back as a new channel
// with the same identity and must be heard. With the old connection still
// open this only works because the ROUTER sets ROUTER_HANDOVER; without it
// libzmq refuses the duplicate identity and the message is lost.
func TestForgottenPeerReconnects(t *testing.T) {
	for _, staleAlive := range []bool{false, true} {
		t.Run(fmt.Sprintf("stale_connection_alive=%v", staleAlive), func(t *testing.T) {
			a := newTestChannel(t, "a")
			b1, err := New(Config{Name: "b", BindAddress: "127.0.0.1"})
			if err != nil {
				t.Fatal(err)
			}
			defer b1.Close()
			connect(t, a, b1)
			mustSend(t, b1, "a", "hello from b1")
			expectMsg(t, a, "b", "hello from b1")

			if err := a.RemovePeer("b"); err != nil {
				t.Fatal(err)
			}
			if !staleAlive {
				if err := b1.Close(); err != nil {
					t.Fatal(err)
				}
			}
			b2 := newTestChannel(t, "b")
			connect(t, a, b2)
			mustSend(t, b2, "a", "hello from b2")
			expectMsg(t, a, "b", "hello from b2")
			mustSend(t, a, "b", "welcome back")
			expectMsg(t, b2, "a", "welcome back")
		})
	}
}

func TestCloseTwiceAndUseAfterClose(t *testing.T) {
	a, err := New(Config{Name: "a", BindAddress: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	b := newTestChannel(t, "b")
	connect(t, a, b)
	mustSend(t, a, "b", "x") // a has a live DEALER when it closes
	expectMsg(t, b, "a", "x")
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	checks := map[string]error{
		"Send":       a.Send("b", nil),
		"AddPeer":    a.AddPeer("c", "tcp://127.0.0.1:5555"),
		"RemovePeer": a.RemovePeer("b"),
	}
	_, checks["Recv"] = a.Recv(hangGuard)
	for op, err := range checks {
		if !errors.Is(err, transfer.ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", op, err)
		}
	}
}

func TestCloseWakesRecv(t *testing.T) {
	a, err := New(Config{Name: "a", BindAddress: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		_, err := a.Recv(10 * hangGuard)
		res <- err
	}()
	// Close only once Recv holds the receive turn and is parked in the
	// poller, so it is the wake that ends the Recv, not an early check.
	for len(a.recvTurn) == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }() // Close waits for the Recv to let go
	select {
	case err := <-res:
		if !errors.Is(err, transfer.ErrClosed) {
			t.Fatalf("Recv during Close = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a parked Recv was not woken by Close")
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentSendersAndRecv: many goroutines Send to one peer while a
// Recv is parked on the same channel; every message arrives once, in
// per-sender order.
func TestConcurrentSendersAndRecv(t *testing.T) {
	a := newTestChannel(t, "a")
	b := newTestChannel(t, "b")
	connect(t, a, b)

	parked := make(chan transfer.Message, 1)
	go func() {
		m, _ := a.Recv(hangGuard)
		parked <- m
	}()

	const senders, each = 4, 200 // 800 < SendHWM: nothing may drop
	var wg sync.WaitGroup
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := a.Send("b", fmt.Appendf(nil, "%d:%d", s, i)); err != nil {
					t.Errorf("Send: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	next := make([]int, senders)
	for range senders * each {
		m := mustRecv(t, b)
		var s, i int
		if _, err := fmt.Sscanf(string(m.Payload), "%d:%d", &s, &i); err != nil || s < 0 || s >= senders {
			t.Fatalf("bad payload %q", m.Payload)
		}
		if i != next[s] {
			t.Fatalf("sender %d: got #%d, want #%d", s, i, next[s])
		}
		next[s]++
	}
	mustSend(t, b, "a", "unpark")
	if m := <-parked; string(m.Payload) != "unpark" || m.Peer != "b" {
		t.Fatalf("parked Recv got %+v", m)
	}
	if st := a.Stats(); st.Sent != senders*each || st.Dropped != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestConcurrentChurn runs Send, AddPeer and RemovePeer against each other
// (for the race detector); every error must be one of the documented ones.
func TestConcurrentChurn(t *testing.T) {
	a := newTestChannel(t, "a")
	b1 := newTestChannel(t, "b1")
	b2 := newTestChannel(t, "b2")
	eps := []string{b1.LocalEndpoint(), b2.LocalEndpoint()}
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				var err error
				switch (g + i) % 3 {
				case 0:
					err = a.AddPeer("b", eps[i%2])
				case 1:
					err = a.RemovePeer("b")
				default:
					err = a.Send("b", []byte("x"))
				}
				if err != nil && !errors.Is(err, transfer.ErrUnknownPeer) && !errors.Is(err, transfer.ErrQueueFull) {
					t.Errorf("op %d: %v", (g+i)%3, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestIPv6Loopback(t *testing.T) {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	ln.Close()
	for _, bind := range []string{"::1", "[::1]"} {
		t.Run(bind, func(t *testing.T) {
			a := newTestChannel(t, "a", func(c *Config) { c.BindAddress = bind })
			if !strings.HasPrefix(a.LocalEndpoint(), "tcp://[::1]:") {
				t.Fatalf("endpoint %q, want tcp://[::1]:<port>", a.LocalEndpoint())
			}
			b := newTestChannel(t, "b") // IPv4 channel talking to an IPv6 one
			connect(t, a, b)
			mustSend(t, b, "a", "over v6")
			expectMsg(t, a, "b", "over v6")
			mustSend(t, a, "b", "over v4")
			expectMsg(t, b, "a", "over v4")
		})
	}
}

// TestMalformedIncoming: a foreign DEALER sending multipart messages or no
// identity is counted and skipped; the channel keeps working.
func TestMalformedIncoming(t *testing.T) {
	a := newTestChannel(t, "a")
	zctx, err := zmq4.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	raw, err := zctx.NewSocket(zmq4.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetLinger(0)
	raw.SetIdentity("raw")
	if err := raw.Connect(a.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.SendMessage("part1", "part2"); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.SendBytes([]byte("fine"), 0); err != nil {
		t.Fatal(err)
	}
	expectMsg(t, a, "raw", "fine")
	if st := a.Stats(); st.Malformed != 1 || st.Received != 1 {
		t.Fatalf("stats %+v, want malformed 1 received 1", st)
	}

	anon, err := zctx.NewSocket(zmq4.DEALER) // libzmq gives it a 0-prefixed id
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	anon.SetLinger(0)
	if err := anon.Connect(a.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	if _, err := anon.SendBytes([]byte("who"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.SendBytes([]byte("after"), 0); err != nil {
		t.Fatal(err)
	}
	// Different connections are not ordered with each other: after
	// "after", keep checking that nothing is delivered until the anonymous
	// message has been counted.
	expectMsg(t, a, "raw", "after")
	deadline := time.Now().Add(hangGuard)
	for a.Stats().Malformed < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("anonymous message never counted: %+v", a.Stats())
		}
		if m, err := a.Recv(10 * time.Millisecond); !errors.Is(err, transfer.ErrTimeout) {
			t.Fatalf("anonymous message was delivered: %+v, %v", m, err)
		}
	}
	if st := a.Stats(); st.Malformed != 2 || st.Received != 2 {
		t.Fatalf("stats %+v, want malformed 2 received 2", st)
	}
}

func TestRecvHugeTimeoutStillWaits(t *testing.T) {
	a := newTestChannel(t, "a")
	b := newTestChannel(t, "b")
	connect(t, a, b)
	res := make(chan error, 1)
	go func() {
		_, err := a.Recv(time.Duration(1<<63 - 1))
		res <- err
	}()
	mustSend(t, b, "a", "x")
	if err := <-res; err != nil {
		t.Fatalf("Recv(max duration) = %v, want the message", err)
	}
}

// TestWakeRecv: WakeRecv ends a parked Recv at once with ErrTimeout (an
// agent's receive loop told to stop then stops instead of waiting out its
// receive timeout), a wake before a Recv ends that Recv, and no message
// is lost to a wake.
func TestWakeRecv(t *testing.T) {
	a := newTestChannel(t, "a")
	b := newTestChannel(t, "b")
	connect(t, a, b)
	res := make(chan error, 1)
	go func() {
		_, err := b.Recv(10 * hangGuard)
		res <- err
	}()
	for len(b.recvTurn) == 0 {
		time.Sleep(time.Millisecond)
	}
	b.WakeRecv()
	select {
	case err := <-res:
		if !errors.Is(err, transfer.ErrTimeout) {
			t.Fatalf("woken Recv = %v, want ErrTimeout", err)
		}
	case <-time.After(hangGuard):
		t.Fatalf("a parked Recv (timeout %v) was not woken within %v", 10*hangGuard, hangGuard)
	}
	// A wake with no Recv in progress ends the next one; two wakes end
	// one.
	b.WakeRecv()
	b.WakeRecv()
	done := make(chan error, 1)
	go func() {
		_, err := b.Recv(10 * hangGuard)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, transfer.ErrTimeout) {
			t.Fatalf("Recv after a wake = %v, want ErrTimeout", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("a wake before the Recv did not end it")
	}
	mustSend(t, a, "b", "after the wakes")
	expectMsg(t, b, "a", "after the wakes")
	b.Close()
	b.WakeRecv() // after Close: nothing, no panic
}
