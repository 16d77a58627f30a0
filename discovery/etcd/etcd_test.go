package etcd_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/discovery"
	"github.com/bouncekv/bounce/discovery/etcd"
)

// server starts an embedded member for one test.
func server(t *testing.T) *etcd.Server {
	t.Helper()
	s, err := etcd.StartServer(t.TempDir(), 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func cfgFor(endpoint string) config.DiscoveryConfig {
	c := config.Default().Discovery
	c.Kind, c.Endpoints, c.Lease, c.Prefix = "etcd", endpoint, 2*time.Second, "/test"
	c.Insecure = true // the embedded test server has neither TLS nor users
	return c
}

func open(t *testing.T, c config.DiscoveryConfig) *etcd.Directory {
	t.Helper()
	d, err := etcd.Open(context.Background(), c, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// eventually polls cond every 50ms for up to 30s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestPublishLookupWatchWithdraw(t *testing.T) {
	s := server(t)
	ctx := context.Background()
	a, b := open(t, cfgFor(s.Endpoint)), open(t, cfgFor(s.Endpoint))
	if _, err := b.Lookup(ctx, "decode-0"); !errors.Is(err, discovery.ErrNotFound) {
		t.Fatalf("lookup before publish: %v, want ErrNotFound", err)
	}
	events, err := b.Watch(ctx, "decode-0")
	if err != nil {
		t.Fatal(err)
	}
	next := func() discovery.Event {
		t.Helper()
		select {
		case ev := <-events:
			return ev
		case <-time.After(30 * time.Second):
			t.Fatal("no watch event within 30s")
		}
		return discovery.Event{}
	}
	if ev := next(); !ev.Gone {
		t.Fatalf("first event %+v, want Gone (absent)", ev)
	}
	pub, err := a.Publish(ctx, "decode-0", []byte("v1"))
	if err != nil {
		t.Fatal(err)
	}
	ev := next()
	if ev.Gone || string(ev.Record.Value) != "v1" {
		t.Fatalf("after publish: %+v", ev)
	}
	rec, err := b.Lookup(ctx, "decode-0")
	if err != nil || string(rec.Value) != "v1" || rec.Version != ev.Record.Version {
		t.Fatalf("lookup = %+v, %v", rec, err)
	}
	if err := pub.Update(ctx, []byte("v2")); err != nil {
		t.Fatal(err)
	}
	if ev := next(); string(ev.Record.Value) != "v2" || ev.Record.Version <= rec.Version {
		t.Fatalf("after update: %+v", ev)
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := next(); !ev.Gone {
		t.Fatalf("after close: %+v, want Gone", ev)
	}
	if _, err := b.Lookup(ctx, "decode-0"); !errors.Is(err, discovery.ErrNotFound) {
		t.Fatalf("lookup after close: %v", err)
	}
}

func TestDuplicateNameRefusedUntilLeaseExpires(t *testing.T) {
	s := server(t)
	ctx := context.Background()
	holder, err := etcd.Open(ctx, cfgFor(s.Endpoint), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Publish(ctx, "decode-0", []byte("first")); err != nil {
		t.Fatal(err)
	}
	other := open(t, cfgFor(s.Endpoint))
	_, err = other.Publish(ctx, "decode-0", []byte("second"))
	if !errors.Is(err, discovery.ErrDuplicate) || !strings.Contains(err.Error(), "decode-0") {
		t.Fatalf("second publish: %v, want ErrDuplicate naming decode-0", err)
	}
	if rec, _ := other.Lookup(ctx, "decode-0"); string(rec.Value) != "first" {
		t.Fatalf("the live record was taken over: %q", rec.Value)
	}
	// The holder dies without withdrawing: its lease runs out and the
	// name is free again.
	holder.Close()
	died := time.Now()
	eventually(t, "the name is free again", func() bool {
		_, err := other.Publish(ctx, "decode-0", []byte("second"))
		return err == nil
	})
	t.Logf("name free %v after the holder died (lease 2s)", time.Since(died).Round(10*time.Millisecond))
	if rec, _ := other.Lookup(ctx, "decode-0"); string(rec.Value) != "second" {
		t.Fatalf("record = %q", rec.Value)
	}
}

func TestLeaseKeptAliveBeyondItsTTL(t *testing.T) {
	s := server(t)
	ctx := context.Background()
	d := open(t, cfgFor(s.Endpoint))
	if _, err := d.Publish(ctx, "p", []byte("x")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // two and a half leases
	if _, err := d.Lookup(ctx, "p"); err != nil {
		t.Fatalf("record of a live agent gone: %v", err)
	}
}

func TestUnavailableAtStartIsAClearError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	c := cfgFor(addr)
	c.DialTimeout = 500 * time.Millisecond
	_, err = etcd.Open(context.Background(), c, nil)
	if !errors.Is(err, discovery.ErrUnavailable) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Open against nothing: %v, want ErrUnavailable naming %s", err, addr)
	}
}

func TestBadNames(t *testing.T) {
	s := server(t)
	d := open(t, cfgFor(s.Endpoint))
	for _, n := range []string{"", "a/b", strings.Repeat("x", 256)} {
		if _, err := d.Publish(context.Background(), n, nil); !errors.Is(err, discovery.ErrBadName) {
			t.Fatalf("publish %q: %v", n, err)
		}
	}
}

func openE(ctx context.Context, c config.DiscoveryConfig) (*etcd.Directory, error) {
	return etcd.Open(ctx, c, nil)
}

// TestAuthPasswordFile: with auth on in etcd, discovery.username and the
// password in discovery.password_file open the directory; a wrong password
// is an error at Open, not a silent retry.
func TestAuthPasswordFile(t *testing.T) {
	s := server(t)
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for _, step := range []func() error{
		func() error { _, err := cli.UserAdd(ctx, "root", "s3cret"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	os.WriteFile(good, []byte("s3cret\n"), 0o600)
	os.WriteFile(bad, []byte("guess\n"), 0o600)
	// etcd checks a password with bcrypt, which takes seconds on a loaded
	// machine (and under -race, the server in this process): the bound is
	// generous, so the answers are asserted, not the speed of the check.
	c := cfgFor(s.Endpoint)
	c.Username, c.PasswordFile, c.DialTimeout = "root", good, 2*time.Minute
	d, err := etcd.Open(ctx, c, nil)
	if err != nil {
		t.Fatalf("open with the right password: %v", err)
	}
	defer d.Close()
	if _, err := d.Publish(ctx, "decode-0", []byte("x")); err != nil {
		t.Fatal(err)
	}
	c.PasswordFile = bad
	if d2, err := etcd.Open(ctx, c, nil); err == nil {
		d2.Close()
		t.Fatal("a wrong password opened the directory")
	} else if !errors.Is(err, rpctypes.ErrAuthFailed) || errors.Is(err, discovery.ErrUnavailable) ||
		!strings.Contains(err.Error(), `user "root" refused`) || !strings.Contains(err.Error(), bad) {
		t.Fatalf("wrong password: %v, want the auth error naming the user and the password file", err)
	}
}

// TestAuthNoAnswerNamesTheCall: an etcd that accepts the connection and
// never answers (a stalled or overloaded member) fails Open at
// discovery.dial_timeout with ErrUnavailable naming the authentication and
// the key that bounds it, not a bare "context deadline exceeded" (what a
// wrong password on a loaded etcd host printed before).
func TestAuthNoAnswerNamesTheCall(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			defer conn.Close() // held open, never answered
		}
	}()
	pw := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(pw, []byte("s3cret\n"), 0o600)
	c := cfgFor(l.Addr().String())
	c.Username, c.PasswordFile, c.DialTimeout = "root", pw, 300*time.Millisecond
	_, err = etcd.Open(context.Background(), c, nil)
	if !errors.Is(err, discovery.ErrUnavailable) || !strings.Contains(err.Error(), `authenticate as user "root"`) ||
		!strings.Contains(err.Error(), "discovery.dial_timeout") || !strings.Contains(err.Error(), l.Addr().String()) {
		t.Fatalf("Open against a silent etcd with a user: %v, want ErrUnavailable naming the authentication, the endpoint and discovery.dial_timeout", err)
	}
}
