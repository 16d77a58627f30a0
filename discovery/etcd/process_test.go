package etcd_test

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/bouncekv/bounce/discovery"
)

// freePort returns a loopback port nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestRealEtcdProcess runs the directory against the etcd binary that
// scripts/setup.sh installs (Debian etcd-server, 3.4): publish, duplicate
// refused, watch, withdraw. CI has the binary; a machine without it skips.
func TestRealEtcdProcess(t *testing.T) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("etcd not on PATH under CI: scripts/setup.sh installs Debian etcd-server")
		}
		t.Skip("etcd not on PATH: run scripts/setup.sh (Debian etcd-server) to test against a real etcd process")
	}
	client, peer := freePort(t), freePort(t)
	cmd := exec.Command(bin, "--name", "t", "--data-dir", t.TempDir(),
		"--listen-client-urls", "http://"+client, "--advertise-client-urls", "http://"+client,
		"--listen-peer-urls", "http://"+peer, "--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "t=http://"+peer, "--log-level", "error")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ctx := context.Background()
	c := cfgFor(client)
	var a discovery.Directory
	eventually(t, "the etcd process answers", func() bool {
		d, err := openE(ctx, c)
		if err == nil {
			a = d
		}
		return err == nil
	})
	defer a.Close()
	b, err := openE(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	events, err := b.Watch(ctx, "decode-0")
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-events; !ev.Gone {
		t.Fatalf("first event %+v, want Gone", ev)
	}
	pub, err := a.Publish(ctx, "decode-0", []byte("v1"))
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-events; string(ev.Record.Value) != "v1" {
		t.Fatalf("event %+v", ev)
	}
	if _, err := b.Publish(ctx, "decode-0", []byte("x")); !errors.Is(err, discovery.ErrDuplicate) {
		t.Fatalf("duplicate: %v", err)
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-events:
		if !ev.Gone {
			t.Fatalf("after withdraw: %+v", ev)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no event after withdraw")
	}
}
