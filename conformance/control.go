package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// ControlSet is what a ControlFactory returns: three fresh channels of one
// kind that can reach each other. The suite adds every channel to the
// other two as peers named "a", "b" and "c" (A is "a", and so on) and
// expects Recv to report those names; an implementation whose channels
// name themselves must be constructed with these names.
type ControlSet struct {
	A, B, C transfer.ControlChannel
	// BadEndpoints are endpoints AddPeer must refuse with
	// transfer.ErrBadEndpoint, in addition to the suite's own garbage.
	BadEndpoints []string
	// Cleanup, if set, runs after each rule; the suite closes the three
	// channels itself before calling it.
	Cleanup func()
}

// ControlFactory returns a fresh ControlSet for one rule.
type ControlFactory func() (ControlSet, error)

// ControlChannel runs the control channel rules against sets from newSet as
// subtests of t.
func ControlChannel(t *testing.T, newSet ControlFactory, cfg Config) {
	t.Helper()
	controlSuite(newSet).test(t, cfg)
}

// CheckControlChannel runs the control channel rules and returns the
// report.
func CheckControlChannel(newSet ControlFactory, cfg Config) Report {
	return controlSuite(newSet).check(cfg)
}

// chanSet is a ControlSet with its channels by name.
type chanSet struct {
	ControlSet
	ch map[string]transfer.ControlChannel
}

func controlSuite(newSet ControlFactory) suite[*chanSet] {
	return suite[*chanSet]{
		kind:  "control",
		rules: controlRules(),
		open: func() (opened[*chanSet], error) {
			if newSet == nil {
				return opened[*chanSet]{}, errors.New("nil ControlFactory")
			}
			s, err := newSet()
			if err != nil {
				return opened[*chanSet]{}, err
			}
			cleanup := func() {
				for _, ch := range []transfer.ControlChannel{s.A, s.B, s.C} {
					if ch != nil {
						_ = ch.Close()
					}
				}
				if s.Cleanup != nil {
					s.Cleanup()
				}
			}
			if s.A == nil || s.B == nil || s.C == nil {
				return opened[*chanSet]{cleanup: cleanup}, errors.New("ControlSet.A, B or C is nil")
			}
			return opened[*chanSet]{
				f:       &chanSet{ControlSet: s, ch: map[string]transfer.ControlChannel{"a": s.A, "b": s.B, "c": s.C}},
				cleanup: cleanup,
				subject: s.A.Kind(),
			}, nil
		},
	}
}

// mesh adds every channel to the other two.
func (s *chanSet) mesh(c *rc) error {
	for _, from := range []string{"a", "b", "c"} {
		for _, to := range []string{"a", "b", "c"} {
			if from == to {
				continue
			}
			c.step("%s.AddPeer(%q)", from, to)
			if err := s.ch[from].AddPeer(to, s.ch[to].LocalEndpoint()); err != nil {
				return fmt.Errorf("%s.AddPeer(%q, %q): %w", from, to, s.ch[to].LocalEndpoint(), err)
			}
		}
	}
	return nil
}

