package credit

import (
	"errors"
	"slices"
	"sort"
	"testing"

	"pgregory.net/rapid"
)

// model is the test's independent record of what the scheduler owes whom.
type model struct {
	s        *Scheduler
	capacity uint64
	w        int
	pending  map[FlowKey][]uint64
	wanted   map[FlowKey][]uint64 // each live flow's Want
	next     map[FlowKey]int
	held     map[uint64]mRegion // regions of live flows
	orphans  map[uint64]mRegion
	locals   map[uint64]mLocal
	quar     map[uint64]uint64 // quarantined regions: block size
	share    bool              // Config.PeerShare
	peerMax  uint64            // Config.PeerMax
}

// capped is the fair-share rule of Config.PeerShare, from the model's own
// records: a peer holding at least capacity / (peers with live flows) block
// bytes, while another peer has chunks pending.
func (m *model) capped(peer string) bool {
	if !m.share {
		return false
	}
	live := map[string]bool{}
	waiting := map[string]bool{}
	for k, p := range m.pending {
		if len(p) > 0 {
			live[k.Peer], waiting[k.Peer] = true, true
		}
	}
	var held uint64
	for _, r := range m.held {
		live[r.k.Peer] = true
		if r.k.Peer == peer {
			held += r.size
		}
	}
	others := len(waiting)
	if waiting[peer] {
		others--
	}
	if held > 0 && m.peerMax > 0 && held >= m.peerMax {
		return true
	}
	return held > 0 && len(live) >= 2 && others > 0 && held >= m.capacity/uint64(len(live))
}

type mRegion struct {
	k          FlowKey
	size       uint64
	scattering bool
}

type mLocal struct {
	size  uint64
	eager bool
}

var (
	propPeers = []string{"p0", "p1", "p2"}
	propReqs  = []uint64{0, 1, 2}
)

func drawKey(t *rapid.T, label string) FlowKey {
	return FlowKey{Peer: rapid.SampledFrom(propPeers).Draw(t, label+".peer"), Request: rapid.SampledFrom(propReqs).Draw(t, label+".req")}
}

// overlaps reports whether [off, off+size) intersects any live block.
func (m *model) overlaps(off, size uint64) bool {
	hit := func(o, sz uint64) bool { return off < o+sz && o < off+size }
	for o, r := range m.held {
		if hit(o, r.size) {
			return true
		}
	}
	for o, r := range m.orphans {
		if hit(o, r.size) {
			return true
		}
	}
	for o, l := range m.locals {
		if hit(o, l.size) {
			return true
		}
	}
	for o, sz := range m.quar {
		if hit(o, sz) {
			return true
		}
	}
	return false
}

