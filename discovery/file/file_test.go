package file_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/discovery"
	"github.com/bouncekv/bounce/discovery/file"
	"github.com/bouncekv/bounce/node"
)

func next(t *testing.T, ch <-chan discovery.Event) discovery.Event {
	t.Helper()
	select {
	case ev := <-ch:
		return ev
	case <-time.After(30 * time.Second):
		t.Fatal("no event within 30s")
	}
	return discovery.Event{}
}

func TestFileRecordsPublishLookupWatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := file.Directory{Poll: 20 * time.Millisecond}
	path := filepath.Join(t.TempDir(), "recv.json")
	if _, err := d.Lookup(ctx, path); !errors.Is(err, discovery.ErrNotFound) {
		t.Fatalf("lookup of a missing file: %v", err)
	}
	ev, err := d.Watch(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if e := next(t, ev); !e.Gone {
		t.Fatalf("first event %+v, want Gone", e)
	}
	pub, err := d.Publish(ctx, path, []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	e1 := next(t, ev)
	if e1.Gone || string(e1.Record.Value) != "one" {
		t.Fatalf("after publish: %+v", e1)
	}
	if err := pub.Update(ctx, []byte("two")); err != nil {
		t.Fatal(err)
	}
	if e := next(t, ev); string(e.Record.Value) != "two" || e.Record.Version == e1.Record.Version {
		t.Fatalf("after update: %+v", e)
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if rec, err := d.Lookup(ctx, path); err != nil || string(rec.Value) != "two" {
		t.Fatalf("the file outlives its publication (as --descriptor-out did): %q %v", rec.Value, err)
	}
	os.Remove(path)
	if e := next(t, ev); !e.Gone {
		t.Fatalf("after removal: %+v", e)
	}
	if err := os.WriteFile(path, make([]byte, file.MaxRecord+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Lookup(ctx, path); err == nil {
		t.Fatal("an oversized record was accepted")
	}
}

// TestPeersFollowAFile: Peers over the file directory loads a real
// agent's descriptor, and forgets the agent when its file goes.
func TestPeersFollowAFile(t *testing.T) {
	ctx := context.Background()
	build := func(name string) *node.Node {
		cfg := config.Default()
		cfg.Agent.Name = name
		cfg.Bounce.ArenaSize, cfg.Bounce.MaxChunk = 4*config.MiB, config.MiB
		n, err := node.Build(cfg, node.Builtin(), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close(ctx) })
		return n
	}
	recv, send := build("decode-0"), build("prefill-0")
	blob, err := recv.Agent.Descriptor()
	if err != nil {
		t.Fatal(err)
	}
	d := file.Directory{Poll: 20 * time.Millisecond}
	path := filepath.Join(t.TempDir(), "decode-0.desc")
	if _, err := d.Publish(ctx, path, blob); err != nil {
		t.Fatal(err)
	}
	p := discovery.NewPeers(d, send.Agent, func(v []byte) ([]byte, error) { return v, nil }, nil)
	defer p.Close()
	if _, err := p.Resolve(ctx, path); err != nil {
		t.Fatal(err)
	}
	if _, _, known := send.Agent.PeerRoute("decode-0"); !known {
		t.Fatal("resolved peer not loaded")
	}
	changed := p.Changed(path)
	os.Remove(path)
	select {
	case <-changed:
	case <-time.After(30 * time.Second):
		t.Fatal("removal not noticed")
	}
	if _, _, known := send.Agent.PeerRoute("decode-0"); known {
		t.Fatal("the peer whose record went is still loaded")
	}
	// A record that is not a descriptor is refused and says why: the
	// watcher's refusal is waited for (polled every 20 ms, seconds on a
	// loaded machine), then an Await names it.
	os.WriteFile(path, []byte("garbage"), 0o644)
	for deadline := time.Now().Add(30 * time.Second); p.Err(path) == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a garbage record not refused within 30 s")
		}
	}
	actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := p.Await(actx, path); err == nil || !strings.Contains(err.Error(), p.Err(path).Error()) {
		t.Fatalf("a garbage record: await %v, want it to name the refusal %v", err, p.Err(path))
	}
}