func controlRules() []rule[*chanSet] {
	meshed := func(body func(c *rc, s *chanSet) error) func(c *rc, s *chanSet) error {
		return func(c *rc, s *chanSet) error {
			if err := s.mesh(c); err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			return body(c, s)
		}
	}
	return []rule[*chanSet]{
		{"control/round-trip", "a message sent from a to b arrives intact, reported as from \"a\", and b's reply arrives at a, reported as from \"b\"", meshed(ruleRoundTrip)},
		{"control/order", "1,000 numbered messages from one peer arrive in order, none lost or duplicated (a send refused with ErrQueueFull is sent again)", meshed(ruleOrder)},
		{"control/no-crosstalk", "when b and c send to a at once, every message a receives names its true sender; messages from a to b and to c reach only their addressee", meshed(ruleCrosstalk)},
		{"control/send-nonblocking", "Send never blocks: not to a peer that never reads (until ErrQueueFull or 10,000 messages) and not to a closed peer", meshed(ruleSendNonBlocking)},
		{"control/send-does-not-retain", "once Send returns the caller may reuse its payload buffer; the peer receives the bytes as they were at Send", meshed(ruleSendNoRetain)},
		{"control/unknown-peer", "Send to a peer never added returns transfer.ErrUnknownPeer at once", meshed(ruleControlUnknownPeer)},
		{"control/bad-endpoint", "AddPeer of a garbage endpoint returns transfer.ErrBadEndpoint, adds nothing and leaves an existing peer of that name working", meshed(ruleBadEndpoint)},
		{"control/remove-readd", "after RemovePeer, Send to the peer returns transfer.ErrUnknownPeer; after AddPeer again messages flow both ways", meshed(ruleRemoveReadd)},
		{"control/recv-timeout", "Recv with nothing sent returns transfer.ErrTimeout after at most its timeout, and at once for a zero timeout", meshed(ruleRecvTimeout)},
		{"control/close", "Close is idempotent; after it Recv returns transfer.ErrClosed at once and Send fails without blocking", meshed(ruleClose)},
		{"control/close-unblocks-recv", "a Recv waiting when Close is called returns transfer.ErrClosed promptly", meshed(ruleCloseUnblocksRecv)},
	}
}

// sendAll sends n payloads from ch to peer; from names ch in failures.
func sendAll(c *rc, ch transfer.ControlChannel, from, peer string, n int, payload func(int) []byte) error {
	return sendN(c, fmt.Sprintf("%s.Send(%q)", from, peer), n, func(b []byte) error { return ch.Send(peer, b) }, payload)
}

// recvAll receives n messages on ch and checks each with check.
func recvAll(c *rc, ch transfer.ControlChannel, who string, n int, check func(i int, m transfer.Message) error) error {
	return recvN(c, who, who+".Recv", "messages", n, ch.Recv, check)
}

// sendN makes n calls of send, one per payload, requiring each to return
// quickly and retrying ErrQueueFull (the receiver is reading) until
// OpTimeout; call names the call in failures.
func sendN(c *rc, call string, n int, send func([]byte) error, payload func(int) []byte) error {
	deadline := time.Now().Add(c.cfg.OpTimeout)
	for i := 0; i < n; {
		t0 := time.Now()
		err := send(payload(i))
		if qerr := c.quick(fmt.Sprintf("%s of message %d", call, i), t0); qerr != nil {
			return qerr
		}
		switch {
		case err == nil:
			i++
		case errors.Is(err, transfer.ErrQueueFull):
			if time.Now().After(deadline) {
				return fmt.Errorf("%s of message %d: still ErrQueueFull after OpTimeout (%v) while the peer reads", call, i, c.cfg.OpTimeout)
			}
			time.Sleep(200 * time.Microsecond)
		default:
			return fmt.Errorf("%s of message %d: %v", call, i, err)
		}
	}
	return nil
}

// recvN receives n items with recv within OpTimeout and checks each; who
// receives, call names the receive call and what the items in failures.
func recvN(c *rc, who, call, what string, n int, recv func(time.Duration) (transfer.Message, error), check func(i int, m transfer.Message) error) error {
	deadline := time.Now().Add(c.cfg.OpTimeout)
	for i := 0; i < n; {
		m, err := recv(50 * time.Millisecond)
		switch {
		case err == nil:
			if err := check(i, m); err != nil {
				return err
			}
			i++
		case errors.Is(err, transfer.ErrTimeout):
			if time.Now().After(deadline) {
				return fmt.Errorf("%s received %d of %d %s within OpTimeout (%v)", who, i, n, what, c.cfg.OpTimeout)
			}
		default:
			return fmt.Errorf("%s after %d of %d %s: %v", call, i, n, what, err)
		}
	}
	return nil
}

// silent requires that ch receives nothing for Settle.
func silent(c *rc, ch transfer.ControlChannel, who string) error {
	m, err := ch.Recv(c.cfg.Settle)
	if err == nil {
		return fmt.Errorf("%s received %q from %q, which nobody sent to it", who, m.Payload, m.Peer)
	}
	if !errors.Is(err, transfer.ErrTimeout) {
		return fmt.Errorf("%s.Recv: %v", who, err)
	}
	return nil
}

