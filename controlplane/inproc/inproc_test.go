package inproc_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bouncekv/bounce/controlplane/inproc"
	"github.com/bouncekv/bounce/transfer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func channel(t *testing.T, n *inproc.Network, name string, opts inproc.Options) *inproc.Channel {
	t.Helper()
	c, err := n.NewChannel(name, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func connect(t *testing.T, from, to *inproc.Channel) {
	t.Helper()
	if err := from.AddPeer(to.Name(), to.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
}

func recv(t *testing.T, c *inproc.Channel) transfer.Message {
	t.Helper()
	m, err := c.Recv(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestKindAndEndpoint(t *testing.T) {
	c := channel(t, inproc.NewNetwork(), "agent-0", inproc.Options{})
	if c.Kind() != "inproc" || c.LocalEndpoint() != "inproc://agent-0" {
		t.Fatalf("kind %q endpoint %q", c.Kind(), c.LocalEndpoint())
	}
}

func TestOrderPerPeerAndNoCrossTalk(t *testing.T) {
	n := inproc.NewNetwork()
	a, b, c := channel(t, n, "a", inproc.Options{}), channel(t, n, "b", inproc.Options{}), channel(t, n, "c", inproc.Options{})
	connect(t, a, b)
	connect(t, a, c)
	connect(t, c, b)
	const count = 200
	payload := make([]byte, len("a>b:000000000"))
	for i := range count {
		for _, s := range []struct {
			from *inproc.Channel
			to   string
		}{{a, "b"}, {a, "c"}, {c, "b"}} {
			copy(payload, fmt.Sprintf("%s>%s:%09d", s.from.Name(), s.to, i))
			if err := s.from.Send(s.to, payload); err != nil {
				t.Fatal(err)
			}
		}
	}
	payload[0] = '!' // Send copied the payload
	for _, rx := range []*inproc.Channel{b, c} {
		next := map[string]int{}
		for range map[string]int{"b": 2 * count, "c": count}[rx.Name()] {
			m := recv(t, rx)
			want := fmt.Sprintf("%s>%s:%09d", m.Peer, rx.Name(), next[m.Peer])
			if string(m.Payload) != want {
				t.Fatalf("%s got %q from %q, want %q", rx.Name(), m.Payload, m.Peer, want)
			}
			next[m.Peer]++
		}
		if _, err := rx.Recv(0); !errors.Is(err, transfer.ErrTimeout) {
			t.Fatalf("%s has extra messages: %v", rx.Name(), err)
		}
	}
	if s := a.Stats(); s.Sent != 2*count || s.Dropped != 0 {
		t.Fatalf("a stats = %+v", s)
	}
	if s := b.Stats(); s.Received != 2*count {
		t.Fatalf("b stats = %+v", s)
	}
}

func TestRecvAlternatesBetweenSenders(t *testing.T) {
	n := inproc.NewNetwork()
	a, b, c := channel(t, n, "a", inproc.Options{}), channel(t, n, "b", inproc.Options{}), channel(t, n, "c", inproc.Options{})
	connect(t, a, b)
	connect(t, c, b)
	for range 5 {
		if err := a.Send("b", nil); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		if err := c.Send("b", nil); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for range 4 {
		got = append(got, recv(t, b).Peer)
	}
	if strings.Join(got, "") != "acac" {
		t.Fatalf("receive order %v, want senders taking turns", got)
	}
}

func TestQueueFullIsNonBlockingAndPerPeer(t *testing.T) {
	n := inproc.NewNetwork()
	a := channel(t, n, "a", inproc.Options{QueueSize: 2})
	c := channel(t, n, "c", inproc.Options{QueueSize: 2})
	b := channel(t, n, "b", inproc.Options{})
	connect(t, a, b)
	connect(t, c, b)
	for i := range 2 {
		if err := a.Send("b", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Send("b", []byte{2}); !errors.Is(err, transfer.ErrQueueFull) {
		t.Fatalf("third send: %v", err)
	}
	// a's full queue does not take c's slots.
	if err := c.Send("b", []byte{9}); err != nil {
		t.Fatalf("other sender: %v", err)
	}
	if m := recv(t, b); m.Peer != "a" || m.Payload[0] != 0 {
		t.Fatalf("got %v", m)
	}
	if err := a.Send("b", []byte{3}); err != nil {
		t.Fatalf("send after a slot freed: %v", err)
	}
	var fromA []byte
	for range 3 {
		m := recv(t, b)
		if m.Peer == "a" {
			fromA = append(fromA, m.Payload[0])
		}
	}
	if string(fromA) != "\x01\x03" {
		t.Fatalf("from a after the drop: %v, want [1 3]", fromA)
	}
	if s := a.Stats(); s.Sent != 3 || s.Dropped != 1 {
		t.Fatalf("a stats = %+v", s)
	}
}

func TestAddPeerValidatesEndpoint(t *testing.T) {
	n := inproc.NewNetwork()
	a, b := channel(t, n, "a", inproc.Options{}), channel(t, n, "b", inproc.Options{})
	connect(t, a, b)
	closed := channel(t, n, "gone", inproc.Options{})
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ep := range []string{
		"", "b", "inproc://", "inproc:/b", "INPROC://b", "tcp://127.0.0.1:5555",
		"inproc://unknown", "inproc://gone", "inproc://b\n", " inproc://b",
		"inproc://" + strings.Repeat("x", 256),
	} {
		if err := a.AddPeer("b", ep); !errors.Is(err, transfer.ErrBadEndpoint) {
			t.Errorf("AddPeer(%q): err = %v, want ErrBadEndpoint", ep, err)
		}
	}
	if err := a.AddPeer("", b.LocalEndpoint()); !errors.Is(err, transfer.ErrBadEndpoint) {
		t.Errorf("empty peer name: %v", err)
	}
	// Rejected endpoints left the existing entry alone.
	if err := a.Send("b", []byte("still")); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, b); string(m.Payload) != "still" || m.Peer != "a" {
		t.Fatalf("got %v", m)
	}
}

func TestRemoveAndReconnect(t *testing.T) {
	n := inproc.NewNetwork()
	a, b := channel(t, n, "a", inproc.Options{}), channel(t, n, "b", inproc.Options{})
	if err := a.Send("b", nil); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("send before AddPeer: %v", err)
	}
	connect(t, a, b)
	if err := a.RemovePeer("b"); err != nil {
		t.Fatal(err)
	}
	if err := a.RemovePeer("b"); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("second remove: %v", err)
	}
	if err := a.Send("b", nil); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("send after remove: %v", err)
	}
	connect(t, a, b)
	if err := a.Send("b", []byte("again")); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, b); string(m.Payload) != "again" {
		t.Fatalf("got %q", m.Payload)
	}

	// The peer's channel closes: sends fail with ErrPeerLost until a
	// channel of that name opens again, which the same entry then reaches.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Send("b", nil); !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("send to closed peer: %v", err)
	}
	b2 := channel(t, n, "b", inproc.Options{})
	if err := a.Send("b", []byte("reborn")); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, b2); string(m.Payload) != "reborn" || m.Peer != "a" {
		t.Fatalf("got %v", m)
	}
}

