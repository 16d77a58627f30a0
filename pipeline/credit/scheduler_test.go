package credit

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

func mustNew(t testing.TB, cfg Config) *Scheduler {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return s
}

func mustCheck(t testing.TB, s *Scheduler) {
	t.Helper()
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

func key(peer string, req uint64) FlowKey { return FlowKey{Peer: peer, Request: req} }

func repeat(n int, size uint64) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = size
	}
	return out
}

// grantNames renders grants as "flow#chunk" for compact comparisons.
func grantNames(gs []Grant) string {
	parts := make([]string, len(gs))
	for i, g := range gs {
		parts[i] = fmt.Sprintf("%s#%d", g.Flow.Peer, g.Chunk)
	}
	return strings.Join(parts, " ")
}

func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"zero W", Config{Capacity: 1 << 20, Granularity: 1 << 10}, "MaxInflight"},
		{"negative W", Config{Capacity: 1 << 20, Granularity: 1 << 10, MaxInflight: -1}, "MaxInflight"},
		{"negative rounds", Config{Capacity: 1 << 20, Granularity: 1 << 10, MaxInflight: 1, BypassRounds: -1}, "BypassRounds"},
		{"zero granularity", Config{Capacity: 1 << 20, MaxInflight: 1}, "granule"},
		{"odd granularity", Config{Capacity: 1 << 20, Granularity: 3000, MaxInflight: 1}, "power of two"},
		{"capacity below granularity", Config{Capacity: 100, Granularity: 128, MaxInflight: 1}, "smaller than granule"},
	} {
		_, err := New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New error %v, want one mentioning %q", tc.name, err, tc.want)
		}
	}
	s := mustNew(t, Config{Capacity: 3 << 20, Granularity: 1 << 20, MaxInflight: 1})
	if s.Capacity() != 2<<20 {
		t.Errorf("Capacity %d, want %d", s.Capacity(), 2<<20)
	}
}

// TestWorkedExample replays the design's example: W=2, an arena that fits
// four regions, flow A with three chunks and flow B with two.
func TestWorkedExample(t *testing.T) {
	const unit = 1 << 20
	s := mustNew(t, Config{Capacity: 4 * unit, Granularity: unit, MaxInflight: 2})
	a, b := key("A", 1), key("B", 1)
	if err := s.Want(a, repeat(3, unit)); err != nil {
		t.Fatal(err)
	}
	if err := s.Want(b, repeat(2, unit)); err != nil {
		t.Fatal(err)
	}
	type step struct {
		flow         FlowKey
		chunk        int
		heldA, heldB int
	}
	want := []step{{a, 0, 1, 0}, {b, 0, 1, 1}, {a, 1, 2, 1}, {b, 1, 2, 2}}
	grants := s.Schedule()
	if len(grants) != len(want) {
		t.Fatalf("Schedule granted %q, want 4 grants A,B,A,B", grantNames(grants))
	}
	held := map[FlowKey]int{}
	offs := map[uint64]bool{}
	for i, g := range grants {
		held[g.Flow]++
		w := want[i]
		if g.Flow != w.flow || g.Chunk != w.chunk || g.Len != unit || held[a] != w.heldA || held[b] != w.heldB {
			t.Errorf("step %d: grant %+v (held A=%d B=%d), want %v chunk %d (held A=%d B=%d)",
				i+1, g, held[a], held[b], w.flow, w.chunk, w.heldA, w.heldB)
		}
		if offs[g.Offset] || g.Offset%unit != 0 || g.Offset >= 4*unit {
			t.Errorf("step %d: offset %#x reused, misaligned or out of the arena", i+1, g.Offset)
		}
		offs[g.Offset] = true
	}
	// Step 5: both flows at cap: nothing more, also not on a second call.
	if more := s.Schedule(); len(more) != 0 {
		t.Fatalf("step 5: Schedule granted %q with both flows at cap", grantNames(more))
	}
	st := s.Stats()
	if st.FreeBytes != 0 || st.HeldBytes != 4*unit || st.Pending != 1 || st.Flows != 2 || st.Ready != 0 {
		t.Fatalf("after step 5: %+v", st)
	}
	mustCheck(t, s)

	// One of A's regions finishes scatter; the next Schedule grants c3.
	if err := s.BeginScatter(a, grants[0].Offset); err != nil {
		t.Fatal(err)
	}
	if k, orphan, err := s.EndScatter(grants[0].Offset); err != nil || orphan || k != a {
		t.Fatalf("EndScatter = %v, %v, %v", k, orphan, err)
	}
	next := s.Schedule()
	if len(next) != 1 || next[0].Flow != a || next[0].Chunk != 2 {
		t.Fatalf("after A's ACK: Schedule granted %q, want A#2", grantNames(next))
	}
	mustCheck(t, s)
}

