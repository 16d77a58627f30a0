package security_test

// Issue 26: an admitted peer (its key is in the receiver's allowed_peers)
// that misbehaves, against a receiver in another process. mallory speaks
// the control protocol by hand over an authenticated ZeroMQ channel (and
// writes with a real, authenticated tcp engine), alice is a legitimate
// sender whose bytes are checked in the receiver's memory.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pebbe/zmq4"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/controlplane/zmq"
	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/internal/childproc"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/transfer"
)

const victimSize = 8 << 20

// victim is the receiver child and what it printed.
type victim struct {
	t             *testing.T
	c             *childproc.Child
	listen        string
	desc          []byte
	rd            wire.AgentDesc
	alice, open   uint64
	arena, arenaN uint64
	keys          map[string]security.Identity
	keyFiles      map[string]string
}

// startVictim starts the receiver child; advertise, if set, is the address
// its engine advertises (set fills it in once the child says where it
// listens).
func startVictim(t *testing.T, advertise string, env ...string) *victim {
	dir := t.TempDir()
	v := &victim{t: t, keys: map[string]security.Identity{}, keyFiles: map[string]string{}}
	for _, name := range []string{"recv", "alice", "mallory"} {
		p := filepath.Join(dir, name+".key")
		id, _, err := security.LoadOrCreate(p)
		if err != nil {
			t.Fatal(err)
		}
		v.keys[name], v.keyFiles[name] = id, p
	}
	allowed := fmt.Sprintf("alice=%s,mallory=%s", v.keys["alice"].Public, v.keys["mallory"].Public)
	env = append([]string{"BOUNCE_SECURITY_TEST_KEY=" + v.keyFiles["recv"], "BOUNCE_SECURITY_TEST_ALLOWED=" + allowed,
		fmt.Sprintf("BOUNCE_SECURITY_TEST_SIZE=%d", victimSize), "BOUNCE_SECURITY_TEST_ADVERTISE=" + advertise}, env...)
	v.c = childproc.Start(t, childEnv, "recv", env...)
	v.listen = v.expect("LISTEN ")
	var err error
	if v.desc, err = hex.DecodeString(v.expect("DESC ")); err != nil {
		t.Fatal(err)
	}
	if v.rd, err = wire.UnmarshalAgentDesc(v.desc); err != nil || v.rd.Handshake == nil {
		t.Fatalf("receiver descriptor: %v", err)
	}
	v.alice, _ = strconv.ParseUint(v.expect("ALICE "), 10, 64)
	v.open, _ = strconv.ParseUint(v.expect("OPEN "), 10, 64)
	a, n, _ := strings.Cut(v.expect("ARENA "), " ")
	v.arena, _ = strconv.ParseUint(a, 10, 64)
	v.arenaN, _ = strconv.ParseUint(n, 10, 64)
	return v
}

func (v *victim) expect(prefix string) string {
	v.t.Helper()
	l, err := v.c.Next(hangTime)
	if err != nil || !strings.HasPrefix(l, prefix) {
		v.t.Fatalf("receiver said %q (%v), want %q", l, err, prefix)
	}
	return strings.TrimSpace(strings.TrimPrefix(l, prefix))
}

func (v *victim) ask(cmd, prefix string) string {
	v.t.Helper()
	if _, err := fmt.Fprintln(v.c.Stdin, cmd); err != nil {
		v.t.Fatal(err)
	}
	return v.expect(prefix)
}

// stats returns the receiver's BadRuns, FencedWrites and ForbiddenWrites.
func (v *victim) stats() (badRuns, fenced, forbidden uint64) {
	v.t.Helper()
	f := strings.Fields(v.ask("STATS", "STATS "))
	x := make([]uint64, 3)
	for i := range x {
		x[i], _ = strconv.ParseUint(f[i], 10, 64)
	}
	return x[0], x[1], x[2]
}

// aliceNode is the legitimate sender, loaded with the receiver's
// descriptor; mods adjust its configuration.
func (v *victim) aliceNode(mods ...func(*config.Config)) *agent {
	a := start(v.t, "alice", victimSize, append([]func(*config.Config){func(c *config.Config) {
		c.Security.KeyFile = v.keyFiles["alice"]
		c.Bounce.MaxChunk = 2 * config.MiB
	}}, mods...)...)
	a.register(v.t)
	if _, err := a.n.Agent.LoadPeer(v.desc); err != nil {
		v.t.Fatal(err)
	}
	return a
}

