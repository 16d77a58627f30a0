package pipeline

import (
	"crypto/rand"
	"sync"
	"testing"

	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/transfer"
)

// orderRecorder wraps a node's engine and records, in order, the write
// guard's install and every memory registration.
type orderRecorder struct {
	transfer.Engine
	mu     sync.Mutex
	events []string
}

func (o *orderRecorder) record(e string) {
	o.mu.Lock()
	o.events = append(o.events, e)
	o.mu.Unlock()
}

func (o *orderRecorder) SetWriteGuard(transfer.WriteGuard) { o.record("guard") }

func (o *orderRecorder) RegisterMemory(d transfer.Desc) error {
	o.record("register")
	return o.Engine.RegisterMemory(d)
}

// TestGuardInstalledBeforeArenaRegistered: with authentication on, the
// agent installs its write guard in the engine before it registers the
// arena with it. An engine that already listens (a plugin's, holding no
// keys, whose guard is its only check) must never have the arena
// registered and unguarded.
func TestGuardInstalledBeforeArenaRegistered(t *testing.T) {
	id, err := security.Generate(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rec := &orderRecorder{}
	w := newWorld(t)
	w.node("r", testConfig(), func(s *Settings) {
		s.Peers = security.NewPeers(security.Authenticate, id, security.Policy{Loaded: true})
		rec.Engine = s.Engine
		s.Engine = rec
	})
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.events) < 2 || rec.events[0] != "guard" {
		t.Fatalf("engine saw %v, want the guard installed before any memory (the arena) is registered", rec.events)
	}
}