func TestCloseSemantics(t *testing.T) {
	n := inproc.NewNetwork()
	a, b := channel(t, n, "a", inproc.Options{}), channel(t, n, "b", inproc.Options{})
	connect(t, a, b)
	if err := a.Send("b", []byte("dropped on close")); err != nil {
		t.Fatal(err)
	}
	got := make(chan error)
	go func() {
		_, err := a.Recv(time.Hour)
		got <- err
	}()
	time.Sleep(20 * time.Millisecond) // let Recv park, so Close must wake it
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, transfer.ErrClosed) {
			t.Fatalf("waiting recv after close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a parked Recv was not woken by Close")
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := a.Recv(0); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("recv after close: %v", err)
	}
	if err := a.Send("b", nil); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("send after close: %v", err)
	}
	if err := a.AddPeer("b", b.LocalEndpoint()); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("add peer after close: %v", err)
	}
	if err := a.RemovePeer("b"); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("remove peer after close: %v", err)
	}
	// Messages a sent before closing are still delivered.
	if m := recv(t, b); m.Peer != "a" {
		t.Fatalf("got %v", m)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Recv(time.Hour); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("b recv after close: %v", err)
	}
}

func TestRecvTimeout(t *testing.T) {
	c := channel(t, inproc.NewNetwork(), "a", inproc.Options{})
	for _, d := range []time.Duration{-1, 0, time.Millisecond} {
		if _, err := c.Recv(d); !errors.Is(err, transfer.ErrTimeout) {
			t.Fatalf("Recv(%v) on empty channel: %v", d, err)
		}
	}
}