// aliceSends moves alice's whole buffer (refilled from seed) into the
// receiver's alice buffer, 4 KiB blocks in an order drawn from seed, and
// returns the batch and the SUM the receiver must then report.
func (v *victim) aliceSends(a *agent, seed uint64) (*pipeline.Batch, string) {
	v.t.Helper()
	r := rand.New(rand.NewPCG(seed, 26))
	src := a.buf.Bytes()
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	want := make([]byte, victimSize)
	req := pipeline.Request{Peer: "recv", Route: pipeline.RouteBounce}
	for i, p := range r.Perm(victimSize / block) {
		req.Src = append(req.Src, mem.DescOf(src[i*block:(i+1)*block]))
		req.Dst = append(req.Dst, transfer.Desc{Addr: v.alice + uint64(p*block), Len: block, Kind: transfer.Host})
		copy(want[p*block:], src[i*block:(i+1)*block])
	}
	b, err := a.n.Agent.Submit(req)
	if err != nil {
		v.t.Fatal(err)
	}
	return b, fmt.Sprintf("%x", sha256.Sum256(want))
}

// aliceLands waits for b and checks the receiver's memory holds exactly
// alice's bytes.
func (v *victim) aliceLands(b *pipeline.Batch, sum string) {
	v.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hangTime)
	defer cancel()
	if err := b.Wait(ctx); err != nil {
		v.t.Fatalf("alice's transfer failed: %v", err)
	}
	if got := v.ask("SUM", "SUM "); got != sum {
		v.t.Fatal("alice's bytes at the receiver differ from what she sent")
	}
}

// raw is mallory's authenticated control channel, spoken by hand.
type raw struct {
	t  *testing.T
	ch *zmq.Channel
}

func (v *victim) mallory() *raw {
	p := security.NewPeers(security.Authenticate, v.keys["mallory"], security.Policy{Loaded: true})
	if err := p.Introduce("recv", security.Key(v.rd.PublicKey)); err != nil {
		v.t.Fatal(err)
	}
	ch, err := zmq.New(zmq.Config{Name: "mallory", BindAddress: "127.0.0.1", Peers: p})
	if err != nil {
		v.t.Fatal(err)
	}
	v.t.Cleanup(func() { ch.Close() })
	if err := ch.AddPeer("recv", v.rd.Handshake.Endpoint); err != nil {
		v.t.Fatal(err)
	}
	return &raw{t: v.t, ch: ch}
}

func (m *raw) send(msg wire.Message) {
	m.t.Helper()
	b, err := wire.Marshal(msg)
	if err != nil {
		m.t.Fatal(err)
	}
	if err := m.ch.Send("recv", b); err != nil {
		m.t.Fatal(err)
	}
}

func (m *raw) recv(d time.Duration) wire.Message {
	m.t.Helper()
	msg, err := m.ch.Recv(d)
	if errors.Is(err, transfer.ErrTimeout) {
		return nil
	}
	if err != nil {
		m.t.Fatal(err)
	}
	w, err := wire.Unmarshal(msg.Payload)
	if err != nil {
		m.t.Fatal(err)
	}
	return w
}

// grant asks for one chunk of n bytes and returns its credit.
func (m *raw) grant(req, n uint64) wire.Credit {
	m.t.Helper()
	m.send(&wire.Want{Request: req, ChunkBytes: []uint64{n}, Endpoint: m.ch.LocalEndpoint()})
	for {
		msg := m.recv(hangTime)
		if g, ok := msg.(*wire.Grant); ok && g.Request == req && len(g.Credits) == 1 {
			return g.Credits[0]
		}
		if msg == nil {
			m.t.Fatalf("no GRANT for request %d", req)
		}
	}
}

