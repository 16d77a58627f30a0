package security_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/pipeline"
)

// benchPair is a sender and a receiver of one trust setting, with the
// request (81,920 × 4 KiB, fragmented) prepared once.
type benchPair struct {
	name      string
	recv, snd *agent
	req       pipeline.Request
	total     time.Duration
	last      time.Duration // the latest run
}

func newBenchPair(b *testing.B, name string, count int, mod func(*config.Config)) *benchPair {
	p := &benchPair{name: name}
	mods := func(c *config.Config) {
		c.Bounce.ArenaSize = 256 * config.MiB
		c.Bounce.MaxChunk = 8 * config.MiB
		mod(c)
	}
	p.recv = startB(b, "recv-"+name, count*block, mods)
	p.snd = startB(b, "send-"+name, count*block, mods)
	if err := p.recv.n.Agent.RegisterMemory(p.recv.buf.Desc()); err != nil {
		b.Fatal(err)
	}
	if err := p.snd.n.Agent.RegisterMemory(p.snd.buf.Desc()); err != nil {
		b.Fatal(err)
	}
	for _, l := range [][2]*agent{{p.snd, p.recv}, {p.recv, p.snd}} {
		d, err := l[1].n.Agent.Descriptor()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := l[0].n.Agent.LoadPeer(d); err != nil {
			b.Fatal(err)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range p.snd.buf.Bytes() {
		p.snd.buf.Bytes()[i] = byte(i*7 + i>>12)
	}
	perm := r.Perm(count)
	p.req = pipeline.Request{Peer: p.recv.name, Route: pipeline.RouteBounce}
	for i := 0; i < count; i++ {
		p.req.Src = append(p.req.Src, mem.DescOf(p.snd.buf.Bytes()[i*block:(i+1)*block]))
		p.req.Dst = append(p.req.Dst, mem.DescOf(p.recv.buf.Bytes()[perm[i]*block:(perm[i]+1)*block]))
	}
	return p
}

func (p *benchPair) run(b *testing.B) {
	start := time.Now()
	bt, err := p.snd.n.Agent.Submit(p.req)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := bt.Wait(ctx); err != nil {
		b.Fatalf("%s: %v\nreceiver %+v\narena %+v\nengine %+v\nsender %+v", p.name, err,
			p.recv.stats(), p.recv.n.Agent.ArenaStats(), p.recv.engine().Stats(), p.snd.stats())
	}
	p.last = time.Since(start)
	p.total += p.last
}

// verify checks every block once, after the timed runs.
func (p *benchPair) verify(b *testing.B) {
	for i := range p.req.Src {
		s, d := p.req.Src[i], p.req.Dst[i]
		if string(mem.Unsafe(s.Addr, s.Len)) != string(mem.Unsafe(d.Addr, d.Len)) {
			b.Fatalf("%s: block %d differs", p.name, i)
		}
	}
}

// BenchmarkTrust moves 81,920 × 4 KiB (Llama-3.1-70B TP=8, block 16,
// fragmented) over the tcp engine and the zmq control plane with the bounce
// route, alternating three agent pairs in one run: security.mode off,
// authenticate (the default) and authenticate with engine.encryption on.
// It reports auth/off and encrypted/auth throughput ratios.
func BenchmarkTrust(b *testing.B) {
	const count = 81920
	off := newBenchPair(b, "off", count, func(c *config.Config) { c.Security.Mode = "off" })
	auth := newBenchPair(b, "auth", count, func(*config.Config) {})
	enc := newBenchPair(b, "enc", count, func(c *config.Config) { c.Engine.Encryption = "on" })
	pairs := []*benchPair{off, auth, enc}
	for _, p := range pairs { // warm-up: connections, first touch
		p.run(b)
		p.total = 0
	}
	// Per-iteration ratios (each iteration runs the three back to back, in
	// an order rotated every iteration); the medians are reported, so one
	// iteration disturbed by other load on the machine does not decide.
	var authOff, encAuth []float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range pairs {
			pairs[(i+j)%len(pairs)].run(b)
		}
		authOff = append(authOff, off.last.Seconds()/auth.last.Seconds())
		encAuth = append(encAuth, auth.last.Seconds()/enc.last.Seconds())
	}
	b.StopTimer()
	for _, p := range pairs {
		p.verify(b)
	}
	bytes := float64(count * block * b.N)
	gbps := func(p *benchPair) float64 { return bytes / p.total.Seconds() / 1e9 }
	b.ReportMetric(gbps(off), "off-GB/s")
	b.ReportMetric(gbps(auth), "auth-GB/s")
	b.ReportMetric(gbps(enc), "enc-GB/s")
	b.ReportMetric(median(authOff), "auth/off")
	b.ReportMetric(median(encAuth), "enc/auth")
	b.Logf("per-iteration auth/off %.3f, enc/auth %.3f", authOff, encAuth)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// startB is start for benchmarks.
func startB(b *testing.B, name string, bufSize int, mod func(*config.Config)) *agent {
	b.Helper()
	return startTB(b, name, bufSize, mod)
}
