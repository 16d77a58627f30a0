package pipeline

import (
	"math"
	"testing"
	"time"

	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// TestStagesOfASuccessfulRequest: a bounce request reports time in every
// stage it went through, a direct one its write.
func TestStagesOfASuccessfulRequest(t *testing.T) {
	w := newWorld(t)
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	j := simple(t, a, b, 9)
	connect(t, a, b)
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst, Route: RouteBounce})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	s := bt.Stages()
	// AckWait may be 0: its clock starts when sending the DATA returned,
	// and on a loaded machine the receiver can scatter (Scatter, capped
	// at DATA→ACK) before the send returns. It is never negative.
	if s.Plan <= 0 || s.GrantWait <= 0 || s.Gather <= 0 || s.Write <= 0 || s.Data <= 0 || s.Scatter <= 0 || s.AckWait < 0 {
		t.Fatalf("bounce stages %+v: every stage took time (the trip after the DATA none or some)", s)
	}
	bt, err = a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst, Route: RouteDirect})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	if s := bt.Stages(); s.Write <= 0 || s.Gather != 0 || s.Scatter != 0 || s.AckWait != 0 {
		t.Fatalf("direct stages %+v", s)
	}
	if got := (Stages{Write: 4, Gather: 2, Scatter: 6}).Add(Stages{Write: 2}).Div(2); got != (Stages{Write: 3, Gather: 1, Scatter: 3}) {
		t.Fatalf("Add/Div: %+v", got)
	}
}

// slowScatterer wraps a real scatterer: every scatter starts after delay.
type slowScatterer struct {
	transfer.Scatterer
	delay time.Duration
}

func (s *slowScatterer) Scatter(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	time.Sleep(s.delay)
	return s.Scatterer.Scatter(region, runs)
}

// TestStagesScatterFromTheReceiver: the Scatter stage is the receiver's
// scatter time carried back in each ACK, separate from the ACK's trip: a
// receiver whose every scatter takes at least 30ms reports at least that
// much per chunk, and Scatter plus AckWait is the sender's DATA→ACK time.
func TestStagesScatterFromTheReceiver(t *testing.T) {
	const delay = 30 * time.Millisecond
	w := newWorld(t)
	cfg := testConfig()
	a := w.node("a", cfg)
	b := w.node("b", cfg, func(s *Settings) { s.Scatterer = &slowScatterer{Scatterer: s.Scatterer, delay: delay} })
	const total = 4 << 20 // 4 chunks of 1 MiB
	src, dst := a.buffer(t, total), b.buffer(t, total)
	connect(t, a, b)
	j := prepare(src, dst, kvLayout{count: 1024, size: 4096, fragmented: true}, 3)
	start := time.Now()
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst, Route: RouteBounce})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	s := bt.Stages()
	if s.Scatter < 4*delay {
		t.Fatalf("scatter stage %v over 4 chunks each scattered after %v: want at least %v (stages %+v)", s.Scatter, delay, 4*delay, s)
	}
	// Chunks overlap (W = 4), so the sum is bounded by W × the latency.
	if s.Scatter+s.AckWait > time.Duration(cfg.MaxInflight)*took {
		t.Fatalf("scatter %v + ack %v exceed %d × the request's %v", s.Scatter, s.AckWait, cfg.MaxInflight, took)
	}
	if err := j.check(); err != nil {
		t.Fatal(err)
	}
}

// inflatingControl wraps a real control channel: every ACK it receives
// claims a scatter time of MaxUint64 nanoseconds, as a lying peer's would.
type inflatingControl struct {
	transfer.ControlChannel
}

func (c *inflatingControl) Recv(timeout time.Duration) (transfer.Message, error) {
	m, err := c.ControlChannel.Recv(timeout)
	if err != nil {
		return m, err
	}
	if msg, derr := wire.Unmarshal(m.Payload); derr == nil {
		if a, ok := msg.(*wire.Ack); ok {
			a.ScatterNS = math.MaxUint64
			if b, merr := wire.Marshal(a); merr == nil {
				m.Payload = b
			}
		}
	}
	return m, nil
}

// TestStagesScatterCappedByTheSender: a peer's claimed scatter time is
// capped at the sender's own DATA→ACK time, so a lying ACK can neither
// inflate Scatter beyond it nor make AckWait negative.
func TestStagesScatterCappedByTheSender(t *testing.T) {
	w := newWorld(t)
	a := w.node("a", testConfig(), func(s *Settings) { s.Control = &inflatingControl{s.Control} })
	b := w.node("b", testConfig())
	j := simple(t, a, b, 4)
	connect(t, a, b)
	start := time.Now()
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst, Route: RouteBounce})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	s := bt.Stages()
	if s.Scatter <= 0 || s.AckWait != 0 || s.Scatter > time.Duration(testConfig().MaxInflight)*took {
		t.Fatalf("stages %+v over a %v request: a lying ACK's scatter must be capped at DATA→ACK (AckWait 0)", s, took)
	}
}