func TestRoundRobinAndCap(t *testing.T) {
	const unit = 4096
	s := mustNew(t, Config{Capacity: 64 * unit, Granularity: unit, MaxInflight: 3})
	for i, p := range []string{"a", "b", "c"} {
		if err := s.Want(key(p, uint64(i)), repeat(5, unit)); err != nil {
			t.Fatal(err)
		}
	}
	got := grantNames(s.Schedule())
	if want := "a#0 b#0 c#0 a#1 b#1 c#1 a#2 b#2 c#2"; got != want {
		t.Fatalf("grants %q, want %q", got, want)
	}
	st := s.Stats()
	if st.Regions != 9 || st.Pending != 6 || st.Ready != 0 {
		t.Fatalf("stats %+v", st)
	}
	mustCheck(t, s)
}

func TestArenaBackpressure(t *testing.T) {
	const unit = 1024
	s := mustNew(t, Config{Capacity: 4 * unit, Granularity: unit, MaxInflight: 8})
	k := key("p", 7)
	if err := s.Want(k, []uint64{unit, 2 * unit, 3 * unit, 1}); err != nil {
		t.Fatal(err)
	}
	gs := s.Schedule()
	// 1 KiB + 2 KiB fit; the 3 KiB chunk needs a 4 KiB block.
	if len(gs) != 2 || gs[0].Len != unit || gs[1].Len != 2*unit {
		t.Fatalf("grants %+v", gs)
	}
	if len(s.Schedule()) != 0 {
		t.Fatal("granted while the head chunk cannot fit")
	}
	for _, g := range gs {
		if err := s.Drop(k, g.Offset); err != nil {
			t.Fatal(err)
		}
	}
	gs = s.Schedule()
	if len(gs) != 1 || gs[0].Chunk != 2 || gs[0].Len != 3*unit {
		t.Fatalf("after drops: grants %+v, want chunk 2 of %d bytes", gs, 3*unit)
	}
	if r, ok := s.Region(gs[0].Offset); !ok || r.Block != 4*unit || r.Len != 3*unit || r.Chunk != 2 || r.Flow != k {
		t.Fatalf("Region = %+v, %v", r, ok)
	}
	mustCheck(t, s)
}

func TestWantRejectsBadChunks(t *testing.T) {
	s := mustNew(t, Config{Capacity: 1 << 16, Granularity: 1 << 10, MaxInflight: 2})
	k := key("p", 1)
	for _, chunks := range [][]uint64{{1, 0, 5}, {1 << 16, 1<<16 + 1}, {^uint64(0)}} {
		if err := s.Want(k, chunks); err == nil {
			t.Errorf("Want(%v) succeeded", chunks)
		}
	}
	if err := s.Want(k, nil); err != nil {
		t.Errorf("empty Want: %v", err)
	}
	if st := s.Stats(); st.Flows != 0 || st.Pending != 0 {
		t.Fatalf("rejected Wants changed state: %+v", st)
	}
	if gs := s.Schedule(); len(gs) != 0 {
		t.Fatalf("granted %+v", gs)
	}
	mustCheck(t, s)
}

