package pipeline

import (
	"container/heap"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// TestParkedRequestsStartInArrivalOrder: requests that wait for the
// sender's staging space (its arena holds two chunks, the receiver's eight)
// start their gathers in the order they arrived, the later of two waves
// included, whether gathers are eager or wait for the credit. Messages
// arrive in the order sent (no delay), so the receiver's grants follow the
// WANTs; the simulation is deterministic except where the old code iterated
// a map (the sender's parked requests, the receiver's capped peer's flows).
func TestParkedRequestsStartInArrivalOrder(t *testing.T) {
	for _, eager := range []bool{false, true} {
		t.Run(fmt.Sprintf("eager=%v", eager), func(t *testing.T) {
			w := newSimWorld(7, &simTotals{}, func(f *simFaults) {
				*f = simFaults{opDelay: 500 * time.Microsecond, busy: 1 << 20}
			})
			defer w.close()
			recv := w.addAgentWith("r0", true, func(c *Config) { c.MaxInflight = 8 })
			send := w.addAgentWith("s0", false, func(c *Config) {
				c.ArenaSize = 2 * simMaxChunk // two staging regions, one of them eager
				c.MaxInflight = 8
				c.EagerGather = eager
			})
			w.connect(send, recv)
			const wave = 12
			submitWave := func() {
				for i := 0; i < wave; i++ {
					submitChunk(t, w, send, recv)
				}
			}
			submitWave()
			var order []uint64 // request ids in the order their first gather started
			seen := map[uint64]bool{}
			var granted []uint64 // request ids by the step their first GRANT arrived in
			gseen := map[uint64]bool{}
			observe := func() {
				var now []uint64
				for id, q := range send.a.r.reqs {
					if q.granted && !gseen[id] {
						gseen[id] = true
						now = append(now, id)
					}
				}
				slices.Sort(now)
				granted = append(granted, now...)
				for _, ref := range send.a.r.gathering {
					if !seen[ref.q.id] {
						seen[ref.q.id] = true
						order = append(order, ref.q.id)
					}
				}
			}
			second := false
			runSim(t, w, func() {
				observe()
				// The second wave arrives while most of the first waits.
				if !second && len(order) >= 3 {
					second = true
					submitWave()
					observe()
				}
			})
			w.finalCheck()
			if len(w.bad) > 0 {
				t.Fatalf("simulation violations: %v", w.bad)
			}
			if len(order) != 2*wave {
				t.Fatalf("%d requests started, want %d", len(order), 2*wave)
			}
			if !slices.IsSorted(order) {
				t.Fatalf("requests started out of arrival order: %v (first granted, by step: %v)", order, granted)
			}
			for _, q := range send.reqs {
				if err := q.b.Err(); err != nil {
					t.Fatalf("request %d: %v", q.b.ID(), err)
				}
			}
		})
	}
}

// submitChunk submits one request of eight 4 KiB descriptors: one chunk
// of simMaxChunk bytes.
func submitChunk(t *testing.T, w *simWorld, s, to *simAgent) {
	t.Helper()
	const n, size = 8, simMaxChunk / 8
	q := &simReq{from: s.name, to: to.name}
	for i := 0; i < n; i++ {
		src := transfer.Desc{Addr: s.base + s.bump, Len: size}
		dst := transfer.Desc{Addr: to.base + to.bump, Len: size}
		s.bump += size
		to.bump += size
		p := make([]byte, size)
		for j := range p {
			p[j] = pattern(patternKey(w.seed, s.name, len(s.reqs), i), j)
		}
		copy(s.bytes(src), p)
		q.src, q.dst, q.want = append(q.src, src), append(q.dst, dst), append(q.want, p)
	}
	b, err := s.a.Submit(Request{Peer: to.name, Src: q.src, Dst: q.dst, Route: RouteBounce})
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	q.b = b
	s.reqs = append(s.reqs, q)
}

// runSim steps the world to quiescence, calling observe after every step.
func runSim(t *testing.T, w *simWorld, observe func()) {
	t.Helper()
	limit := w.start.Add(60 * time.Second)
	for {
		w.step()
		observe()
		if w.events.Len() == 0 && w.quiescent() {
			return
		}
		if w.clock.t.After(limit) || len(w.bad) > 0 {
			t.Fatalf("not quiescent after %v of simulated time: %v", w.clock.t.Sub(w.start), w.bad)
		}
		next := w.clock.t.Add(simTimeout / 10)
		if w.events.Len() > 0 && w.events[0].at.Before(next) {
			next = w.events[0].at
		}
		if next.After(w.clock.t) {
			w.clock.t = next
		}
		for w.events.Len() > 0 && !w.events[0].at.After(w.clock.t) {
			heap.Pop(&w.events).(*simEvent).fn()
		}
	}
}
