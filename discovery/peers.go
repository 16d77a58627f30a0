package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/bouncekv/bounce/pipeline/wire"
)

// Agent is what Peers drives: the part of a pipeline.Agent that loads and
// forgets peers.
type Agent interface {
	LoadPeer(descriptor []byte) (string, error)
	ForgetPeer(name string) error
}

// Decode extracts the agent descriptor from a published record's value.
type Decode func(value []byte) (descriptor []byte, err error)

// Peers keeps an agent's peers in step with their records in a Directory:
// a followed peer is loaded when its record appears, reloaded when it
// changes (a receiver that registered more memory, or one restarted with a
// new endpoint and key) and forgotten when the record goes (withdrawn, or
// its lease expired), which fails the agent's requests to it at once.
// In a directory whose names are agent names (NamesAgents: etcd), a
// record whose descriptor names another agent than the one followed is
// refused (ErrRefused), so a record under one name never loads another.
// The goroutine that follows each name is Peers' own; Close stops them.
type Peers struct {
	dir    Directory
	agent  Agent
	decode Decode
	log    *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	peers map[string]*followed
}

// followed is one name Peers follows.
type followed struct {
	rec     Record
	loaded  string // the agent name LoadPeer returned; "" when not loaded
	err     error  // why the last record could not be loaded
	changed chan struct{}
}

// NewPeers returns a Peers that loads records of dir into agent, taking
// each record's descriptor out with decode. log may be nil.
func NewPeers(dir Directory, agent Agent, decode Decode, log *slog.Logger) *Peers {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Peers{dir: dir, agent: agent, decode: decode, log: log, ctx: ctx, cancel: cancel, peers: map[string]*followed{}}
}

// Resolve looks name up now, loads its descriptor into the agent and goes
// on following it. A name not published is an error wrapping ErrNotFound;
// a directory that cannot be reached, one wrapping ErrUnavailable.
// Resolving a name already followed returns its current record.
func (p *Peers) Resolve(ctx context.Context, name string) (Record, error) {
	p.mu.Lock()
	if f, ok := p.peers[name]; ok && f.loaded != "" {
		r := f.rec
		p.mu.Unlock()
		return r, nil
	}
	p.mu.Unlock()
	rec, err := p.dir.Lookup(ctx, name)
	if err != nil {
		return Record{}, fmt.Errorf("resolve peer %q: %w", name, err)
	}
	p.mu.Lock()
	f, following := p.peers[name]
	if !following {
		f = &followed{changed: make(chan struct{})}
		p.peers[name] = f
	}
	err = p.loadLocked(name, f, rec)
	p.mu.Unlock()
	if err != nil {
		return Record{}, fmt.Errorf("resolve peer %q: %w", name, err)
	}
	if !following {
		if err := p.follow(name); err != nil {
			return Record{}, err
		}
	}
	return rec, nil
}

// Follow follows name whether it is published now or not: it is loaded
// when its record appears (a receiver admitting the senders it expects).
func (p *Peers) Follow(name string) error {
	p.mu.Lock()
	if _, ok := p.peers[name]; ok {
		p.mu.Unlock()
		return nil
	}
	p.peers[name] = &followed{changed: make(chan struct{})}
	p.mu.Unlock()
	return p.follow(name)
}

// follow starts the goroutine that applies name's changes.
func (p *Peers) follow(name string) error {
	events, err := p.dir.Watch(p.ctx, name)
	if err != nil {
		return fmt.Errorf("follow peer %q: %w", name, err)
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for ev := range events {
			p.apply(name, ev)
		}
	}()
	return nil
}

// apply makes one event of name's record true in the agent.
func (p *Peers) apply(name string, ev Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.peers[name]
	if f == nil {
		return
	}
	if ev.Gone {
		if f.loaded == "" {
			return
		}
		p.log.Info("peer record gone: forgetting it", "peer", name)
		if err := p.agent.ForgetPeer(f.loaded); err != nil {
			p.log.Warn("forget peer", "peer", name, "err", err)
		}
		f.loaded, f.rec = "", Record{}
		f.notify()
		return
	}
	if f.loaded != "" && ev.Record.Version == f.rec.Version {
		return
	}
	if err := p.loadLocked(name, f, ev.Record); err != nil {
		p.log.Warn("peer record not loaded", "peer", name, "err", err)
		f.notify()
	}
}

// loadLocked loads rec into the agent for f (p.mu held).
func (p *Peers) loadLocked(name string, f *followed, rec Record) error {
	desc, err := p.decode(rec.Value)
	if n, ok := p.dir.(interface{ NamesAgents() bool }); err == nil && ok && n.NamesAgents() {
		err = checkNames(name, rec.Name, desc)
	}
	if err == nil {
		var got string
		got, err = p.agent.LoadPeer(desc)
		if err == nil {
			if f.loaded != "" && f.loaded != got {
				_ = p.agent.ForgetPeer(f.loaded)
			}
			f.loaded, f.rec, f.err = got, rec, nil
			f.notify()
			return nil
		}
	}
	f.err = err
	return err
}

// checkNames refuses a record whose descriptor names another agent than
// the one followed (name) and the one it is published under (published):
// a record under one name must not load, and send to, another agent.
func checkNames(name, published string, desc []byte) error {
	d, err := wire.UnmarshalAgentDesc(desc)
	if err != nil {
		return fmt.Errorf("record of %q: %w", name, err)
	}
	if published != "" && published != name {
		return fmt.Errorf("record of %q is published under %q: %w", name, published, ErrRefused)
	}
	if d.Name != name {
		return fmt.Errorf("record of %q carries the descriptor of agent %q: %w", name, d.Name, ErrRefused)
	}
	return nil
}

// notify wakes those waiting on Changed.
func (f *followed) notify() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// Current returns the record of a followed name as last loaded, and false
// while none is (not published yet, gone, or not loadable: Err says why).
func (p *Peers) Current(name string) (Record, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, ok := p.peers[name]
	if !ok || f.loaded == "" {
		return Record{}, false
	}
	return f.rec, true
}

// Err says why a followed name's last record could not be loaded, or nil.
func (p *Peers) Err(name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f, ok := p.peers[name]; ok {
		return f.err
	}
	return nil
}

// Changed returns a channel closed at the next change of a followed name
// (loaded, reloaded, forgotten or refused), or nil for a name not followed.
func (p *Peers) Changed(name string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f, ok := p.peers[name]; ok {
		return f.changed
	}
	return nil
}

// Await waits until a followed name is loaded and returns its record, or
// returns ctx's error naming the peer (and why its record was refused,
// when it was).
func (p *Peers) Await(ctx context.Context, name string) (Record, error) {
	for {
		ch := p.Changed(name)
		if ch == nil {
			return Record{}, fmt.Errorf("await peer %q: not followed", name)
		}
		if r, ok := p.Current(name); ok {
			return r, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			err := ctx.Err()
			if why := p.Err(name); why != nil {
				err = errors.Join(err, why)
			}
			return Record{}, fmt.Errorf("await peer %q: %w", name, err)
		}
	}
}

// Close stops following every name (the peers stay loaded).
func (p *Peers) Close() {
	p.cancel()
	p.wg.Wait()
}