// TestRepeatedWant: a flow is wanted once. A repeated WANT of a live flow
// (same chunk list) reserves nothing more and reports ErrDuplicateWant; a
// different list is ErrConflictingWant; either leaves the flow as it was,
// even once all its chunks are granted. Once the flow ended, a Want starts a
// new flow from chunk 0.
func TestRepeatedWant(t *testing.T) {
	s := mustNew(t, Config{Capacity: 1 << 20, Granularity: 1 << 10, MaxInflight: 8})
	k := key("p", 1)
	if err := s.Want(k, []uint64{100, 200, 300}); err != nil {
		t.Fatal(err)
	}
	first := s.Schedule()
	if len(first) != 3 {
		t.Fatalf("grants %+v", first)
	}
	before := s.Stats()
	for _, tc := range []struct {
		chunks []uint64
		want   error
	}{
		{[]uint64{100, 200, 300}, ErrDuplicateWant},
		{[]uint64{100, 200}, ErrConflictingWant},
		{[]uint64{100, 200, 300, 400}, ErrConflictingWant},
		{[]uint64{300}, ErrConflictingWant},
	} {
		if err := s.Want(k, tc.chunks); !errors.Is(err, tc.want) {
			t.Errorf("Want(%v) = %v, want %v", tc.chunks, err, tc.want)
		}
		if gs := s.Schedule(); len(gs) != 0 {
			t.Fatalf("Want(%v) of a live flow led to grants %+v", tc.chunks, gs)
		}
		if after := s.Stats(); after != before {
			t.Fatalf("Want(%v) changed the scheduler: %+v -> %+v", tc.chunks, before, after)
		}
		mustCheck(t, s)
	}
	for _, g := range first {
		if err := s.Drop(k, g.Offset); err != nil {
			t.Fatal(err)
		}
	}
	if s.Active(k) {
		t.Fatal("flow still live after its last region was dropped")
	}
	if err := s.Want(k, []uint64{400}); err != nil {
		t.Fatal(err)
	}
	if gs := s.Schedule(); len(gs) != 1 || gs[0].Chunk != 0 || gs[0].Len != 400 {
		t.Fatalf("a new flow after the old one ended: grants %+v", gs)
	}
	mustCheck(t, s)
}

// TestFlowErasedWhenDone shows flows leave every table once their last
// region is done, whichever way it ends.
func TestFlowErasedWhenDone(t *testing.T) {
	const unit = 1 << 12
	s := mustNew(t, Config{Capacity: 16 * unit, Granularity: unit, MaxInflight: 2})
	a, b := key("a", 1), key("b", 2)
	_ = s.Want(a, repeat(3, unit))
	_ = s.Want(b, repeat(1, unit))
	for round := 0; s.Stats().Flows > 0; round++ {
		if round > 10 {
			t.Fatalf("flows never finished: %+v", s.Stats())
		}
		for _, g := range s.Schedule() {
			if g.Flow == b {
				if err := s.Drop(g.Flow, g.Offset); err != nil { // b's DATA rejected
					t.Fatal(err)
				}
				continue
			}
			if err := s.BeginScatter(g.Flow, g.Offset); err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.EndScatter(g.Offset); err != nil {
				t.Fatal(err)
			}
		}
		mustCheck(t, s)
	}
	st := s.Stats()
	if st.Flows != 0 || st.Ready != 0 || st.Regions != 0 || st.FreeBytes != st.Capacity || len(s.flows) != 0 || s.cursor != nil {
		t.Fatalf("after all flows finished: %+v", st)
	}
	// A flow with held regions but nothing pending stays until its last ACK.
	_ = s.Want(a, []uint64{unit})
	g := s.Schedule()
	if s.Stats().Flows != 1 {
		t.Fatal("flow with a held region was erased")
	}
	_ = s.BeginScatter(a, g[0].Offset)
	_, _, _ = s.EndScatter(g[0].Offset)
	if s.Stats().Flows != 0 {
		t.Fatal("flow not erased after its last scatter")
	}
}

func TestScatterLifecycleErrors(t *testing.T) {
	const unit = 1 << 10
	s := mustNew(t, Config{Capacity: 8 * unit, Granularity: unit, MaxInflight: 4})
	a, b := key("a", 1), key("b", 1)
	_ = s.Want(a, repeat(2, unit))
	_ = s.Want(b, repeat(1, unit))
	gs := s.Schedule()
	if len(gs) != 3 {
		t.Fatalf("grants %+v", gs)
	}
	ga := gs[0]
	if !s.Held(a, ga.Offset) || s.Held(b, ga.Offset) || s.Held(a, 7*unit) {
		t.Fatal("Held disagrees with the grants")
	}
	if err := s.BeginScatter(b, ga.Offset); !errors.Is(err, ErrNotHeld) || !errors.Is(err, transfer.ErrOutOfBounds) {
		t.Errorf("BeginScatter by the wrong flow: %v", err)
	}
	if err := s.BeginScatter(a, 7*unit); !errors.Is(err, ErrNotHeld) {
		t.Errorf("BeginScatter of an unheld offset: %v", err)
	}
	if _, _, err := s.EndScatter(ga.Offset); !errors.Is(err, ErrNotScattering) {
		t.Errorf("EndScatter before BeginScatter: %v", err)
	}
	if err := s.BeginScatter(a, ga.Offset); err != nil {
		t.Fatal(err)
	}
	if err := s.BeginScatter(a, ga.Offset); !errors.Is(err, ErrScattering) || !errors.Is(err, transfer.ErrInUse) {
		t.Errorf("second BeginScatter: %v", err)
	}
	if err := s.Drop(a, ga.Offset); !errors.Is(err, ErrScattering) {
		t.Errorf("Drop while scattering: %v", err)
	}
	if err := s.Drop(b, gs[1].Offset+unit*5); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Drop of an unheld offset: %v", err)
	}
	if st := s.Stats(); st.Scattering != 1 {
		t.Fatalf("Scattering %d, want 1", st.Scattering)
	}
	if _, _, err := s.EndScatter(ga.Offset); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.EndScatter(ga.Offset); !errors.Is(err, ErrNotScattering) {
		t.Errorf("second EndScatter: %v", err)
	}
	mustCheck(t, s)
}

