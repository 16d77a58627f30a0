package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/transfer"
)

// table maps the handles C callers hold to the library's objects. Handles
// count up from 1 and are never reused, so a stale handle is refused
// (errBadHandle) rather than naming another object.
type table struct {
	mu      sync.Mutex
	next    uint64
	agents  map[uint64]*agentHandle
	batches map[uint64]*pipeline.Batch
}

func newTable() *table {
	return &table{agents: map[uint64]*agentHandle{}, batches: map[uint64]*pipeline.Batch{}}
}

func (t *table) addAgent(a *agentHandle) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	t.agents[t.next] = a
	return t.next
}

func (t *table) agent(h uint64) (*agentHandle, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok := t.agents[h]
	if !ok {
		return nil, fmt.Errorf("agent handle %d: %w", h, errBadHandle)
	}
	return a, nil
}

// takeAgent removes the agent from the table: its handle is invalid from now on.
func (t *table) takeAgent(h uint64) (*agentHandle, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok := t.agents[h]
	if !ok {
		return nil, fmt.Errorf("agent handle %d: %w", h, errBadHandle)
	}
	delete(t.agents, h)
	return a, nil
}

func (t *table) addBatch(b *pipeline.Batch) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	t.batches[t.next] = b
	return t.next
}

func (t *table) batch(h uint64) (*pipeline.Batch, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b, ok := t.batches[h]
	if !ok {
		return nil, fmt.Errorf("batch handle %d: %w", h, errBadHandle)
	}
	return b, nil
}

// releaseBatch releases the batch and drops its handle; a batch that is
// not quiescent keeps its handle (the caller keeps the memory and retries).
func (t *table) releaseBatch(h uint64) error {
	b, err := t.batch(h)
	if err != nil {
		return err
	}
	if err := b.Release(); err != nil {
		return err
	}
	t.mu.Lock()
	delete(t.batches, h)
	t.mu.Unlock()
	return nil
}

// agentHandle is one agent of the library: its node and the queue of its
// receiver events.
type agentHandle struct {
	node   *node.Node
	events chan pipeline.Received
	closed chan struct{}
	once   sync.Once
}

// defaultEvents is the event queue's size when the caller passes 0.
const defaultEvents = 4096

// newAgent loads the configuration (defaults < yaml < key=value options)
// and builds a started node with the built-in components and plugins.
func newAgent(yaml []byte, options []string, events int) (*agentHandle, error) {
	env, err := optionsEnv(options)
	if err != nil {
		return nil, err
	}
	lo := config.LoadOptions{Environ: env}
	if len(yaml) > 0 {
		lo.FileData, lo.File = yaml, "yaml"
	}
	loaded, err := config.Load(lo)
	if err != nil {
		return nil, err
	}
	if events <= 0 {
		events = defaultEvents
	}
	cfg := loaded.Config
	log := cfg.Log.Logger(os.Stderr)
	for _, n := range loaded.Notices {
		log.Info(n)
	}
	h := &agentHandle{events: make(chan pipeline.Received, events), closed: make(chan struct{})}
	exe, _ := os.Executable()
	h.node, err = node.BuildWith(cfg, node.WithPlugins(node.Builtin(), exe), node.Options{Logger: log, Received: h.events})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// optionsEnv turns "key=value" options into the configuration's
// environment layer, refusing a key the configuration does not have.
func optionsEnv(options []string) ([]string, error) {
	keys := config.Keys()
	var env []string
	for _, o := range options {
		k, v, ok := strings.Cut(o, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, invalid("option %q is not key=value", o)
		}
		if !slices.Contains(keys, k) {
			hint := config.DidYouMean(k, keys)
			return nil, invalid("option %q: %q is not a configuration key%s (bounce config --keys lists them)", o, k, hint)
		}
		env = append(env, config.EnvVar(k)+"="+v)
	}
	return env, nil
}

func (h *agentHandle) agent() *pipeline.Agent { return h.node.Agent }

// next waits at most d (negative: no bound) for a receiver event.
func (h *agentHandle) next(d time.Duration) (pipeline.Received, error) {
	var tick <-chan time.Time
	if d >= 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		tick = t.C
	}
	select {
	case ev := <-h.events:
		return ev, nil
	case <-tick:
		return pipeline.Received{}, fmt.Errorf("no receiver event within %v: %w", d, transfer.ErrTimeout)
	case <-h.closed:
		return pipeline.Received{}, fmt.Errorf("agent: %w", transfer.ErrClosed)
	}
}

func (h *agentHandle) close(ctx context.Context) error {
	h.once.Do(func() { close(h.closed) })
	return h.node.Close(ctx)
}

// statsJSON is the agent's Stats as a JSON object.
func (h *agentHandle) statsJSON() (string, error) {
	b, err := json.Marshal(h.agent().Stats())
	if err != nil {
		return "", fmt.Errorf("stats: %w", err)
	}
	return string(b), nil
}
