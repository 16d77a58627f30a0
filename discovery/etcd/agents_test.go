package etcd_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/discovery"
	"github.com/bouncekv/bounce/discovery/etcd"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/transfer"
)

// raw publishes the agent descriptor itself.
func raw(v []byte) ([]byte, error) { return v, nil }

// agent is one real agent (tcp engine, ZeroMQ control plane, keys) with a
// registered buffer, published under its name through its own client.
type agent struct {
	n   *node.Node
	buf *mem.Buffer
	dir *etcd.Directory
	pub discovery.Publication
}

func startAgent(t *testing.T, endpoint, name string, size uint64) *agent {
	t.Helper()
	return startAgentWith(t, endpoint, name, size, node.Options{})
}

// startAgentWith is startAgent with the node's options.
func startAgentWith(t *testing.T, endpoint, name string, size uint64, o node.Options) *agent {
	t.Helper()
	cfg := config.Default()
	cfg.Agent.Name = name
	cfg.Bounce.ArenaSize, cfg.Bounce.MaxChunk = 8*config.MiB, 1*config.MiB
	cfg.Bounce.RequestTimeout = 2 * time.Minute // only the lease may fail a request here
	n, err := node.BuildWith(cfg, node.Builtin(), o)
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{n: n}
	t.Cleanup(func() { a.stop() })
	if a.buf, err = mem.Alloc(size); err != nil {
		t.Fatal(err)
	}
	if err := n.Agent.RegisterMemory(a.buf.Desc()); err != nil {
		t.Fatal(err)
	}
	blob, err := n.Agent.Descriptor()
	if err != nil {
		t.Fatal(err)
	}
	a.dir = open(t, cfgFor(endpoint))
	if a.pub, err = a.dir.Publish(context.Background(), name, blob); err != nil {
		t.Fatal(err)
	}
	return a
}

// stop closes the agent gracefully (its record withdrawn).
func (a *agent) stop() {
	if a.n == nil {
		return
	}
	if a.pub != nil {
		a.pub.Close(context.Background())
	}
	a.n.Close(context.Background())
	a.buf.Free()
	a.n = nil
}

// move sends size bytes of pattern seed from src into peer's buffer as 64
// scattered 4 KiB blocks... in reverse order, and returns the batch error.
func move(ctx context.Context, s *agent, peer string, dst transfer.Desc, seed byte) (*pipeline.Batch, error) {
	const blocks, bs = 256, 4 << 10
	var sd, dd []transfer.Desc
	for i := range blocks {
		copy(s.buf.Bytes()[i*bs:(i+1)*bs], bytes.Repeat([]byte{seed + byte(i)}, bs))
		sd = append(sd, transfer.Desc{Addr: s.buf.Desc().Addr + uint64(i*bs), Len: bs, Kind: transfer.Host})
		dd = append(dd, transfer.Desc{Addr: dst.Addr + uint64((blocks-1-i)*bs), Len: bs, Kind: transfer.Host})
	}
	return s.n.Agent.Submit(pipeline.Request{Peer: peer, Src: sd, Dst: dd, Route: pipeline.RouteBounce})
}

func checkLanded(t *testing.T, r *agent, seed byte) {
	t.Helper()
	const blocks, bs = 256, 4 << 10
	for i := range blocks {
		want := bytes.Repeat([]byte{seed + byte(i)}, bs)
		if got := r.buf.Bytes()[(blocks-1-i)*bs : (blocks-i)*bs]; !bytes.Equal(got, want) {
			t.Fatalf("%s: block %d wrong (first byte %d, want %d)", r.n.Agent.Name(), i, got[0], want[0])
		}
	}
}

func sendOK(t *testing.T, s *agent, peer string, r *agent, seed byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, err := move(ctx, s, peer, r.buf.Desc(), seed)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Wait(ctx); err != nil {
		t.Fatalf("send to %s: %v", peer, err)
	}
	if err := b.Release(); err != nil {
		t.Fatal(err)
	}
	checkLanded(t, r, seed)
}

// TestFleetThroughEtcd: a sender resolves a receiver by name; the receiver
// admits the sender by following its record; a receiver restarted on a new
// port with a new key is picked up without restarting the sender; with the
// cluster gone, the peers already loaded keep working while lookups fail
// with ErrUnavailable.
func TestFleetThroughEtcd(t *testing.T) {
	s := server(t)
	ctx := context.Background()
	snd := startAgent(t, s.Endpoint, "prefill-0", 1<<20)
	rcv := startAgent(t, s.Endpoint, "decode-0", 1<<20)
	admit := discovery.NewPeers(rcv.dir, rcv.n.Agent, raw, nil)
	if err := admit.Follow("prefill-0"); err != nil {
		t.Fatal(err)
	}
	peers := discovery.NewPeers(snd.dir, snd.n.Agent, raw, nil)
	defer peers.Close()
	if _, err := peers.Resolve(ctx, "nobody"); !errors.Is(err, discovery.ErrNotFound) {
		t.Fatalf("resolve nobody: %v, want ErrNotFound", err)
	}
	rec, err := peers.Resolve(ctx, "decode-0")
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := admit.Await(actx, "prefill-0"); err != nil {
		t.Fatal(err)
	}
	sendOK(t, snd, "decode-0", rcv, 1)

	// Restart: the old receiver withdraws, a new one (new port, new key,
	// new buffer) takes the name; the sender reloads it by itself.
	oldEP := rcv.n.Agent.Handshake().Endpoint
	changed := peers.Changed("decode-0")
	admit.Close()
	rcv.stop()
	<-changed
	rcv2 := startAgent(t, s.Endpoint, "decode-0", 1<<20)
	admit2 := discovery.NewPeers(rcv2.dir, rcv2.n.Agent, raw, nil)
	defer admit2.Close()
	if err := admit2.Follow("prefill-0"); err != nil {
		t.Fatal(err)
	}
	if _, err := admit2.Await(actx, "prefill-0"); err != nil {
		t.Fatal(err)
	}
	rec2, err := peers.Await(actx, "decode-0")
	if err != nil {
		t.Fatal(err)
	}
	if rec2.Version == rec.Version || rcv2.n.Agent.Handshake().Endpoint == oldEP {
		t.Fatalf("the restarted receiver looks the same: version %d→%d, endpoint %s", rec.Version, rec2.Version, oldEP)
	}
	sendOK(t, snd, "decode-0", rcv2, 2)

	// The cluster goes away: the loaded peer keeps working, lookups fail
	// clearly.
	s.Close()
	sendOK(t, snd, "decode-0", rcv2, 3)
	lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
	defer lcancel()
	if _, err := peers.Resolve(lctx, "decode-1"); !errors.Is(err, discovery.ErrUnavailable) {
		t.Fatalf("resolve with the cluster down: %v, want ErrUnavailable", err)
	}
}