// TestCancelDefersScatteringRegions checks that cancel frees what it can,
// orphans what is being scattered, rejects late DATA, and never re-grants
// an orphan's bytes before its scatter ends.
func TestCancelDefersScatteringRegions(t *testing.T) {
	const unit = 1 << 10
	s := mustNew(t, Config{Capacity: 4 * unit, Granularity: unit, MaxInflight: 4})
	a, b := key("a", 1), key("b", 1)
	_ = s.Want(a, repeat(6, unit))
	gs := s.Schedule()
	if len(gs) != 4 {
		t.Fatalf("grants %+v", gs)
	}
	for _, g := range gs[:2] {
		if err := s.BeginScatter(a, g.Offset); err != nil {
			t.Fatal(err)
		}
	}
	if freed := s.Cancel(a); freed != 2 {
		t.Fatalf("Cancel freed %d regions now, want 2", freed)
	}
	st := s.Stats()
	if st.Flows != 0 || st.Orphans != 2 || st.Scattering != 2 || st.OrphanBytes != 2*unit || st.FreeBytes != 2*unit || st.HeldBytes != 0 || st.Pending != 0 {
		t.Fatalf("after cancel: %+v", st)
	}
	mustCheck(t, s)
	// Late DATA for the cancelled flow is detectable.
	for _, g := range gs {
		if s.Held(a, g.Offset) {
			t.Fatalf("cancelled flow still holds %#x", g.Offset)
		}
		if err := s.BeginScatter(a, g.Offset); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("late BeginScatter at %#x: %v", g.Offset, err)
		}
	}
	// A new flow wants the whole arena: only the two freed regions can go.
	_ = s.Want(b, repeat(4, unit))
	got := s.Schedule()
	if len(got) != 2 {
		t.Fatalf("grants with two orphans scattering: %+v", got)
	}
	for _, g := range got {
		if g.Offset == gs[0].Offset || g.Offset == gs[1].Offset {
			t.Fatalf("orphan region %#x re-granted while scattering", g.Offset)
		}
	}
	if k, orphan, err := s.EndScatter(gs[0].Offset); err != nil || !orphan || k != a {
		t.Fatalf("EndScatter(orphan) = %v, %v, %v", k, orphan, err)
	}
	got = s.Schedule()
	if len(got) != 1 || got[0].Offset != gs[0].Offset {
		t.Fatalf("after the orphan's scatter ended: grants %+v, want its region", got)
	}
	if s.Cancel(a) != 0 || s.Cancel(key("nobody", 0)) != 0 {
		t.Fatal("Cancel of an unknown flow freed something")
	}
	mustCheck(t, s)
}

func TestReclaimPeer(t *testing.T) {
	const unit = 1 << 10
	s := mustNew(t, Config{Capacity: 64 * unit, Granularity: unit, MaxInflight: 2})
	for r := uint64(0); r < 3; r++ {
		_ = s.Want(key("gone", r), repeat(3, unit))
		_ = s.Want(key("stays", r), repeat(3, unit))
	}
	gs := s.Schedule()
	if len(gs) != 12 {
		t.Fatalf("%d grants, want 12", len(gs))
	}
	var scattering uint64
	for _, g := range gs {
		if g.Flow == key("gone", 1) {
			scattering = g.Offset
			_ = s.BeginScatter(g.Flow, g.Offset)
			break
		}
	}
	if freed := s.ReclaimPeer("gone"); freed != 5 {
		t.Fatalf("ReclaimPeer freed %d now, want 5 (one region is scattering)", freed)
	}
	st := s.Stats()
	if st.Flows != 3 || st.Orphans != 1 || st.Regions != 6 {
		t.Fatalf("after reclaim: %+v", st)
	}
	for k := range s.flows {
		if k.Peer != "stays" {
			t.Fatalf("flow %v survived reclaim", k)
		}
	}
	if _, orphan, err := s.EndScatter(scattering); err != nil || !orphan {
		t.Fatalf("EndScatter = %v, %v", orphan, err)
	}
	if s.ReclaimPeer("unknown") != 0 {
		t.Fatal("reclaim of an unknown peer freed regions")
	}
	mustCheck(t, s)
}

