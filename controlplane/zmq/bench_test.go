package zmq

import (
	"errors"
	"sync"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/bouncekv/bounce/transfer"
)

// rawPingPong is the baseline: one pebbe/zmq4 DEALER talking to a ROUTER
// that echoes every message back on the same connection.
type rawPingPong struct {
	zctx   *zmq4.Context
	dealer *zmq4.Socket
	done   chan struct{}
}

func newRawPingPong(b *testing.B) *rawPingPong {
	zctx, err := zmq4.NewContext()
	if err != nil {
		b.Fatal(err)
	}
	router, err := zctx.NewSocket(zmq4.ROUTER)
	if err != nil {
		b.Fatal(err)
	}
	router.SetLinger(0)
	if err := router.Bind("tcp://127.0.0.1:*"); err != nil {
		b.Fatal(err)
	}
	ep, err := router.GetLastEndpoint()
	if err != nil {
		b.Fatal(err)
	}
	dealer, err := zctx.NewSocket(zmq4.DEALER)
	if err != nil {
		b.Fatal(err)
	}
	dealer.SetLinger(0)
	if err := dealer.Connect(ep); err != nil {
		b.Fatal(err)
	}
	r := &rawPingPong{zctx: zctx, dealer: dealer, done: make(chan struct{})}
	go func() { // owns router; ends when the context is terminated
		defer close(r.done)
		defer router.Close()
		for {
			frames, err := router.RecvMessageBytes(0)
			if err != nil {
				return
			}
			if _, err := router.SendMessage(frames); err != nil {
				return
			}
		}
	}()
	return r
}

func (r *rawPingPong) roundTrip(b *testing.B, p []byte) {
	if _, err := r.dealer.SendBytes(p, 0); err != nil {
		b.Fatal(err)
	}
	if _, err := r.dealer.RecvBytes(0); err != nil {
		b.Fatal(err)
	}
}

func (r *rawPingPong) close() {
	r.dealer.Close()
	r.zctx.Term()
	<-r.done
}

// BenchmarkRoundTrip measures a request/reply round trip through two
// Channels (Send+Recv each way) and a raw DEALER<->ROUTER ping-pong,
// interleaved in blocks in the same run, and reports channel RTT / raw RTT
// as "ratio".
func BenchmarkRoundTrip(b *testing.B) {
	a := newTestChannel(b, "a")
	e := newTestChannel(b, "echo")
	connect(b, a, e)
	var echoDone sync.WaitGroup
	echoDone.Add(1)
	go func() {
		defer echoDone.Done()
		for {
			m, err := e.Recv(time.Hour)
			if errors.Is(err, transfer.ErrClosed) {
				return
			}
			if err == nil {
				_ = e.Send(m.Peer, m.Payload)
			}
		}
	}()
	raw := newRawPingPong(b)

	payload := make([]byte, 64) // about a GRANT/ACK
	chanRT := func() {
		if err := a.Send("echo", payload); err != nil {
			b.Fatal(err)
		}
		if _, err := a.Recv(hangGuard); err != nil {
			b.Fatal(err)
		}
	}
	for range 200 { // connect and warm up both paths
		chanRT()
		raw.roundTrip(b, payload)
	}

	const block = 100
	var chanDur, rawDur time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i += block {
		k := min(block, b.N-i)
		t0 := time.Now()
		for range k {
			chanRT()
		}
		t1 := time.Now()
		for range k {
			raw.roundTrip(b, payload)
		}
		rawDur += time.Since(t1)
		chanDur += t1.Sub(t0)
	}
	b.StopTimer()
	chanNs := float64(chanDur.Nanoseconds()) / float64(b.N)
	rawNs := float64(rawDur.Nanoseconds()) / float64(b.N)
	b.ReportMetric(chanNs, "chan-ns/rtt")
	b.ReportMetric(rawNs, "raw-ns/rtt")
	b.ReportMetric(chanNs/rawNs, "ratio")

	raw.close()
	e.Close()
	echoDone.Wait()
}
