package conformance_test

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// A fixture whose memory cannot be had here gets every rule skipped, with
// the reason in each result; none fails and none opens an engine.
func TestUnavailableMemorySkipsWithReason(t *testing.T) {
	pair := func() (conformance.EnginePair, error) {
		return conformance.EnginePair{Memory: conformance.Memory{Kind: transfer.CUDA, Unavailable: "no GPU in this box"}}, nil
	}
	rep := conformance.CheckEngine(pair, conformance.Config{Seed: 1})
	ran := 0
	for _, r := range rep.Results {
		if strings.HasSuffix(r.Rule, "/no-goroutine-leak") {
			continue
		}
		ran++
		if r.Outcome != conformance.Skip || !strings.Contains(r.Message, "cuda:0 memory unavailable here: no GPU in this box") {
			t.Errorf("%s: %v %q; want skipped with the reason", r.Rule, r.Outcome, r.Message)
		}
	}
	if ran == 0 {
		t.Fatal("no rule reported")
	}
}

// Memory of a kind the engine does not declare fails every rule before a
// byte moves, naming the kind.
func TestUndeclaredMemoryKindFails(t *testing.T) {
	pair := func() (conformance.EnginePair, error) {
		p, err := loopbackPair()
		p.Memory = conformance.Memory{Kind: transfer.CUDA}
		return p, err
	}
	rep := conformance.CheckEngine(pair, conformance.Config{Seed: 1, Only: []string{"engine/byte-exact"}})
	fails := rep.Failures()
	if len(fails) != 1 || !strings.Contains(fails[0].Message, "cannot touch cuda memory") {
		t.Fatalf("failures %+v; want engine/byte-exact failing on the undeclared kind", fails)
	}
}

// The memory's Alloc provides every buffer the data rules use, in place of
// the fixture's.
func TestMemoryAllocUsed(t *testing.T) {
	var mine, theirs atomic.Int64
	count := func(n *atomic.Int64) conformance.AllocFunc {
		return func(size uint64) ([]byte, func() error, error) {
			n.Add(1)
			m, err := mem.Alloc(size)
			if err != nil {
				return nil, nil, err
			}
			return m.Bytes(), m.Free, nil
		}
	}
	pair := func() (conformance.EnginePair, error) {
		p, err := loopbackPair()
		p.Alloc = count(&theirs)
		p.Memory = conformance.Memory{Alloc: count(&mine)}
		return p, err
	}
	rep := conformance.CheckEngine(pair, conformance.Config{Seed: 1, Only: []string{"engine/byte-exact"}, Sizes: []uint64{7}})
	if f := rep.Failures(); len(f) > 0 {
		t.Fatal(f)
	}
	if mine.Load() == 0 || theirs.Load() != 0 {
		t.Fatalf("Memory.Alloc called %d times, fixture Alloc %d; want only Memory.Alloc", mine.Load(), theirs.Load())
	}
}