// drawOffset picks an offset to act on: usually one of the regions the
// action applies to (want), otherwise any offset the model knows or a random
// one, so both the success and the error paths are exercised.
func (m *model) drawOffset(t *rapid.T, want func(off uint64) bool) uint64 {
	var all, good []uint64
	for o := range m.held {
		all = append(all, o)
	}
	for o := range m.orphans {
		all = append(all, o)
	}
	for o := range m.locals {
		all = append(all, o)
	}
	for o := range m.quar {
		all = append(all, o)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	for _, o := range all {
		if want(o) {
			good = append(good, o)
		}
	}
	if len(good) > 0 && rapid.IntRange(0, 4).Draw(t, "pickGood") > 0 {
		return rapid.SampledFrom(good).Draw(t, "off")
	}
	all = append(all, rapid.Uint64Range(0, m.capacity).Draw(t, "randomOff"))
	return rapid.SampledFrom(all).Draw(t, "off")
}

func (m *model) heldBy(k FlowKey) int {
	n := 0
	for _, r := range m.held {
		if r.k == k {
			n++
		}
	}
	return n
}

// cancel applies Cancel(k) to the model and returns the regions it frees now.
func (m *model) cancel(k FlowKey) int {
	return len(m.reclaim(k, false))
}

// reclaim applies Cancel(k) or, with quarantine, Quarantine(k) to the model
// and returns the offsets of the idle regions it frees or quarantines.
func (m *model) reclaim(k FlowKey, quarantine bool) []uint64 {
	delete(m.pending, k)
	var idle []uint64
	for o, r := range m.held {
		if r.k != k {
			continue
		}
		delete(m.held, o)
		if r.scattering {
			m.orphans[o] = r
			continue
		}
		if quarantine {
			m.quar[o] = r.size
		}
		idle = append(idle, o)
	}
	return idle
}

func sameSet(a, b []uint64) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func (m *model) flows() int {
	live := map[FlowKey]bool{}
	for k, p := range m.pending {
		if len(p) > 0 {
			live[k] = true
		}
	}
	for _, r := range m.held {
		live[r.k] = true
	}
	return len(live)
}

func (m *model) check(t *rapid.T) {
	if err := m.s.Check(); err != nil {
		t.Fatal(err)
	}
	st := m.s.Stats()
	var used, eager uint64
	for _, r := range m.held {
		used += r.size
	}
	for _, r := range m.orphans {
		used += r.size
	}
	for _, l := range m.locals {
		used += l.size
		if l.eager {
			eager += l.size
		}
	}
	var quar uint64
	for _, sz := range m.quar {
		used += sz
		quar += sz
	}
	scattering := len(m.orphans)
	for _, r := range m.held {
		if r.scattering {
			scattering++
		}
	}
	switch {
	case st.FreeBytes != m.capacity-used:
		t.Fatalf("FreeBytes %d, model says %d", st.FreeBytes, m.capacity-used)
	case st.EagerBytes != eager || eager > m.capacity/2:
		t.Fatalf("EagerBytes %d, model %d, cap %d", st.EagerBytes, eager, m.capacity/2)
	case st.Flows != m.flows():
		t.Fatalf("Flows %d, model %d", st.Flows, m.flows())
	case st.Orphans != len(m.orphans) || st.Scattering != scattering:
		t.Fatalf("Orphans %d Scattering %d, model %d %d", st.Orphans, st.Scattering, len(m.orphans), scattering)
	case st.Regions != len(m.held) || st.Locals != len(m.locals):
		t.Fatalf("Regions %d Locals %d, model %d %d", st.Regions, st.Locals, len(m.held), len(m.locals))
	case st.Quarantined != len(m.quar) || st.QuarantinedBytes != quar:
		t.Fatalf("Quarantined %d (%d bytes), model %d (%d bytes)", st.Quarantined, st.QuarantinedBytes, len(m.quar), quar)
	case st.FreeBytes+st.HeldBytes+st.OrphanBytes+st.LocalBytes+st.QuarantinedBytes != st.Capacity:
		t.Fatalf("conservation: free %d + held %d + orphaned %d + local %d + quarantined %d != capacity %d",
			st.FreeBytes, st.HeldBytes, st.OrphanBytes, st.LocalBytes, st.QuarantinedBytes, st.Capacity)
	}
	for o := range m.quar {
		if _, ok := m.s.Region(o); ok {
			t.Fatalf("quarantined %#x is visible as a region", o)
		}
	}
	for o, r := range m.held {
		if !m.s.Held(r.k, o) {
			t.Fatalf("Held(%v, %#x) false", r.k, o)
		}
	}
}

// TestSchedulerProperties runs random operation sequences against the
// model and checks the invariants after every step.
func TestSchedulerProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		granule := uint64(1) << rapid.IntRange(0, 6).Draw(t, "granuleShift")
		units := rapid.Uint64Range(1, 64).Draw(t, "units")
		cfg := Config{
			Capacity:     granule*units + rapid.Uint64Range(0, granule-1).Draw(t, "extra"),
			Granularity:  granule,
			MaxInflight:  rapid.IntRange(1, 4).Draw(t, "W"),
			BypassRounds: rapid.IntRange(0, 3).Draw(t, "rounds"),
			PeerShare:    rapid.Bool().Draw(t, "peerShare"),
		}
		if cfg.PeerShare {
			cfg.PeerMax = rapid.Uint64Range(0, cfg.Capacity).Draw(t, "peerMax")
		}
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		m := &model{
			s: s, capacity: s.Capacity(), w: cfg.MaxInflight,
			pending: map[FlowKey][]uint64{}, wanted: map[FlowKey][]uint64{}, next: map[FlowKey]int{},
			held: map[uint64]mRegion{}, orphans: map[uint64]mRegion{}, locals: map[uint64]mLocal{}, quar: map[uint64]uint64{},
			share: cfg.PeerShare, peerMax: cfg.PeerMax,
		}
		// Mostly small chunks, some large ones (which drive drain mode), a few
		// at or past the limits.
		size := rapid.OneOf(
			rapid.Uint64Range(1, 2*granule),
			rapid.Uint64Range(1, 2*granule),
			rapid.Uint64Range(1, 2*granule),
			rapid.Uint64Range(1, max(1, m.capacity/4)),
			rapid.Uint64Range(1, m.capacity),
			rapid.SampledFrom([]uint64{0, m.capacity, m.capacity + 1}),
		)
		actions := map[string]func(*rapid.T){
			"want": func(t *rapid.T) {
				k := drawKey(t, "k")
				live := len(m.pending[k]) > 0 || m.heldBy(k) > 0
				chunks := rapid.SliceOfN(size, 0, 4).Draw(t, "chunks")
				if live && rapid.Bool().Draw(t, "repeat") {
					chunks = append([]uint64(nil), m.wanted[k]...) // a repeated WANT
				}
				valid := true
				for _, n := range chunks {
					valid = valid && n != 0 && n <= m.capacity
				}
				before := s.Stats()
				err := s.Want(k, chunks)
				switch {
				case !valid:
					if err == nil {
						t.Fatalf("Want(%v, %v) accepted an invalid size", k, chunks)
					}
				case len(chunks) == 0:
					if err != nil {
						t.Fatalf("Want(%v, nil) = %v, want a no-op", k, err)
					}
				case live && slices.Equal(chunks, m.wanted[k]):
					if !errors.Is(err, ErrDuplicateWant) {
						t.Fatalf("repeated Want(%v, %v) = %v, want ErrDuplicateWant", k, chunks, err)
					}
				case live:
					if !errors.Is(err, ErrConflictingWant) {
						t.Fatalf("conflicting Want(%v, %v) of a flow that wanted %v = %v, want ErrConflictingWant", k, chunks, m.wanted[k], err)
					}
				default:
					if err != nil {
						t.Fatalf("Want(%v, %v) = %v", k, chunks, err)
					}
					m.next[k] = 0 // a fresh flow numbers its chunks from 0
					m.pending[k] = chunks
					m.wanted[k] = chunks
					return
				}
				if after := s.Stats(); after != before {
					t.Fatalf("Want(%v, %v) = %v changed stats: %+v -> %+v", k, chunks, err, before, after)
				}
			},
			"schedule": func(t *rapid.T) {
				for _, g := range s.Schedule() {
					// No grant goes to a peer at its fair share while another waits.
					if m.capped(g.Flow.Peer) {
						t.Fatalf("grant %+v to peer %q, which holds its fair share while another peer waits", g, g.Flow.Peer)
					}
					p := m.pending[g.Flow]
					if len(p) == 0 || p[0] != g.Len || g.Chunk != m.next[g.Flow] {
						t.Fatalf("grant %+v, model pending %v next chunk %d", g, p, m.next[g.Flow])
					}
					bs := s.BlockSize(g.Len)
					if g.Offset%bs != 0 || g.Offset+bs > m.capacity {
						t.Fatalf("grant %+v: block %d misaligned or beyond %d", g, bs, m.capacity)
					}
					for o, sz := range m.quar {
						if g.Offset < o+sz && o < g.Offset+bs {
							t.Fatalf("grant %+v overlaps quarantined region %#x", g, o)
						}
					}
					if m.overlaps(g.Offset, bs) {
						t.Fatalf("grant %+v overlaps a live region (scattering, orphaned, held or local)", g)
					}
					m.pending[g.Flow] = p[1:]
					m.next[g.Flow]++
					m.held[g.Offset] = mRegion{k: g.Flow, size: bs}
					if n := m.heldBy(g.Flow); n > m.w {
						t.Fatalf("flow %v holds %d regions, W=%d", g.Flow, n, m.w)
					}
				}
				if s.Stats().Draining {
					return
				}
				// Schedule stops only when no ready head chunk fits.
				for k, p := range m.pending {
					if len(p) > 0 && m.heldBy(k) < m.w && !m.capped(k.Peer) && s.BlockSize(p[0]) <= s.buddy.LargestFree() {
						t.Fatalf("flow %v head %d fits (largest free %d) but was not granted", k, p[0], s.buddy.LargestFree())
					}
				}
			},
			"beginScatter": func(t *rapid.T) {
				off := m.drawOffset(t, func(o uint64) bool { r, ok := m.held[o]; return ok && !r.scattering })
				r, isHeld := m.held[off]
				k := r.k
				if !isHeld || rapid.IntRange(0, 4).Draw(t, "wrongKey") == 0 {
					k = drawKey(t, "k")
				}
				want := isHeld && k == r.k && !r.scattering
				err := s.BeginScatter(k, off)
				if want != (err == nil) {
					t.Fatalf("BeginScatter(%v, %#x) = %v, model expects ok=%v", k, off, err, want)
				}
				if want {
					r.scattering = true
					m.held[off] = r
				}
			},
			"endScatter": func(t *rapid.T) {
				off := m.drawOffset(t, func(o uint64) bool { _, orphan := m.orphans[o]; return m.held[o].scattering || orphan })
				r, isHeld := m.held[off]
				o, isOrphan := m.orphans[off]
				want := (isHeld && r.scattering) || isOrphan
				k, orphan, err := s.EndScatter(off)
				if want != (err == nil) {
					t.Fatalf("EndScatter(%#x) = %v, model expects ok=%v", off, err, want)
				}
				if !want {
					if !errors.Is(err, ErrNotScattering) {
						t.Fatalf("EndScatter(%#x) error %v", off, err)
					}
					return
				}
				if isOrphan {
					if !orphan || k != o.k {
						t.Fatalf("EndScatter(orphan %#x) = %v, %v", off, k, orphan)
					}
					delete(m.orphans, off)
					return
				}
				if orphan || k != r.k {
					t.Fatalf("EndScatter(%#x) = %v, %v; want %v, false", off, k, orphan, r.k)
				}
				delete(m.held, off)
			},
			"drop": func(t *rapid.T) {
				off := m.drawOffset(t, func(o uint64) bool { r, ok := m.held[o]; return ok && !r.scattering })
				r, isHeld := m.held[off]
				k := r.k
				if !isHeld || rapid.IntRange(0, 4).Draw(t, "wrongKey") == 0 {
					k = drawKey(t, "k")
				}
				want := isHeld && k == r.k && !r.scattering
				err := s.Drop(k, off)
				if want != (err == nil) {
					t.Fatalf("Drop(%v, %#x) = %v, model expects ok=%v", k, off, err, want)
				}
				if want {
					delete(m.held, off)
				}
			},
			"cancel": func(t *rapid.T) {
				k := drawKey(t, "k")
				want := m.cancel(k)
				if got := s.Cancel(k); got != want {
					t.Fatalf("Cancel(%v) freed %d, model %d", k, got, want)
				}
			},
			"reclaimPeer": func(t *rapid.T) {
				p := rapid.SampledFrom(append([]string{"nobody"}, propPeers...)).Draw(t, "peer")
				want := 0
				for _, r := range propReqs {
					want += m.cancel(FlowKey{Peer: p, Request: r})
				}
				if got := s.ReclaimPeer(p); got != want {
					t.Fatalf("ReclaimPeer(%q) freed %d, model %d", p, got, want)
				}
			},
			"quarantine": func(t *rapid.T) {
				k := drawKey(t, "k")
				want := m.reclaim(k, true)
				if got := s.Quarantine(k); !sameSet(got, want) {
					t.Fatalf("Quarantine(%v) = %#x, model %#x", k, got, want)
				}
			},
			"quarantinePeer": func(t *rapid.T) {
				p := rapid.SampledFrom(append([]string{"nobody"}, propPeers...)).Draw(t, "peer")
				var want []uint64
				for _, r := range propReqs {
					want = append(want, m.reclaim(FlowKey{Peer: p, Request: r}, true)...)
				}
				if got := s.QuarantinePeer(p); !sameSet(got, want) {
					t.Fatalf("QuarantinePeer(%q) = %#x, model %#x", p, got, want)
				}
			},
			"releaseQuarantined": func(t *rapid.T) {
				off := m.drawOffset(t, func(o uint64) bool { _, ok := m.quar[o]; return ok })
				_, want := m.quar[off]
				err := s.ReleaseQuarantined(off)
				if want != (err == nil) {
					t.Fatalf("ReleaseQuarantined(%#x) = %v, model expects ok=%v", off, err, want)
				}
				if !want && !errors.Is(err, ErrNotQuarantined) {
					t.Fatalf("ReleaseQuarantined(%#x) error %v", off, err)
				}
				delete(m.quar, off)
			},
			"acquireLocal": func(t *rapid.T) {
				n := size.Draw(t, "n")
				eager := rapid.Bool().Draw(t, "eager")
				bs := s.BlockSize(n)
				var eagerBytes uint64
				for _, l := range m.locals {
					if l.eager {
						eagerBytes += l.size
					}
				}
				want := bs != 0 && bs <= s.buddy.LargestFree() && (!eager || eagerBytes+bs <= m.capacity/2)
				off, ok := s.AcquireLocal(n, eager)
				if ok != want {
					t.Fatalf("AcquireLocal(%d, %v) ok=%v, model %v", n, eager, ok, want)
				}
				if !ok {
					return
				}
				if off%bs != 0 || m.overlaps(off, bs) {
					t.Fatalf("AcquireLocal(%d) = %#x overlaps or misaligned", n, off)
				}
				m.locals[off] = mLocal{size: bs, eager: eager}
			},
			"promoteLocal": func(t *rapid.T) {
				off := m.drawOffset(t, func(o uint64) bool { return m.locals[o].eager })
				l, ok := m.locals[off]
				want := ok && l.eager
				if err := s.PromoteLocal(off); want != (err == nil) {
					t.Fatalf("PromoteLocal(%#x) = %v, model expects ok=%v", off, err, want)
				}
				if want {
					l.eager = false
					m.locals[off] = l
				}
			},
			"releaseLocal": func(t *rapid.T) {
				off := m.drawOffset(t, func(o uint64) bool { _, ok := m.locals[o]; return ok })
				_, want := m.locals[off]
				if err := s.ReleaseLocal(off); want != (err == nil) {
					t.Fatalf("ReleaseLocal(%#x) = %v, model expects ok=%v", off, err, want)
				}
				delete(m.locals, off)
			},
		}
		// Action weights: the region lifecycle dominates, reclaim is rarer.
		// rapid favours early list entries, so the lifecycle comes first.
		var names []string
		for _, w := range []struct {
			name string
			n    int
		}{
			{"schedule", 4}, {"want", 4}, {"beginScatter", 3}, {"endScatter", 3}, {"drop", 1},
			{"acquireLocal", 2}, {"releaseLocal", 2}, {"promoteLocal", 1}, {"cancel", 1}, {"reclaimPeer", 1},
			{"quarantine", 1}, {"releaseQuarantined", 2}, {"quarantinePeer", 1},
		} {
			for range w.n {
				names = append(names, w.name)
			}
		}
		steps := rapid.IntRange(100, 1000).Draw(t, "steps")
		for range steps {
			actions[rapid.SampledFrom(names).Draw(t, "action")](t)
			m.check(t)
		}
		// Wind down: finish every scatter, drop every region, release staging,
		// keep scheduling; the arena must come back whole.
		for guard := 0; ; guard++ {
			if guard > 10000 {
				t.Fatalf("wind-down did not finish: %+v", s.Stats())
			}
			for o, r := range m.orphans {
				if _, _, err := s.EndScatter(o); err != nil {
					t.Fatalf("EndScatter orphan %#x of %v: %v", o, r.k, err)
				}
				delete(m.orphans, o)
			}
			for o := range m.locals {
				if err := s.ReleaseLocal(o); err != nil {
					t.Fatal(err)
				}
				delete(m.locals, o)
			}
			for o := range m.quar {
				if err := s.ReleaseQuarantined(o); err != nil {
					t.Fatal(err)
				}
				delete(m.quar, o)
			}
			for o, r := range m.held {
				if r.scattering {
					if _, _, err := s.EndScatter(o); err != nil {
						t.Fatal(err)
					}
				} else if err := s.Drop(r.k, o); err != nil {
					t.Fatal(err)
				}
				delete(m.held, o)
			}
			gs := s.Schedule()
			for _, g := range gs {
				m.pending[g.Flow] = m.pending[g.Flow][1:]
				m.held[g.Offset] = mRegion{k: g.Flow, size: s.BlockSize(g.Len)}
			}
			m.check(t)
			if len(gs) == 0 && len(m.held) == 0 {
				break
			}
		}
		if st := s.Stats(); st.Flows != 0 || st.FreeBytes != st.Capacity || st.Pending != 0 || st.Draining {
			t.Fatalf("after wind-down: %+v", st)
		}
		if off, ok := s.buddy.Alloc(m.capacity); !ok || off != 0 {
			t.Fatal("arena did not coalesce back to one block")
		}
	})
}
