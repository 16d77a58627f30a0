package pipeline

import (
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/bouncekv/bounce/controlplane/zmq"
	"github.com/bouncekv/bounce/pipeline/wire"
)

// BenchmarkWantGrantZMQ measures the control round trip a transfer pays
// before its first write — WANT to a real agent over zmq, GRANT back — and a
// raw libzmq DEALER/ROUTER ping-pong of the same size on the same machine,
// alternating in every iteration, and reports their ratio.
func BenchmarkWantGrantZMQ(b *testing.B) {
	w := zmqWorld(b, 0)
	recv := w.node("recv", testConfig())
	client, err := zmq.New(zmq.Config{Name: "client", BindAddress: "127.0.0.1"})
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	if err := client.AddPeer("recv", recv.ctrl.LocalEndpoint()); err != nil {
		b.Fatal(err)
	}
	ep := client.LocalEndpoint()
	want := func(id uint64) []byte {
		m, _ := wire.Marshal(&wire.Want{Request: id, ChunkBytes: []uint64{64 << 10}, Endpoint: ep})
		return m
	}
	cancel := func(id uint64) []byte {
		m, _ := wire.Marshal(&wire.Want{Request: id, Endpoint: ep})
		return m
	}

	// Raw ping-pong: a ROUTER echoing whatever a DEALER sends.
	router, _ := zmq4.NewSocket(zmq4.ROUTER)
	defer router.Close()
	router.SetLinger(0)
	if err := router.Bind("tcp://127.0.0.1:*"); err != nil {
		b.Fatal(err)
	}
	addr, _ := router.GetLastEndpoint()
	dealer, _ := zmq4.NewSocket(zmq4.DEALER)
	defer dealer.Close()
	dealer.SetLinger(0)
	if err := dealer.Connect(addr); err != nil {
		b.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		poller := zmq4.NewPoller()
		poller.Add(router, zmq4.POLLIN)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if ps, _ := poller.Poll(10 * time.Millisecond); len(ps) == 0 {
				continue
			}
			msg, err := router.RecvMessageBytes(0)
			if err == nil {
				router.SendMessage(msg)
			}
		}
	}()
	defer func() { close(stop); <-done }()
	payload := want(0)

	var tWant, tRaw time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := uint64(i + 1)
		start := time.Now()
		if err := client.Send("recv", want(id)); err != nil {
			b.Fatal(err)
		}
		m, err := client.Recv(5 * time.Second)
		if err != nil {
			b.Fatal(err)
		}
		tWant += time.Since(start)
		if g, err := wire.Unmarshal(m.Payload); err != nil || g.Type() != wire.TypeGrant {
			b.Fatalf("expected GRANT, got %v %v", g, err)
		}
		if err := client.Send("recv", cancel(id)); err != nil {
			b.Fatal(err)
		}

		start = time.Now()
		if _, err := dealer.SendBytes(payload, 0); err != nil {
			b.Fatal(err)
		}
		if _, err := dealer.RecvBytes(0); err != nil {
			b.Fatal(err)
		}
		tRaw += time.Since(start)
	}
	b.StopTimer()
	b.ReportMetric(float64(tWant.Microseconds())/float64(b.N), "want-grant-µs")
	b.ReportMetric(float64(tRaw.Microseconds())/float64(b.N), "raw-zmq-µs")
	b.ReportMetric(tWant.Seconds()/tRaw.Seconds(), "want-grant/raw")
}