// TestAdmittedPeerDataRunsConfined (issue 26 item 1): during alice's
// transfer, an admitted peer's DATA for its own grant scatters into the
// arena, into the memory registered for alice alone, and asks for 10,000
// copies of its whole 1 MiB region (10 GiB) into memory registered for
// all. Each is NACKed with the reason, without a copy; alice's bytes land
// exactly.
func TestAdmittedPeerDataRunsConfined(t *testing.T) {
	v := startVictim(t, "")
	alice := v.aliceNode()
	m := v.mallory()
	b, sum := v.aliceSends(alice, 1)
	huge := make([]transfer.Run, 10000)
	for i := range huge {
		huge[i] = transfer.Run{Addr: v.open, Len: 1 << 20, Count: 1}
	}
	cases := []struct {
		name string
		code wire.NackCode
		runs []transfer.Run
	}{
		{"arena", wire.NackForbidden, []transfer.Run{{Addr: v.arena, Len: 1 << 20, Count: 1}}},
		{"alice's memory", wire.NackForbidden, []transfer.Run{{Addr: v.alice, Len: 1 << 20, Count: 1}}},
		{"10 GiB of copies", wire.NackBadRuns, huge},
	}
	for i, tc := range cases {
		req := uint64(100 + i)
		cr := m.grant(req, 1<<20)
		m.send(&wire.Data{Request: req, Region: cr.Region, Runs: tc.runs})
		var got wire.Message
		for got == nil {
			got = m.recv(hangTime)
			if _, ok := got.(*wire.Grant); ok {
				got = nil
			}
		}
		if n, ok := got.(*wire.Nack); !ok || n.Request != req || n.Code != tc.code || !strings.Contains(n.Reason, "DATA refused") {
			t.Fatalf("%s: the receiver answered %#v, want a NACK %v with the reason", tc.name, got, tc.code)
		}
	}
	v.aliceLands(b, sum)
	if bad, _, _ := v.stats(); bad != uint64(len(cases)) {
		t.Fatalf("receiver counted %d bad DATA, want %d", bad, len(cases))
	}
}

// throttle is a TCP proxy in front of the receiver's engine. Connections
// accepted while slow is set forward the dialer's bytes 4 KiB every 10 ms;
// forwarded counts those bytes.
type throttle struct {
	ln        net.Listener
	upstream  atomic.Pointer[string]
	slow      atomic.Bool
	forwarded atomic.Int64
	wg        sync.WaitGroup
}

