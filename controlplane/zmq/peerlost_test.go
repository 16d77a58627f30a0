package zmq

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bouncekv/bounce/internal/childproc"
	"github.com/bouncekv/bounce/security"
)

// lostLog records SetPeerLost reports with their time.
type lostLog struct {
	mu    sync.Mutex
	peers []string
	at    []time.Time
}

func (l *lostLog) add(p string) {
	l.mu.Lock()
	l.peers, l.at = append(l.peers, p), append(l.at, time.Now())
	l.mu.Unlock()
}

func (l *lostLog) get() ([]string, []time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.peers...), append([]time.Time(nil), l.at...)
}

// waitLost polls until l holds a report, within hangGuard.
func waitLost(t *testing.T, l *lostLog, what string) ([]string, []time.Time) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		if p, at := l.get(); len(p) > 0 {
			return p, at
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no peer-loss report within %v", what, hangGuard)
		}
		time.Sleep(time.Millisecond)
	}
}

// echoChild starts the echo child process (runChild), connects a
// "parent" channel with it both ways, recording peer-loss reports, and
// exchanges one ping.
func echoChild(t *testing.T) (*childproc.Child, *Channel, *lostLog) {
	t.Helper()
	c := childproc.Start(t, childEnv, "1")
	line, err := c.Next(0)
	if err != nil {
		t.Fatalf("read child endpoint: %v", err)
	}
	parent := newTestChannel(t, "parent")
	lost := &lostLog{}
	parent.SetPeerLost(lost.add)
	if err := parent.AddPeer("child", strings.TrimSpace(line)); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintln(c.Stdin, parent.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	mustSend(t, parent, "child", "ping")
	expectMsg(t, parent, "child", "echo:ping")
	return c, parent, lost
}

// TestPeerLostWhenProcessKilled: a control peer in another process is
// killed with SIGKILL. Its DEALER's connection drops at once and the
// socket monitor reports the peer lost, well before the heartbeat timeout
// (3 s) would have dropped a silent connection.
func TestPeerLostWhenProcessKilled(t *testing.T) {
	c, parent, lost := echoChild(t)
	if p, _ := lost.get(); len(p) != 0 {
		t.Fatalf("reports %v while the child is alive", p)
	}
	killed := time.Now()
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = c.Wait()
	peers, at := waitLost(t, lost, "child killed")
	took := at[0].Sub(killed)
	t.Logf("peer lost reported %v after SIGKILL (heartbeat timeout %v)", took.Round(time.Microsecond), heartbeatTimeout)
	if peers[0] != "child" {
		t.Fatalf("reports %v, want [child]", peers)
	}
	if took >= heartbeatTimeout {
		t.Fatalf("reported %v after the kill: not before the heartbeat timeout (%v), so not by the monitor", took, heartbeatTimeout)
	}
	// The DEALER keeps reconnecting to the dead address; that is no new
	// loss (nothing completes a handshake).
	time.Sleep(300 * time.Millisecond)
	if p, _ := lost.get(); len(p) != 1 {
		t.Fatalf("reports %v, want exactly one", p)
	}
	if n := parent.Stats().LostPeers; n != 1 {
		t.Fatalf("Stats.LostPeers = %d, want 1", n)
	}
}

// TestPeerLostNotOnRemoveOrClose: a DEALER the channel itself removes,
// replaces or closes is no loss; a peer whose channel closes is, once per
// drop; a connection that never completed its handshake (CURVE refused)
// is none.
func TestPeerLostNotOnRemoveOrClose(t *testing.T) {
	a, b, c := newTestChannel(t, "a"), newTestChannel(t, "b"), newTestChannel(t, "c")
	var lost lostLog
	a.SetPeerLost(lost.add)
	connect(t, a, b)
	connect(t, a, c)
	for _, p := range []*Channel{b, c} {
		mustSend(t, a, p.Name(), "hi")
		expectMsg(t, p, "a", "hi")
	}
	if err := a.RemovePeer("b"); err != nil {
		t.Fatal(err)
	}
	if err := a.AddPeer("c", b.LocalEndpoint()); err != nil { // replaces c's DEALER
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if p, _ := lost.get(); len(p) != 0 {
		t.Fatalf("removing and replacing DEALERs reported %v", p)
	}
	d := newTestChannel(t, "d")
	if err := a.AddPeer("d", d.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	mustSend(t, a, "d", "hi")
	expectMsg(t, d, "a", "hi")
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if peers, _ := waitLost(t, &lost, "d closed"); peers[0] != "d" {
		t.Fatalf("reports %v, want [d]", peers)
	}

	// CURVE: e does not admit a's key; the handshake never completes.
	ids := map[string]security.Identity{}
	for _, n := range []string{"a2", "e"} {
		id, err := security.Generate(nil)
		if err != nil {
			t.Fatal(err)
		}
		ids[n] = id
	}
	pa := security.NewPeers(security.Authenticate, ids["a2"], security.Policy{Loaded: true})
	pe := security.NewPeers(security.Authenticate, ids["e"], security.Policy{Loaded: true})
	if err := pa.Introduce("e", ids["e"].Public); err != nil {
		t.Fatal(err)
	}
	a2 := newTestChannel(t, "a2", func(c *Config) { c.Peers = pa })
	e := newTestChannel(t, "e", func(c *Config) { c.Peers = pe })
	var lost2 lostLog
	a2.SetPeerLost(lost2.add)
	if err := a2.AddPeer("e", e.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	mustSend(t, a2, "e", "refused")
	time.Sleep(500 * time.Millisecond)
	if p, _ := lost2.get(); len(p) != 0 {
		t.Fatalf("a refused handshake reported %v", p)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if p, _ := lost.get(); len(p) != 1 {
		t.Fatalf("reports %v after a closed, want only [d]", p)
	}
}

// TestPeerLostWhenProcessSilent: a control peer in another process is
// stopped (SIGSTOP): its connection stays open and TCP sees nothing, so
// only the ZMTP heartbeat (PING every 1 s, dropped after 3 s without a
// reply) drops it, and the socket monitor then reports the peer lost.
// Without the DEALER's heartbeat no report would ever come.
func TestPeerLostWhenProcessSilent(t *testing.T) {
	c, parent, lost := echoChild(t)
	stopped := time.Now()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	peers, at := waitLost(t, lost, "child stopped")
	took := at[0].Sub(stopped)
	t.Logf("silent peer reported lost %v after SIGSTOP (heartbeat interval %v, timeout %v)", took.Round(time.Millisecond), heartbeatIvl, heartbeatTimeout)
	if len(peers) != 1 || peers[0] != "child" {
		t.Fatalf("reports %v, want [child]", peers)
	}
	if n := parent.Stats().LostPeers; n != 1 {
		t.Fatalf("Stats.LostPeers = %d, want 1", n)
	}
}

// TestPeerUpAfterLoss: SetPeerUp reports a peer each time its DEALER's
// connection completes its handshake: first, and again when the peer,
// restarted after the drop SetPeerLost reported, accepts the DEALER (the
// pipeline then stops failing new requests to it as lost).
func TestPeerUpAfterLoss(t *testing.T) {
	a, b := newTestChannel(t, "a"), newTestChannel(t, "b")
	var lost, up lostLog
	a.SetPeerLost(lost.add)
	a.SetPeerUp(up.add)
	endpoint := b.LocalEndpoint()
	if err := a.AddPeer("b", endpoint); err != nil {
		t.Fatal(err)
	}
	mustSend(t, a, "b", "hi")
	expectMsg(t, b, "a", "hi")
	waitCount := func(l *lostLog, n int, what string) {
		t.Helper()
		deadline := time.Now().Add(hangGuard)
		for {
			p, _ := l.get()
			if len(p) >= n {
				for _, name := range p {
					if name != "b" {
						t.Fatalf("%s: reports %v, want only b", what, p)
					}
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d reports within %v, want %d", what, len(p), hangGuard, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitCount(&up, 1, "first handshake")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	waitCount(&lost, 1, "b closed")
	if p, _ := up.get(); len(p) != 1 {
		t.Fatalf("up reports %v after the drop, want one (the first handshake)", p)
	}
	// b restarts (on a new endpoint: the channel binds a free port) and
	// is loaded anew: the new DEALER's handshake is reported.
	b2 := newTestChannel(t, "b")
	if err := a.AddPeer("b", b2.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	mustSend(t, a, "b", "again")
	expectMsg(t, b2, "a", "again")
	waitCount(&up, 2, "b restarted")
	if p, _ := lost.get(); len(p) != 1 {
		t.Fatalf("lost reports %v, want one", p)
	}
}

// TestPeerLostWhenKilledBeforeFirstConnection: a control peer in another
// process is killed with SIGKILL after it bound its endpoint and before
// this channel's first connection to it is up (a sender killed right
// after its WANT, before the receiver's GRANT dialed it). No connection
// ever completed a handshake, yet the failed dial reports the peer lost,
// once, though the DEALER keeps redialing.
func TestPeerLostWhenKilledBeforeFirstConnection(t *testing.T) {
	c := childproc.Start(t, childEnv, "1")
	line, err := c.Next(0)
	if err != nil {
		t.Fatalf("read child endpoint: %v", err)
	}
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = c.Wait()
	parent := newTestChannel(t, "parent")
	var lost lostLog
	parent.SetPeerLost(lost.add)
	if err := parent.AddPeer("child", strings.TrimSpace(line)); err != nil {
		t.Fatal(err)
	}
	peers, _ := waitLost(t, &lost, "first dial to the killed child")
	if peers[0] != "child" {
		t.Fatalf("reports %v, want [child]", peers)
	}
	time.Sleep(300 * time.Millisecond) // redials every 100 ms
	if p, _ := lost.get(); len(p) != 1 {
		t.Fatalf("reports %v, want exactly one", p)
	}
	if n := parent.Stats().LostPeers; n != 1 {
		t.Fatalf("Stats.LostPeers = %d, want 1", n)
	}
}

// TestPeerDownFor: a DEALER is down from its creation until its handshake
// completes, up (0) after, and down again from the drop of its connection;
// one to an endpoint nothing answers stays down, growing; a peer without a
// DEALER is unknown.
func TestPeerDownFor(t *testing.T) {
	a, b := newTestChannel(t, "a"), newTestChannel(t, "b")
	lost := &lostLog{}
	a.SetPeerLost(lost.add)
	if _, known := a.PeerDownFor("b"); known {
		t.Fatal("a peer without a DEALER is known")
	}
	if err := a.AddPeer("b", b.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	if _, known := a.PeerDownFor("b"); !known {
		t.Fatal("a peer with a DEALER is unknown")
	}
	deadline := time.Now().Add(hangGuard)
	for d, _ := a.PeerDownFor("b"); d != 0; d, _ = a.PeerDownFor("b") {
		if time.Now().After(deadline) {
			t.Fatalf("the DEALER to a live peer still down after %v", d)
		}
		time.Sleep(time.Millisecond)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "tcp://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	if err := a.AddPeer("gone", gone); err != nil {
		t.Fatal(err)
	}
	d1, _ := a.PeerDownFor("gone")
	time.Sleep(50 * time.Millisecond)
	if d2, known := a.PeerDownFor("gone"); !known || d2 <= d1 || d2 < 50*time.Millisecond {
		t.Fatalf("the DEALER to nothing: down %v then %v (known %v), want growing", d1, d2, known)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for {
		if p, _ := lost.get(); slices.Contains(p, "b") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b's close not reported")
		}
		time.Sleep(time.Millisecond)
	}
	if d, _ := a.PeerDownFor("b"); d == 0 {
		t.Fatal("the DEALER to a closed peer is still up")
	}
}
