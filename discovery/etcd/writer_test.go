package etcd_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/bouncekv/bounce/discovery"
	"github.com/bouncekv/bounce/discovery/etcd"
)

// The tests here are an attacker who can write to the etcd prefix the
// agents use (docs/SECURITY.md, the etcd-writer row): what it writes must
// not make an agent load another agent under a name, keep an agent from
// publishing, or leave a forged or deleted record in place of an agent's.

// writer is the attacker's own client.
func writer(t *testing.T, s *etcd.Server) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// leasedPut puts value under key on a fresh lease of the attacker's, as
// an agent's record would be.
func leasedPut(t *testing.T, cli *clientv3.Client, key string, value []byte) {
	t.Helper()
	ctx := context.Background()
	g, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, key, string(value), clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
}

// TestForgedRecordNamingAnotherAgentRefused: the attacker publishes, under
// the receiver's name, the descriptor of its own agent (on a lease, as an
// agent would). The sender that resolves the receiver refuses the record
// (ErrRefused): it loads nothing and sends nothing to the attacker.
func TestForgedRecordNamingAnotherAgentRefused(t *testing.T) {
	s := server(t)
	evil := startAgent(t, s.Endpoint, "evil", 1<<20)
	snd := startAgent(t, s.Endpoint, "prefill-0", 1<<20)
	blob, err := evil.n.Agent.Descriptor()
	if err != nil {
		t.Fatal(err)
	}
	leasedPut(t, writer(t, s), snd.dir.Key("decode-0"), blob)
	peers := discovery.NewPeers(snd.dir, snd.n.Agent, raw, nil)
	defer peers.Close()
	_, err = peers.Resolve(context.Background(), "decode-0")
	if !errors.Is(err, discovery.ErrRefused) {
		t.Fatalf("resolve decode-0 holding evil's descriptor: %v, want ErrRefused", err)
	}
	if _, ok := peers.Current("decode-0"); ok {
		t.Fatal("the forged record is loaded")
	}
	if _, _, known := snd.n.Agent.PeerRoute("evil"); known {
		t.Fatal("the sender loaded the attacker's agent")
	}
}

// TestLeaselessRecordRefused: a record without a lease (one no agent
// wrote: it would never expire) is refused by Lookup and reported gone to
// a follower, and the agent whose name it holds publishes all the same,
// replacing it (it used to be refused as a duplicate for ever).
func TestLeaselessRecordRefused(t *testing.T) {
	s := server(t)
	cli := writer(t, s)
	d := open(t, cfgFor(s.Endpoint))
	ctx := context.Background()
	if _, err := cli.Put(ctx, d.Key("prefill-0"), "forged"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Lookup(ctx, "prefill-0"); !errors.Is(err, discovery.ErrRefused) {
		t.Fatalf("lookup of a lease-less record: %v, want ErrRefused", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events, err := d.Watch(wctx, "prefill-0")
	if err != nil {
		t.Fatal(err)
	}
	if ev := next(t, events); !ev.Gone {
		t.Fatalf("watch reports the lease-less record %q, want gone", ev.Record.Value)
	}
	pub, err := d.Publish(ctx, "prefill-0", []byte("real"))
	if err != nil {
		t.Fatalf("publish over a lease-less record: %v", err)
	}
	defer pub.Close(ctx)
	rec, err := d.Lookup(ctx, "prefill-0")
	if err != nil || string(rec.Value) != "real" {
		t.Fatalf("lookup after publish: %q, %v", rec.Value, err)
	}
	if ev := next(t, events); ev.Gone || string(ev.Record.Value) != "real" {
		t.Fatalf("watch after publish: %+v", ev)
	}
}

// TestOwnRecordRestored: the attacker deletes an agent's record, then
// overwrites it with a forged value on its own lease, then with no lease.
// Each time the agent notices (it watches its own record) and publishes
// its record again, so followers get it back.
func TestOwnRecordRestored(t *testing.T) {
	s := server(t)
	cli := writer(t, s)
	d := open(t, cfgFor(s.Endpoint))
	ctx := context.Background()
	pub, err := d.Publish(ctx, "decode-0", []byte("real"))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	key := d.Key("decode-0")
	restored := func(what string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			resp, err := cli.Get(ctx, key)
			if err == nil && len(resp.Kvs) == 1 && bytes.Equal(resp.Kvs[0].Value, []byte("real")) && resp.Kvs[0].Lease != 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the agent's record is not back 20 s later: %v %v", what, resp, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if _, err := cli.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	restored("deleted")
	leasedPut(t, cli, key, []byte("forged"))
	restored("overwritten on another lease")
	if _, err := cli.Put(ctx, key, "forged"); err != nil {
		t.Fatal(err)
	}
	restored("overwritten without a lease")
}

// TestEtcdRefusedWithoutTLSAndAuth: Open refuses a cluster reached without
// TLS and authentication unless discovery.insecure says to accept it.
func TestEtcdRefusedWithoutTLSAndAuth(t *testing.T) {
	s := server(t)
	c := cfgFor(s.Endpoint)
	c.Insecure = false
	if _, err := etcd.Open(context.Background(), c, nil); err == nil || !strings.Contains(err.Error(), "discovery.insecure") {
		t.Fatalf("open without TLS and auth: %v, want a refusal naming discovery.insecure", err)
	}
	c.Insecure = true
	d, err := etcd.Open(context.Background(), c, nil)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
}

// next returns the next event, within 20 s.
func next(t *testing.T, events <-chan discovery.Event) discovery.Event {
	t.Helper()
	select {
	case ev, ok := <-events:
		if !ok {
			t.Fatal("watch closed")
		}
		return ev
	case <-time.After(20 * time.Second):
		t.Fatal("no watch event within 20 s")
	}
	return discovery.Event{}
}