func newThrottle(t *testing.T) *throttle {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &throttle{ln: ln}
	var mu sync.Mutex
	var conns []net.Conn
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", *p.upstream.Load())
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			slow := p.slow.Load()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); io.Copy(c, up); c.Close() }()
			go func() {
				defer p.wg.Done()
				defer up.Close()
				if !slow {
					io.Copy(up, c)
					return
				}
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if _, werr := up.Write(buf[:n]); werr != nil {
							return
						}
						p.forwarded.Add(int64(n))
						time.Sleep(10 * time.Millisecond)
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// TestAdmittedPeerTrickleFencedAtCancel (issue 26 item 2): an admitted
// peer writes 2 MiB into its grant at 400 KB/s and cancels its flow while
// the frame is still arriving. The cancel fences the region: the frame is
// cut before the region is granted again, so alice's transfers, which take
// the region next, land exactly; on a receiver whose authorization ended
// only at the frame's header, the trickle kept writing the region for
// seconds after it went to alice.
func TestAdmittedPeerTrickleFencedAtCancel(t *testing.T) {
	p := newThrottle(t)
	v := startVictim(t, p.ln.Addr().String())
	p.upstream.Store(&v.listen)
	alice := v.aliceNode()
	b, sum := v.aliceSends(alice, 2) // alice's connections are fast
	v.aliceLands(b, sum)

	m := v.mallory()
	mp := security.NewPeers(security.Authenticate, v.keys["mallory"], security.Policy{Loaded: true})
	if err := mp.Introduce("recv", security.Key(v.rd.PublicKey)); err != nil {
		t.Fatal(err)
	}
	me, err := tcp.New(tcp.Config{Name: "mallory", Peers: mp, Connections: 1, WriteTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer me.Close()
	src, err := mem.Alloc(2 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Free()
	for i := range src.Bytes() {
		src.Bytes()[i] = 0xEE
	}
	if err := me.RegisterMemory(src.Desc()); err != nil {
		t.Fatal(err)
	}
	if _, err := me.LoadPeer(v.rd.Engine); err != nil {
		t.Fatal(err)
	}
	cr := m.grant(7, 2<<20)
	p.slow.Store(true)
	op, err := me.PostWrite("recv", []transfer.WriteOp{{Src: src.Desc(), Dst: transfer.Desc{Addr: cr.Addr, Len: cr.Len, Kind: transfer.Host}}})
	if err != nil {
		t.Fatal(err)
	}
	defer op.Release()
	waitFor(t, "mallory's payload trickling", func() bool { return p.forwarded.Load() > 256<<10 })
	p.slow.Store(false)
	m.send(&wire.Want{Request: 7, Endpoint: m.ch.LocalEndpoint()}) // cancel
	waitFor(t, "the trickling frame cut", func() bool { _, fenced, _ := v.stats(); return fenced >= 1 })
	// The region is alice's again: her transfers take it over and over
	// while the trickle would still be arriving (it needs 5 s in all).
	for seed := uint64(3); seed < 9; seed++ {
		b, sum := v.aliceSends(alice, seed)
		v.aliceLands(b, sum)
	}
	for {
		st, err := op.Poll()
		if st.Terminal() {
			if err == nil {
				t.Fatal("mallory's cut write succeeded")
			}
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if p.forwarded.Load() >= 2<<20 {
		t.Fatal("the whole trickle went through")
	}
}

// tarpit listens on another loopback host (127.0.0.2) and counts the
// connections it accepts: the third host an attacker names.
type tarpit struct {
	ln       net.Listener
	accepted atomic.Int64
}

func newTarpit(t *testing.T) *tarpit {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no second loopback address: %v", err)
	}
	p := &tarpit{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.accepted.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return p
}

// TestAdmittedPeerWantCannotChooseWhereTheReceiverDials (issue 26,
// docs/SECURITY.md "cannot make the receiver dial an address of its
// choosing"): an admitted peer the receiver (another process) never loaded
// — admitted by its key in allowed_peers, so the receiver learns its
// control endpoint from its WANTs — names an endpoint on a third host
// (127.0.0.2) in a WANT. The receiver does not connect there (the WANT is
// rejected: the endpoint is not on the host the WANT came from); the same
// peer's WANT naming its own endpoint is granted. Before, the receiver
// opened its reverse path to the third host.
func TestAdmittedPeerWantCannotChooseWhereTheReceiverDials(t *testing.T) {
	pit := newTarpit(t)
	v := startVictim(t, "")
	m := v.mallory()
	m.send(&wire.Want{Request: 1, ChunkBytes: []uint64{4096}, Endpoint: "tcp://" + pit.ln.Addr().String()})
	time.Sleep(3 * time.Second) // the GRANT, and so the dial, would have gone by now
	if n := pit.accepted.Load(); n != 0 {
		t.Fatalf("the receiver connected %d time(s) to %s, the endpoint mallory's WANT named", n, pit.ln.Addr())
	}
	if g := m.grant(2, 4096); g.Len != 4096 {
		t.Fatalf("mallory's honest WANT: credit of %d bytes, want 4096", g.Len)
	}
	if n := pit.accepted.Load(); n != 0 {
		t.Fatalf("the receiver connected %d time(s) to %s", n, pit.ln.Addr())
	}
}

// TestLoadedPeerWantCannotChooseWhereTheReceiverDials: a peer whose
// descriptor the receiver loaded names a third host's endpoint in its
// WANTs: the receiver answers at the loaded descriptor's endpoint
// (ForeignEndpoints counts the difference) and never connects there.
func TestLoadedPeerWantCannotChooseWhereTheReceiverDials(t *testing.T) {
	pit := newTarpit(t)
	recv, _ := pair(t)
	m := mallory(t, recv)
	grants := recv.stats().Grants
	w, _ := wire.Marshal(&wire.Want{Request: 1, ChunkBytes: []uint64{4096}, Endpoint: "tcp://" + pit.ln.Addr().String()})
	if err := m.n.Control.Send("recv", w); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the WANT granted", func() bool { return recv.stats().Grants > grants })
	if st := recv.stats(); st.ForeignEndpoints == 0 {
		t.Fatalf("ForeignEndpoints = 0 after a WANT naming %s: %+v", pit.ln.Addr(), st)
	}
	time.Sleep(time.Second)
	if n := pit.accepted.Load(); n != 0 {
		t.Fatalf("the receiver connected %d time(s) to %s, the endpoint mallory's WANT named", n, pit.ln.Addr())
	}
}

// fds returns the receiver's open descriptors, the control messages its
// channel received and its reverse control paths.
func (v *victim) fds() (fds, received, paths uint64) {
	v.t.Helper()
	f := strings.Fields(v.ask("FDS", "FDS "))
	x := make([]uint64, 3)
	for i := range x {
		x[i], _ = strconv.ParseUint(f[i], 10, 64)
	}
	return x[0], x[1], x[2]
}

// TestManyNamesReversePathsBounded (issue 26 item 5, the ZeroMQ side):
// with security.mode off, 1,100 names from one host each send a WANT
// naming a control endpoint on that host to a receiver in another
// process, and close their connection; then 1,100 more. The receiver's
// reverse control paths (a DEALER each, four descriptors with its monitor)
// are capped per sending host, so its descriptors stay flat: at most 64
// paths, and the second 1,100 names add nothing. Before, only
// max_control_peers (1,024) and libzmq's socket limit bounded them: fds
// grew from 26 to 1,382.
func TestManyNamesReversePathsBounded(t *testing.T) {
	const names = 1100
	v := startVictim(t, "", "BOUNCE_SECURITY_TEST_MODE=off")
	base, _, _ := v.fds()
	zctx, err := zmq4.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	if err := zctx.SetMaxSockets(4 * names); err != nil { // closed ones linger until flushed
		t.Fatal(err)
	}
	// The endpoint every name claims: one ROUTER here takes the
	// receiver's reverse connections.
	back, err := zctx.NewSocket(zmq4.ROUTER)
	if err != nil {
		t.Fatal(err)
	}
	back.SetLinger(0)
	if err := back.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	ep, err := back.GetLastEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	// The names come 16 at a time (each batch's WANTs received before the
	// next), so their short-lived connections stay well within the
	// receiver's incoming connection cap per host
	// (security.max_control_conns_per_host), which
	// TestControlConnFloodBounded shows.
	const batch = 16
	waitReceived := func(n int) {
		deadline := time.Now().Add(hangTime)
		for {
			_, received, _ := v.fds()
			if received >= uint64(n) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the receiver got %d of %d WANTs", received, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	round := func(first int) (fds, paths uint64) {
		for i := first; i < first+names; i++ {
			if i > first && (i-first)%batch == 0 {
				waitReceived(i)
			}
			s, err := zctx.NewSocket(zmq4.DEALER)
			if err != nil {
				t.Fatal(err)
			}
			s.SetLinger(2 * time.Second)
			s.SetIdentity(fmt.Sprintf("n%05d", i))
			if err := s.Connect(v.rd.Handshake.Endpoint); err != nil {
				t.Fatal(err)
			}
			w, _ := wire.Marshal(&wire.Want{Request: uint64(i + 1), ChunkBytes: []uint64{4096}, Endpoint: ep})
			if _, err := s.SendBytes(w, 0); err != nil {
				t.Fatal(err)
			}
			s.Close() // flushed within the linger, then the connection ends
		}
		waitReceived(first + names)
		time.Sleep(2 * time.Second) // reverse paths opened, closed connections reaped
		fds, _, paths = v.fds()
		return fds, paths
	}
	fds1, paths1 := round(0)
	fds2, paths2 := round(names)
	t.Logf("receiver fds %d, after %d names %d (%d reverse control paths), after %d more %d (%d paths)", base, names, fds1, paths1, names, fds2, paths2)
	if paths1 > pipeline.MaxControlPeersPerHost || paths2 > pipeline.MaxControlPeersPerHost {
		t.Errorf("%d, then %d reverse control paths for names from one host, want at most %d", paths1, paths2, pipeline.MaxControlPeersPerHost)
	}
	if fds1 > base+5*pipeline.MaxControlPeersPerHost {
		t.Errorf("receiver fds grew from %d to %d under %d names", base, fds1, names)
	}
	if fds2 > fds1+16 {
		t.Errorf("receiver fds grew from %d to %d under %d more names: not flat", fds1, fds2, names)
	}
}