// TestLeaseExpiryFailsInFlightRequests: a receiver that stops answering
// and stops keeping its lease alive (here: it never admitted the sender,
// so the sender's WANT waits, and its etcd client is gone without
// withdrawing) is forgotten by the sender when the lease expires, and the
// request in flight fails with ErrPeerLost then, not at its timeout.
func TestLeaseExpiryFailsInFlightRequests(t *testing.T) {
	s := server(t)
	ctx := context.Background()
	snd := startAgentWith(t, s.Endpoint, "prefill-0", 1<<20, node.Options{HoldWrites: func(abort <-chan struct{}) { <-abort }})
	rcv := startAgent(t, s.Endpoint, "decode-0", 1<<20)
	peers := discovery.NewPeers(snd.dir, snd.n.Agent, raw, nil)
	defer peers.Close()
	if _, err := peers.Resolve(ctx, "decode-0"); err != nil {
		t.Fatal(err)
	}
	// The receiver admits the sender (a refused sender would fail within
	// a second, refused, before the lease could expire); the sender's
	// writes are held, so the request is still in flight when it does.
	sd, err := snd.n.Agent.Descriptor()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rcv.n.Agent.LoadPeer(sd); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	b, err := move(wctx, snd, "decode-0", rcv.buf.Desc(), 9)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	select {
	case <-b.Done():
		t.Fatalf("request resolved before the lease expired: %v", b.Err())
	default:
	}
	rcv.dir.Close() // keep-alives stop; the record stays until the lease expires
	died := time.Now()
	err = b.Wait(wctx)
	took := time.Since(died)
	if !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("in-flight request: %v, want ErrPeerLost", err)
	}
	lease := 2 * time.Second
	t.Logf("in-flight request failed %v after the receiver's last keep-alive (lease %v)", took.Round(time.Millisecond), lease)
	if took > lease+10*time.Second {
		t.Fatalf("failed after %v: not by the lease (%v)", took, lease)
	}
	b.Abandon(10 * time.Second)
	b.Release()
}

// TestGrownMetadataIsReloaded: a receiver registers more memory after it
// published itself and publishes its grown descriptor; the sender, which
// follows it, reloads it and can then write into the new memory on the
// direct path (whose writes are checked against the peer's registered
// ranges), which it could not before.
func TestGrownMetadataIsReloaded(t *testing.T) {
	s := server(t)
	ctx := context.Background()
	snd := startAgent(t, s.Endpoint, "prefill-0", 1<<20)
	rcv := startAgent(t, s.Endpoint, "decode-0", 1<<20)
	sendBlob, _ := snd.n.Agent.Descriptor()
	if _, err := rcv.n.Agent.LoadPeer(sendBlob); err != nil {
		t.Fatal(err)
	}
	peers := discovery.NewPeers(snd.dir, snd.n.Agent, raw, nil)
	defer peers.Close()
	rec, err := peers.Resolve(ctx, "decode-0")
	if err != nil {
		t.Fatal(err)
	}
	more, err := mem.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer more.Free()
	if err := rcv.n.Agent.RegisterMemory(more.Desc()); err != nil {
		t.Fatal(err)
	}
	direct := func() error {
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		d := more.Desc()
		src := snd.buf.Desc()
		src.Len, d.Len = 64<<10, 64<<10
		copy(snd.buf.Bytes()[:64<<10], bytes.Repeat([]byte{0x5a}, 64<<10))
		b, err := snd.n.Agent.Submit(pipeline.Request{Peer: "decode-0", Src: []transfer.Desc{src}, Dst: []transfer.Desc{d}, Route: pipeline.RouteDirect})
		if err != nil {
			return err
		}
		err = b.Wait(wctx)
		b.Abandon(10 * time.Second)
		b.Release()
		return err
	}
	if err := direct(); err == nil {
		t.Fatal("a write into memory the sender has no metadata for succeeded")
	}
	changed := peers.Changed("decode-0")
	grown, _ := rcv.n.Agent.Descriptor()
	if err := rcv.pub.Update(ctx, grown); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(30 * time.Second):
		t.Fatal("the grown descriptor was not reloaded")
	}
	if cur, _ := peers.Current("decode-0"); cur.Version == rec.Version {
		t.Fatal("record version unchanged")
	}
	if err := direct(); err != nil {
		t.Fatalf("write into the newly registered memory after the reload: %v", err)
	}
	if !bytes.Equal(more.Bytes()[:64<<10], bytes.Repeat([]byte{0x5a}, 64<<10)) {
		t.Fatal("bytes did not land in the new memory")
	}
}