func TestConcurrentReceiversAllWake(t *testing.T) {
	n := inproc.NewNetwork()
	a, b := channel(t, n, "a", inproc.Options{}), channel(t, n, "b", inproc.Options{})
	connect(t, a, b)
	const receivers = 4
	var wg sync.WaitGroup
	got := make(chan string, receivers)
	for range receivers {
		wg.Go(func() {
			m, err := b.Recv(time.Minute)
			if err != nil {
				got <- err.Error()
				return
			}
			got <- string(m.Payload)
		})
	}
	for i := range receivers {
		if err := a.Send("b", []byte{'0' + byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(got)
	seen := map[string]bool{}
	for s := range got {
		seen[s] = true
	}
	if len(seen) != receivers {
		t.Fatalf("receivers got %v, want %d distinct messages", seen, receivers)
	}
}

func TestDropHook(t *testing.T) {
	n := inproc.NewNetwork()
	var asked []string
	a := channel(t, n, "a", inproc.Options{Drop: func(from, to string, p []byte) bool {
		asked = append(asked, from+">"+to)
		return p[0]%2 == 1
	}})
	b := channel(t, n, "b", inproc.Options{})
	connect(t, a, b)
	for i := range 6 {
		if err := a.Send("b", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []byte{0, 2, 4} {
		if m := recv(t, b); m.Payload[0] != want {
			t.Fatalf("got %d, want %d", m.Payload[0], want)
		}
	}
	if _, err := b.Recv(0); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("dropped messages arrived: %v", err)
	}
	if s := a.Stats(); s.Sent != 3 || s.Filtered != 3 {
		t.Fatalf("stats = %+v", s)
	}
	if len(asked) != 6 || asked[0] != "a>b" {
		t.Fatalf("hook calls = %v", asked)
	}
}

func TestStallAndResume(t *testing.T) {
	n := inproc.NewNetwork()
	a := channel(t, n, "a", inproc.Options{QueueSize: 3})
	b, c := channel(t, n, "b", inproc.Options{}), channel(t, n, "c", inproc.Options{})
	connect(t, a, b)
	connect(t, c, b)
	if err := a.Stall("b"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := a.Send("b", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Send("b", []byte{3}); !errors.Is(err, transfer.ErrQueueFull) {
		t.Fatalf("stalled messages must still count against the queue: %v", err)
	}
	if err := c.Send("b", []byte("c")); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, b); m.Peer != "c" {
		t.Fatalf("got %v while a is stalled", m)
	}
	if _, err := b.Recv(0); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("stalled message delivered: %v", err)
	}
	if err := a.Resume("b"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if m := recv(t, b); m.Peer != "a" || m.Payload[0] != byte(i) {
			t.Fatalf("after resume got %v, want %d from a", m, i)
		}
	}
	if err := a.Stall("zz"); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("stall unknown: %v", err)
	}
}

func TestNewChannelValidation(t *testing.T) {
	n := inproc.NewNetwork()
	channel(t, n, "a", inproc.Options{})
	for _, tc := range []struct {
		name string
		opts inproc.Options
	}{
		{"", inproc.Options{}},
		{"a", inproc.Options{}},
		{"bad\x00name", inproc.Options{}},
		{"b", inproc.Options{QueueSize: -1}},
		{"b", inproc.Options{QueueSize: inproc.MaxQueueSize + 1}},
	} {
		if c, err := n.NewChannel(tc.name, tc.opts); err == nil {
			_ = c.Close()
			t.Errorf("NewChannel(%q, %+v) accepted", tc.name, tc.opts)
		}
	}
	// A closed channel's name can be reused.
	c := channel(t, n, "c", inproc.Options{})
	_ = c.Close()
	channel(t, n, "c", inproc.Options{})
}
