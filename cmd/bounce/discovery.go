package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/discovery"
	"github.com/bouncekv/bounce/discovery/file"
	"github.com/bouncekv/bounce/node"
)

// helloDescriptor is the discovery.Decode of descriptor lines: the agent
// descriptor inside a hello (a sender's hello has no buffer).
func helloDescriptor(v []byte) ([]byte, error) {
	if len(v) > maxHello {
		return nil, fmt.Errorf("descriptor line of %d bytes exceeds %d", len(v), maxHello)
	}
	var h hello
	if err := json.Unmarshal(v, &h); err != nil {
		return nil, fmt.Errorf("not a descriptor line from bounce: %w", err)
	}
	blob, err := base64.StdEncoding.DecodeString(h.Descriptor)
	if err != nil || h.Name == "" || len(blob) == 0 {
		return nil, errors.New("incomplete descriptor line (name and descriptor are required)")
	}
	return blob, nil
}

// presence is an agent's place in an etcd directory: its own record and
// the peers it follows. Kind file has none (the descriptor files are the
// whole story, as before).
type presence struct {
	dir   discovery.Directory
	pub   discovery.Publication
	peers *discovery.Peers
}

// join opens cfg's etcd directory for n, publishes line under the agent's
// name (unless line is nil) and follows each name in follow. With
// discovery.kind file it returns nil and does nothing.
func join(ctx context.Context, cfg config.Config, n *node.Node, log *slog.Logger, line []byte, follow []string) (*presence, error) {
	if cfg.Discovery.Kind != "etcd" {
		if len(follow) == 0 {
			return nil, nil
		}
		// Kind file: each name is a descriptor file (a puller's
		// --descriptor-out), loaded whenever it appears or changes.
		dir := file.Directory{Poll: 100 * time.Millisecond}
		p := &presence{dir: dir, peers: discovery.NewPeers(dir, n.Agent, helloDescriptor, log)}
		for _, f := range follow {
			if err := p.peers.Follow(f); err != nil {
				p.close()
				return nil, usage(fmt.Errorf("--follow %s: %w", f, err))
			}
		}
		return p, nil
	}
	dir, err := node.OpenDirectory(ctx, cfg.Discovery, log)
	if err != nil {
		return nil, classify(err, usage) // unreachable: 3; a bad TLS or password file: 2
	}
	p := &presence{dir: dir, peers: discovery.NewPeers(dir, n.Agent, helloDescriptor, log)}
	if line != nil {
		if p.pub, err = dir.Publish(ctx, n.Agent.Name(), line); err != nil {
			p.close()
			return nil, classify(fmt.Errorf("publish agent %q: %w", n.Agent.Name(), err), failed)
		}
	}
	for _, f := range follow {
		if err := p.peers.Follow(f); err != nil {
			p.close()
			return nil, classify(err, failed)
		}
	}
	return p, nil
}

// close stops following, withdraws the record and closes the directory.
func (p *presence) close() {
	if p == nil {
		return
	}
	p.peers.Close()
	if p.pub != nil {
		_ = p.pub.Close(context.Background())
	}
	_ = p.dir.Close()
}

// peerSource gives send the receiver's current descriptor line: the one
// read from a file at start, or, through etcd, the record of the peer as
// it is now (reloaded when it changed, a restarted receiver included).
type peerSource struct {
	name   string
	static *hello
	in     *presence
}

// openPeer resolves --peer and loads it into n: a descriptor file (or "-"
// for stdin) with discovery.kind file, an agent name with etcd (the sender
// publishes its own descriptor too, so receivers that follow it admit it).
func openPeer(ctx context.Context, stdin io.Reader, cfg config.Config, n *node.Node, log *slog.Logger, peer string) (*peerSource, error) {
	if cfg.Discovery.Kind != "etcd" {
		h, blob, err := readHello(stdin, peer)
		if err != nil {
			return nil, usage(err)
		}
		if _, err := n.Agent.LoadPeer(blob); err != nil {
			return nil, failed(err)
		}
		return &peerSource{name: h.Name, static: &h}, nil
	}
	own, err := n.Agent.Descriptor()
	if err != nil {
		return nil, runtime(err)
	}
	line, _ := json.Marshal(hello{Name: n.Agent.Name(), Descriptor: base64.StdEncoding.EncodeToString(own)})
	in, err := join(ctx, cfg, n, log, line, nil)
	if err != nil {
		return nil, err
	}
	rec, err := in.peers.Resolve(ctx, peer)
	if err != nil {
		in.close()
		return nil, classify(fmt.Errorf("--peer %s: %w", peer, err), failed)
	}
	if _, _, err := parseHello(rec.Value); err != nil {
		in.close()
		return nil, failed(fmt.Errorf("--peer %s: record at %s: %w", peer, cfg.Discovery.Prefix, err))
	}
	return &peerSource{name: peer, in: in}, nil
}

// current returns the peer's descriptor line as it is now; through etcd
// it waits (bounded by ctx) while the peer is gone, for it to come back.
func (s *peerSource) current(ctx context.Context) (hello, error) {
	if s.static != nil {
		return *s.static, nil
	}
	rec, err := s.in.peers.Await(ctx, s.name)
	if err != nil {
		return hello{}, err
	}
	h, _, err := parseHello(rec.Value)
	if err == nil && h.Name != s.name {
		// The descriptor was checked to name s.name (discovery.Peers); the
		// line's name is what send targets.
		err = fmt.Errorf("--peer %s: its record's line names agent %q: refused", s.name, h.Name)
	}
	return h, err
}

func (s *peerSource) close() { s.in.close() }