func TestLocalStaging(t *testing.T) {
	const unit = 1 << 10
	s := mustNew(t, Config{Capacity: 16 * unit, Granularity: unit, MaxInflight: 2})
	// Eager staging stops at half the arena (8 units), counted in blocks.
	var eager []uint64
	for {
		off, ok := s.AcquireLocal(unit+1, true) // 2-unit blocks
		if !ok {
			break
		}
		eager = append(eager, off)
	}
	if len(eager) != 4 || s.Stats().EagerBytes != 8*unit {
		t.Fatalf("%d eager regions, %d eager bytes; want 4, %d", len(eager), s.Stats().EagerBytes, 8*unit)
	}
	if _, ok := s.AcquireLocal(1, true); ok {
		t.Fatal("eager staging beyond half the arena")
	}
	// Credit-backed staging is not capped.
	credit, ok := s.AcquireLocal(4*unit, false)
	if !ok {
		t.Fatal("credit-backed staging refused with free space")
	}
	// Promoting frees eager budget without freeing memory.
	if err := s.PromoteLocal(eager[0]); err != nil {
		t.Fatal(err)
	}
	if err := s.PromoteLocal(eager[0]); !errors.Is(err, ErrNotEager) {
		t.Fatalf("second promote: %v", err)
	}
	if err := s.PromoteLocal(credit + 1); !errors.Is(err, ErrNotLocal) {
		t.Fatalf("promote of a non-local offset: %v", err)
	}
	st := s.Stats()
	if st.EagerBytes != 6*unit || st.LocalBytes != 12*unit || st.Locals != 5 {
		t.Fatalf("after promote: %+v", st)
	}
	if _, ok := s.AcquireLocal(unit, true); !ok {
		t.Fatal("eager staging refused with budget left")
	}
	if _, ok := s.AcquireLocal(0, false); ok {
		t.Fatal("AcquireLocal(0) succeeded")
	}
	if _, ok := s.AcquireLocal(17*unit, false); ok {
		t.Fatal("AcquireLocal beyond capacity succeeded")
	}
	// Remote flows share the arena with staging.
	_ = s.Want(key("r", 1), repeat(4, unit))
	if gs := s.Schedule(); len(gs) != 2 {
		t.Fatalf("grants %+v, want 2 (W)", gs)
	}
	if err := s.ReleaseLocal(credit); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseLocal(credit); !errors.Is(err, ErrNotLocal) {
		t.Fatalf("double release: %v", err)
	}
	if held := s.Held(key("r", 1), credit); held {
		t.Fatal("a local region reads as held by a flow")
	}
	mustCheck(t, s)
}