func tagged(tag string) func(int) []byte {
	return func(i int) []byte { return fmt.Appendf(nil, "%s#%06d", tag, i) }
}

func ruleRoundTrip(c *rc, s *chanSet) error {
	for _, n := range []int{1, 64, 4096} {
		msg := make([]byte, n)
		c.fill(msg)
		reply := make([]byte, n)
		c.fill(reply)
		for _, leg := range []struct {
			from, to string
			payload  []byte
		}{{"a", "b", msg}, {"b", "a", reply}} {
			if err := sendAll(c, s.ch[leg.from], leg.from, leg.to, 1, func(int) []byte { return leg.payload }); err != nil {
				return err
			}
			err := recvAll(c, s.ch[leg.to], leg.to, 1, func(_ int, m transfer.Message) error {
				if m.Peer != leg.from {
					return fmt.Errorf("%s received a %d-byte message from %s reported as from %q", leg.to, n, leg.from, m.Peer)
				}
				if d := describeDiff("payload", m.Payload, leg.payload); len(m.Payload) != n || d != "" {
					return fmt.Errorf("%s received %d bytes from %s, want %d: %s", leg.to, len(m.Payload), leg.from, n, d)
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// checkSeq returns a check that message i is tag#i from peer.
func checkSeq(who, tag, peer string) func(int, transfer.Message) error {
	return func(i int, m transfer.Message) error {
		want := tagged(tag)(i)
		if !bytes.Equal(m.Payload, want) || m.Peer != peer {
			return fmt.Errorf("message %d received by %s is %q from %q; want %q from %q", i, who, m.Payload, m.Peer, want, peer)
		}
		return nil
	}
}

func ruleOrder(c *rc, s *chanSet) error {
	const n = 1000
	sent := make(chan error, 1)
	go func() { sent <- sendAll(c, s.A, "a", "b", n, tagged("order")) }()
	rerr := recvAll(c, s.B, "b", n, checkSeq("b", "order", "a"))
	return errors.Join(<-sent, rerr)
}

func ruleCrosstalk(c *rc, s *chanSet) error {
	const n = 300
	sent := make(chan error, 2)
	go func() { sent <- sendAll(c, s.B, "b", "a", n, tagged("from-b")) }()
	go func() { sent <- sendAll(c, s.C, "c", "a", n, tagged("from-c")) }()
	next := map[string]int{"b": 0, "c": 0}
	rerr := recvAll(c, s.A, "a", 2*n, func(_ int, m transfer.Message) error {
		origin, _, _ := strings.Cut(string(m.Payload), "#")
		from := strings.TrimPrefix(origin, "from-")
		if _, ok := next[from]; !ok || origin == from {
			return fmt.Errorf("a received %q from %q, which nobody sent to it", m.Payload, m.Peer)
		}
		if m.Peer != from {
			return fmt.Errorf("a received %q, sent by %q, reported as from %q", m.Payload, from, m.Peer)
		}
		if want := tagged(origin)(next[from]); !bytes.Equal(m.Payload, want) {
			return fmt.Errorf("a received %q from %q; want %q next (order per peer)", m.Payload, from, want)
		}
		next[from]++
		return nil
	})
	if err := errors.Join(<-sent, <-sent, rerr); err != nil {
		return err
	}
	// Messages from a reach only their addressee.
	go func() { sent <- sendAll(c, s.A, "a", "b", n, tagged("to-b")) }()
	go func() { sent <- sendAll(c, s.A, "a", "c", n, tagged("to-c")) }()
	got := make(chan error, 1)
	go func() { got <- recvAll(c, s.C, "c", n, checkSeq("c", "to-c", "a")) }()
	berr := recvAll(c, s.B, "b", n, checkSeq("b", "to-b", "a"))
	if err := errors.Join(<-sent, <-sent, <-got, berr); err != nil {
		return err
	}
	for _, who := range []string{"a", "b", "c"} {
		if err := silent(c, s.ch[who], who); err != nil {
			return err
		}
	}
	return nil
}

func ruleSendNonBlocking(c *rc, s *chanSet) error {
	const n = 10000
	payload := make([]byte, 256)
	c.fill(payload)
	full := false
	for i := 0; i < n && !full; i++ {
		t0 := time.Now()
		err := s.A.Send("b", payload)
		if qerr := c.quick(fmt.Sprintf("a.Send(\"b\") of message %d to a peer that does not read", i), t0); qerr != nil {
			return qerr
		}
		switch {
		case errors.Is(err, transfer.ErrQueueFull):
			full = true
		case err != nil:
			return fmt.Errorf("a.Send(\"b\") of message %d to a peer that does not read: %v; want nil or ErrQueueFull", i, err)
		}
	}
	c.step("c.Close")
	if err := s.C.Close(); err != nil {
		return fmt.Errorf("c.Close: %v", err)
	}
	for i := range 100 {
		t0 := time.Now()
		_ = s.A.Send("c", payload)
		if qerr := c.quick(fmt.Sprintf("a.Send(\"c\") of message %d to a closed peer", i), t0); qerr != nil {
			return qerr
		}
	}
	return nil
}

func ruleSendNoRetain(c *rc, s *chanSet) error {
	const n = 100
	buf := make([]byte, 64)
	orig := make([][]byte, n)
	for i := range n {
		c.fill(buf)
		orig[i] = bytes.Clone(buf)
		if err := sendAll(c, s.A, "a", "b", 1, func(int) []byte { return buf }); err != nil {
			return err
		}
	}
	c.fill(buf)
	return recvAll(c, s.B, "b", n, func(i int, m transfer.Message) error {
		if d := describeDiff("payload", m.Payload, orig[i]); len(m.Payload) != len(orig[i]) || d != "" {
			return fmt.Errorf("message %d received by b differs from what a sent (%d bytes, %s): the payload buffer was reused after Send returned", i, len(m.Payload), d)
		}
		return nil
	})
}

func ruleControlUnknownPeer(c *rc, s *chanSet) error {
	t0 := time.Now()
	err := s.A.Send("conformance-nobody", []byte("hello"))
	if qerr := c.quick("a.Send to an unknown peer", t0); qerr != nil {
		return qerr
	}
	if !errors.Is(err, transfer.ErrUnknownPeer) {
		return fmt.Errorf("a.Send(\"conformance-nobody\"): %v; want an error wrapping %q", err, transfer.ErrUnknownPeer)
	}
	return nil
}

// garbageEndpoints are endpoints no implementation can use.
func garbageEndpoints() []string {
	return []string{"", " ", "\x00\xff\xfe", "://", "conformance: not an endpoint \n"}
}

func ruleBadEndpoint(c *rc, s *chanSet) error {
	eps := append(garbageEndpoints(), s.BadEndpoints...)
	for _, ep := range eps {
		c.step("a.AddPeer(\"x\", %q)", ep)
		if err := s.A.AddPeer("x", ep); !errors.Is(err, transfer.ErrBadEndpoint) {
			return fmt.Errorf("a.AddPeer(\"x\", %q): %v; want an error wrapping %q", ep, err, transfer.ErrBadEndpoint)
		}
		if err := s.A.Send("x", []byte("hello")); !errors.Is(err, transfer.ErrUnknownPeer) {
			return fmt.Errorf("after a.AddPeer(\"x\", %q) was refused, a.Send(\"x\"): %v; want an error wrapping %q (nothing added)", ep, err, transfer.ErrUnknownPeer)
		}
		if err := s.A.AddPeer("b", ep); !errors.Is(err, transfer.ErrBadEndpoint) {
			return fmt.Errorf("a.AddPeer(\"b\", %q) for the known peer b: %v; want an error wrapping %q", ep, err, transfer.ErrBadEndpoint)
		}
	}
	if err := sendAll(c, s.A, "a", "b", 3, tagged("still")); err != nil {
		return fmt.Errorf("after refused AddPeer calls for b: %w", err)
	}
	if err := recvAll(c, s.B, "b", 3, checkSeq("b", "still", "a")); err != nil {
		return fmt.Errorf("after refused AddPeer calls for b: %w", err)
	}
	return nil
}

func ruleRemoveReadd(c *rc, s *chanSet) error {
	if err := s.A.RemovePeer("b"); err != nil {
		return fmt.Errorf("a.RemovePeer(\"b\"): %v", err)
	}
	if err := s.A.Send("b", []byte("gone")); !errors.Is(err, transfer.ErrUnknownPeer) {
		return fmt.Errorf("a.Send(\"b\") after RemovePeer: %v; want an error wrapping %q", err, transfer.ErrUnknownPeer)
	}
	if err := s.A.AddPeer("b", s.B.LocalEndpoint()); err != nil {
		return fmt.Errorf("a.AddPeer(\"b\") again after RemovePeer: %v", err)
	}
	if err := sendAll(c, s.A, "a", "b", 5, tagged("again")); err != nil {
		return fmt.Errorf("after removing and adding b again: %w", err)
	}
	if err := recvAll(c, s.B, "b", 5, checkSeq("b", "again", "a")); err != nil {
		return fmt.Errorf("after a removed and added b again: %w", err)
	}
	if err := sendAll(c, s.B, "b", "a", 5, tagged("back")); err != nil {
		return fmt.Errorf("after a removed and added b again: %w", err)
	}
	if err := recvAll(c, s.A, "a", 5, checkSeq("a", "back", "b")); err != nil {
		return fmt.Errorf("after a removed and added b again: %w", err)
	}
	return nil
}

func ruleRecvTimeout(c *rc, s *chanSet) error {
	for _, timeout := range []time.Duration{0, 50 * time.Millisecond} {
		t0 := time.Now()
		m, err := s.A.Recv(timeout)
		if qerr := c.quick(fmt.Sprintf("a.Recv(%v) past its timeout", timeout), t0.Add(timeout)); qerr != nil {
			return qerr
		}
		if !errors.Is(err, transfer.ErrTimeout) {
			return fmt.Errorf("a.Recv(%v) with nothing sent returned (%q from %q, %v); want an error wrapping %q", timeout, m.Payload, m.Peer, err, transfer.ErrTimeout)
		}
	}
	return nil
}

func ruleClose(c *rc, s *chanSet) error {
	if err := s.A.Close(); err != nil {
		return fmt.Errorf("a.Close: %v", err)
	}
	if err := s.A.Close(); err != nil && !errors.Is(err, transfer.ErrClosed) {
		return fmt.Errorf("a.Close a second time: %v; want nil (Close is idempotent)", err)
	}
	t0 := time.Now()
	_, err := s.A.Recv(c.cfg.OpTimeout)
	if qerr := c.quick("a.Recv after Close", t0); qerr != nil {
		return qerr
	}
	if !errors.Is(err, transfer.ErrClosed) {
		return fmt.Errorf("a.Recv after Close: %v; want an error wrapping %q", err, transfer.ErrClosed)
	}
	t0 = time.Now()
	err = s.A.Send("b", []byte("after close"))
	if qerr := c.quick("a.Send after Close", t0); qerr != nil {
		return qerr
	}
	if err == nil {
		return fmt.Errorf("a.Send after Close returned nil; want an error (transfer.ErrClosed)")
	}
	return nil
}

func ruleCloseUnblocksRecv(c *rc, s *chanSet) error {
	type result struct {
		m   transfer.Message
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	go func() {
		m, err := s.B.Recv(c.cfg.OpTimeout)
		got <- result{m, err, time.Now()}
	}()
	time.Sleep(20 * time.Millisecond)
	c.step("b.Close with a Recv waiting")
	closed := time.Now()
	if err := s.B.Close(); err != nil {
		<-got
		return fmt.Errorf("b.Close: %v", err)
	}
	r := <-got
	if d := r.at.Sub(closed); d > c.cfg.CallTimeout {
		return fmt.Errorf("a Recv waiting when b.Close was called returned %v after Close; want at once (CallTimeout %v)", d.Round(time.Millisecond), c.cfg.CallTimeout)
	}
	if !errors.Is(r.err, transfer.ErrClosed) {
		return fmt.Errorf("a Recv waiting when b.Close was called returned (%q from %q, %v); want an error wrapping %q", r.m.Payload, r.m.Peer, r.err, transfer.ErrClosed)
	}
	return nil
}
