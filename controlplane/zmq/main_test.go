package zmq

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bouncekv/bounce/internal/childproc"
	"github.com/bouncekv/bounce/transfer"
)

// childEnv selects the child role of TestCrossProcess when the test binary
// re-executes itself.
const childEnv = "BOUNCE_ZMQ_TEST_CHILD"

func TestMain(m *testing.M) {
	if childproc.Role(childEnv) != "" {
		os.Exit(runChild())
	}
	goleak.VerifyTestMain(m)
}

// hangGuard bounds waits that only end early on success; it is a guard
// against hangs, not a performance assertion.
const hangGuard = 20 * time.Second

// newTestChannel returns a channel named name bound on 127.0.0.1 and closed
// when the test ends.
func newTestChannel(t testing.TB, name string, mod ...func(*Config)) *Channel {
	t.Helper()
	cfg := Config{Name: name, BindAddress: "127.0.0.1"}
	for _, f := range mod {
		f(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%q): %v", name, err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close(%q): %v", name, err)
		}
	})
	return c
}

// connect makes a and b peers of each other under their names.
func connect(t testing.TB, chans ...*Channel) {
	t.Helper()
	for _, a := range chans {
		for _, b := range chans {
			if a == b {
				continue
			}
			if err := a.AddPeer(b.Name(), b.LocalEndpoint()); err != nil {
				t.Fatalf("%s.AddPeer(%s): %v", a.Name(), b.Name(), err)
			}
		}
	}
}

func mustSend(t testing.TB, c *Channel, peer, payload string) {
	t.Helper()
	if err := c.Send(peer, []byte(payload)); err != nil {
		t.Fatalf("%s.Send(%s, %q): %v", c.Name(), peer, payload, err)
	}
}

func mustRecv(t testing.TB, c *Channel) transfer.Message {
	t.Helper()
	m, err := c.Recv(hangGuard)
	if err != nil {
		t.Fatalf("%s.Recv: %v", c.Name(), err)
	}
	return m
}

func expectMsg(t testing.TB, c *Channel, peer, payload string) {
	t.Helper()
	m := mustRecv(t, c)
	if m.Peer != peer || string(m.Payload) != payload {
		t.Fatalf("%s received (%q, %q), want (%q, %q)", c.Name(), m.Peer, m.Payload, peer, payload)
	}
}

// runChild is the child process of TestCrossProcess: it prints its
// endpoint, reads the parent's from stdin, and echoes every message back
// with an "echo:" prefix until it receives "bye".
func runChild() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	c, err := New(Config{Name: "child", BindAddress: "127.0.0.1"})
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	fmt.Println(c.LocalEndpoint())
	var parentEP string
	if _, err := fmt.Fscanln(os.Stdin, &parentEP); err != nil {
		return fail(fmt.Errorf("read parent endpoint: %w", err))
	}
	if err := c.AddPeer("parent", strings.TrimSpace(parentEP)); err != nil {
		return fail(err)
	}
	for {
		m, err := c.Recv(hangGuard)
		if err != nil {
			return fail(err)
		}
		if m.Peer != "parent" {
			return fail(fmt.Errorf("message from %q", m.Peer))
		}
		if string(m.Payload) == "bye" {
			if err := c.Send("parent", []byte("bye-ack")); err != nil {
				return fail(err)
			}
			// Close discards unsent messages (linger 0); wait for the
			// parent to confirm it has the ack.
			if _, err := c.Recv(hangGuard); err != nil && !errors.Is(err, transfer.ErrTimeout) {
				return fail(err)
			}
			return 0
		}
		if err := c.Send("parent", append([]byte("echo:"), m.Payload...)); err != nil {
			return fail(err)
		}
	}
}