// TestDrainMode: a flow whose 8-unit head needs the whole arena competes with
// a stream of small flows that keep arriving. It must be granted, and while
// the scheduler drains for it no small flow gets a new region.
func TestDrainMode(t *testing.T) {
	const unit = 1 << 10
	s := mustNew(t, Config{Capacity: 8 * unit, Granularity: unit, MaxInflight: 2})
	big := key("big", 1)
	var inflight []Grant // FIFO of granted regions, oldest first
	next := uint64(0)
	addSmall := func() {
		next++
		if err := s.Want(key("small", next), repeat(2, unit)); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		addSmall()
	}
	inflight = append(inflight, s.Schedule()...)
	if err := s.Want(big, []uint64{8 * unit, unit}); err != nil {
		t.Fatal(err)
	}
	addSmall()
	sawDrain, granted := false, false
	for step := 0; step < 200 && !granted; step++ {
		// The oldest region finishes; two new small flows arrive.
		if len(inflight) > 0 {
			g := inflight[0]
			inflight = inflight[1:]
			if err := s.BeginScatter(g.Flow, g.Offset); err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.EndScatter(g.Offset); err != nil {
				t.Fatal(err)
			}
		}
		addSmall()
		addSmall()
		draining := s.Stats().Draining
		gs := s.Schedule()
		for _, g := range gs {
			if g.Flow == big && g.Chunk == 0 {
				granted = true
				if g.Len != 8*unit || g.Offset != 0 {
					t.Fatalf("big grant %+v", g)
				}
			} else if draining && !granted {
				t.Fatalf("step %d: small flow %v granted while draining for %v", step, g.Flow, big)
			}
		}
		if draining {
			sawDrain = true
			if dk := s.Stats().DrainFlow; !granted && dk != big {
				t.Fatalf("draining for %v, want %v", dk, big)
			}
		}
		inflight = append(inflight, gs...)
		mustCheck(t, s)
	}
	if !sawDrain || !granted {
		t.Fatalf("drain mode seen %v, big chunk granted %v", sawDrain, granted)
	}
	if st := s.Stats(); st.Draining {
		t.Fatalf("still draining after the big chunk was granted: %+v", st)
	}
	// Drain mode ended: the remaining small flows are served again.
	for _, g := range inflight {
		_ = s.BeginScatter(g.Flow, g.Offset)
		_, _, _ = s.EndScatter(g.Offset)
	}
	if gs := s.Schedule(); len(gs) == 0 {
		t.Fatal("nothing granted after drain mode ended")
	}
	mustCheck(t, s)
}

// TestDrainDoesNotBlockLocal: drain mode holds back remote grants only.
func TestDrainDoesNotBlockLocal(t *testing.T) {
	const unit = 1 << 10
	s := mustNew(t, Config{Capacity: 4 * unit, Granularity: unit, MaxInflight: 1, BypassRounds: 1})
	_ = s.Want(key("a", 1), repeat(10, unit))
	_ = s.Want(key("b", 1), repeat(10, unit))
	_ = s.Want(key("c", 1), repeat(10, unit))
	gs := s.Schedule()
	_ = s.Want(key("big", 1), []uint64{4 * unit})
	// Free one region; the sweep passes over big (cursor is at it) and serves
	// a small flow, so big is bypassed once and drain starts.
	_ = s.Drop(gs[0].Flow, gs[0].Offset)
	got := s.Schedule()
	if len(got) != 1 || !s.Stats().Draining || s.Stats().DrainFlow != key("big", 1) {
		t.Fatalf("grants %q, stats %+v: want one small grant then drain for big", grantNames(got), s.Stats())
	}
	_ = s.Drop(got[0].Flow, got[0].Offset)
	if gs := s.Schedule(); len(gs) != 0 {
		t.Fatalf("remote grants while draining: %q", grantNames(gs))
	}
	off, ok := s.AcquireLocal(unit, true)
	if !ok {
		t.Fatal("AcquireLocal blocked by drain mode")
	}
	_ = s.ReleaseLocal(off)
	mustCheck(t, s)
}

// TestDrainCancelled: cancelling the drain flow ends drain mode.
func TestDrainCancelled(t *testing.T) {
	const unit = 1 << 10
	s := mustNew(t, Config{Capacity: 4 * unit, Granularity: unit, MaxInflight: 1, BypassRounds: 1})
	_ = s.Want(key("a", 1), repeat(10, unit))
	_ = s.Want(key("b", 1), repeat(10, unit))
	_ = s.Want(key("c", 1), repeat(10, unit))
	gs := s.Schedule()
	_ = s.Want(key("big", 1), []uint64{4 * unit})
	_ = s.Drop(gs[0].Flow, gs[0].Offset)
	got := s.Schedule()
	if !s.Stats().Draining {
		t.Fatal("not draining")
	}
	_ = s.Drop(got[0].Flow, got[0].Offset)
	s.Cancel(key("big", 1))
	if s.Stats().Draining {
		t.Fatal("still draining for a cancelled flow")
	}
	if gs := s.Schedule(); len(gs) != 1 {
		t.Fatalf("grants after drain flow cancelled: %q", grantNames(gs))
	}
	mustCheck(t, s)
}

// TestIdleRegions counts a flow's granted regions that wait for its sender:
// not pending chunks, not regions being scattered.
func TestIdleRegions(t *testing.T) {
	const unit = 1 << 12
	s := mustNew(t, Config{Capacity: 2 * unit, Granularity: unit, MaxInflight: 4})
	k := key("p", 1)
	_ = s.Want(k, repeat(3, unit))
	if n := s.IdleRegions(k); n != 0 {
		t.Fatalf("pending only: %d idle regions", n)
	}
	gs := s.Schedule()
	if len(gs) != 2 {
		t.Fatalf("grants %+v", gs)
	}
	if n := s.IdleRegions(k); n != 2 {
		t.Fatalf("two granted: %d idle regions", n)
	}
	if err := s.BeginScatter(k, gs[0].Offset); err != nil {
		t.Fatal(err)
	}
	if n := s.IdleRegions(k); n != 1 {
		t.Fatalf("one scattering: %d idle regions", n)
	}
	if n := s.IdleRegions(key("p", 2)); n != 0 {
		t.Fatalf("unknown flow: %d idle regions", n)
	}
}

// TestWaiting: a flow waits (for its sender or for grants) until one of
// its regions is being scattered; an unknown flow does not.
func TestWaiting(t *testing.T) {
	const unit = 1 << 12
	s := mustNew(t, Config{Capacity: unit, Granularity: unit, MaxInflight: 4})
	k, other := key("p", 1), key("p", 2)
	_ = s.Want(k, repeat(1, unit))
	_ = s.Want(other, repeat(1, unit))
	gs := s.Schedule()
	if len(gs) != 1 || gs[0].Flow != k {
		t.Fatalf("grants %+v, want k's one region", gs)
	}
	if !s.Waiting(k) || !s.Waiting(other) {
		t.Fatalf("granted %v, pending %v: want both waiting", s.Waiting(k), s.Waiting(other))
	}
	if err := s.BeginScatter(k, gs[0].Offset); err != nil {
		t.Fatal(err)
	}
	if s.Waiting(k) || !s.Waiting(other) {
		t.Fatalf("scattering %v, pending %v: want only the pending one waiting", s.Waiting(k), s.Waiting(other))
	}
	if s.Waiting(key("p", 3)) {
		t.Fatal("an unknown flow waits")
	}
}

// TestQuarantine: a quarantined region belongs to nobody and is never
// granted until it is released; a scattering region of the same flow
// becomes an orphan as with Cancel.
func TestQuarantine(t *testing.T) {
	const unit = 1 << 12
	s := mustNew(t, Config{Capacity: 2 * unit, Granularity: unit, MaxInflight: 4})
	gone, next := key("gone", 1), key("next", 1)
	_ = s.Want(gone, repeat(2, unit))
	gs := s.Schedule()
	if len(gs) != 2 {
		t.Fatalf("grants %+v", gs)
	}
	if err := s.BeginScatter(gone, gs[0].Offset); err != nil {
		t.Fatal(err)
	}
	q := s.Quarantine(gone)
	if len(q) != 1 || q[0] != gs[1].Offset {
		t.Fatalf("Quarantine = %#x, want [%#x]", q, gs[1].Offset)
	}
	if st := s.Stats(); st.Quarantined != 1 || st.QuarantinedBytes != unit || st.Orphans != 1 || st.Flows != 0 {
		t.Fatalf("stats %+v", st)
	}
	if _, ok := s.Region(q[0]); ok || s.Held(gone, q[0]) {
		t.Fatal("a quarantined region is still visible as held")
	}
	if err := s.BeginScatter(gone, q[0]); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("BeginScatter of a quarantined region: %v", err)
	}
	mustCheck(t, s)
	_ = s.Want(next, repeat(1, unit))
	if _, _, err := s.EndScatter(gs[0].Offset); err != nil {
		t.Fatal(err)
	}
	if g := s.Schedule(); len(g) != 1 || g[0].Offset != gs[0].Offset {
		t.Fatalf("grants %+v: want only the orphan's freed region", g)
	}
	_ = s.Cancel(next)
	_ = s.Want(next, repeat(2, unit))
	if g := s.Schedule(); len(g) != 1 || g[0].Offset == q[0] {
		t.Fatalf("grants %+v while %#x is quarantined", g, q[0])
	}
	if err := s.ReleaseQuarantined(q[0]); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseQuarantined(q[0]); !errors.Is(err, ErrNotQuarantined) {
		t.Fatalf("second release: %v", err)
	}
	if g := s.Schedule(); len(g) != 1 || g[0].Offset != q[0] {
		t.Fatalf("grants %+v after the release, want %#x", g, q[0])
	}
	mustCheck(t, s)
}
