package credit

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkBuddyAllocFree measures one Alloc plus one Free in a steady state
// with about a thousand live blocks of mixed sizes.
func BenchmarkBuddyAllocFree(b *testing.B) {
	for _, tc := range []struct {
		name     string
		capacity uint64
		granule  uint64
		maxN     uint64
	}{
		{"256MiB/1MiB", 256 << 20, 1 << 20, 32 << 20},
		{"1GiB/4KiB", 1 << 30, 4 << 10, 1 << 20},
	} {
		b.Run(tc.name, func(b *testing.B) {
			bd := mustBuddy(b, tc.capacity, tc.granule)
			rng := rand.New(rand.NewPCG(1, 2))
			sizes := make([]uint64, 4096)
			for i := range sizes {
				sizes[i] = 1 + rng.Uint64N(tc.maxN)
			}
			live := make([]uint64, 0, 1024)
			for len(live) < cap(live)/2 {
				off, ok := bd.Alloc(sizes[len(live)%len(sizes)])
				if !ok {
					break
				}
				live = append(live, off)
			}
			failed := 0
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if off, ok := bd.Alloc(sizes[i%len(sizes)]); ok {
					live = append(live, off)
				} else {
					failed++
				}
				if len(live) > 0 {
					j := int(uint(i*7919) % uint(len(live)))
					bd.Free(live[j])
					live[j] = live[len(live)-1]
					live = live[:len(live)-1]
				}
			}
			b.ReportMetric(float64(failed)/float64(b.N), "failed/op")
		})
	}
}

// driver runs the receiver's steady state: the oldest granted region is
// scattered and freed, a flow whose last region that was is followed by a
// new flow of the same peer (the next request) wanting 2W chunks, and
// Schedule refills. The number of live flows stays constant.
type driver struct {
	s     *Scheduler
	fifo  []Grant
	head  int
	flows int
	w     int
	size  func(FlowKey) uint64
}

func newDriver(tb testing.TB, flows, w int, capacity, granule uint64, size func(FlowKey) uint64) *driver {
	s := mustNew(tb, Config{Capacity: capacity, Granularity: granule, MaxInflight: w})
	d := &driver{s: s, flows: flows, w: w, size: size}
	for i := range flows {
		d.want(tb, FlowKey{Peer: fmt.Sprintf("peer-%d", i%64), Request: uint64(i)})
	}
	d.fifo = s.Schedule()
	if len(d.fifo) == 0 {
		tb.Fatal("driver: nothing granted")
	}
	return d
}

func (d *driver) want(tb testing.TB, k FlowKey) {
	chunks := make([]uint64, 2*d.w)
	for j := range chunks {
		chunks[j] = d.size(k)
	}
	if err := d.s.Want(k, chunks); err != nil {
		tb.Fatal(err)
	}
}

// step retires the oldest region and returns the number of new grants.
func (d *driver) step(tb testing.TB) int {
	g := d.fifo[d.head]
	d.head++
	if err := d.s.BeginScatter(g.Flow, g.Offset); err != nil {
		tb.Fatal(err)
	}
	if _, _, err := d.s.EndScatter(g.Offset); err != nil {
		tb.Fatal(err)
	}
	if !d.s.Active(g.Flow) {
		d.want(tb, FlowKey{Peer: g.Flow.Peer, Request: g.Flow.Request + uint64(d.flows)})
	}
	gs := d.s.Schedule()
	if d.head > 4096 && 2*d.head > len(d.fifo) {
		d.fifo = d.fifo[:copy(d.fifo, d.fifo[d.head:])]
		d.head = 0
	}
	d.fifo = append(d.fifo, gs...)
	return len(gs)
}

// run performs n steps and returns the grants and the time they took.
func (d *driver) run(tb testing.TB, n int) (int, time.Duration) {
	grants := 0
	start := time.Now()
	for range n {
		grants += d.step(tb)
	}
	return grants, time.Since(start)
}

type schedCase struct {
	name     string
	w        int
	capacity uint64
	granule  uint64
	size     func(FlowKey) uint64
}

var schedCases = []schedCase{
	// 1024 one-MiB regions for 10,000 flows: almost every ready flow waits
	// for arena space.
	{"arena-bound", 8, 1 << 30, 1 << 20, func(FlowKey) uint64 { return 1 << 20 }},
	// Room for 2.5 regions per flow with W=2: almost every flow is parked at
	// its cap, off the ring.
	{"cap-bound", 2, 25000 * 4096, 4096, func(FlowKey) uint64 { return 4096 }},
	// Heads of 1, 2, 4 or 8 MiB under arena pressure: sweeps skip flows whose
	// head does not fit and drain mode serves the large ones.
	{"mixed-sizes", 8, 1 << 30, 1 << 20, func(k FlowKey) uint64 { return (1 << 20) << (k.Request % 4) }},
}

// BenchmarkSchedule measures the receiver steady state with 10,000 active
// flows: one op is one scatter completion, a new flow's WANT when that
// completion ended a flow, and one Schedule.
// ns/grant divides the whole loop's time by the grants it produced.
func BenchmarkSchedule(b *testing.B) {
	for _, tc := range schedCases {
		b.Run(tc.name, func(b *testing.B) {
			d := newDriver(b, 10000, tc.w, tc.capacity, tc.granule, tc.size)
			grants := 0
			b.ResetTimer()
			for b.Loop() {
				grants += d.step(b)
			}
			if grants == 0 {
				b.Fatal("no grants")
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(grants), "ns/grant")
			b.ReportMetric(float64(grants)/float64(b.N), "grants/op")
			b.ReportMetric(float64(d.s.visits)/float64(grants), "visits/grant")
		})
	}
}

// BenchmarkScheduleScaling runs the same steady state with 100 and with
// 10,000 flows side by side and reports the ns/grant ratio (10,000 / 100):
// close to 1 means the cost per grant does not grow with the flow count.
func BenchmarkScheduleScaling(b *testing.B) {
	for _, tc := range schedCases {
		b.Run(tc.name, func(b *testing.B) {
			// Scale the arena with the flow count so both runs see the same
			// pressure per flow.
			small := newDriver(b, 100, tc.w, tc.capacity/100, tc.granule, tc.size)
			large := newDriver(b, 10000, tc.w, tc.capacity, tc.granule, tc.size)
			b.ResetTimer()
			var gs, gl int
			var ts, tl time.Duration
			for b.Loop() {
				g, t := small.run(b, 1)
				gs, ts = gs+g, ts+t
				g, t = large.run(b, 1)
				gl, tl = gl+g, tl+t
			}
			if gs == 0 || gl == 0 {
				b.Fatal("no grants")
			}
			nsSmall := float64(ts.Nanoseconds()) / float64(gs)
			nsLarge := float64(tl.Nanoseconds()) / float64(gl)
			b.ReportMetric(nsSmall, "ns/grant@100")
			b.ReportMetric(nsLarge, "ns/grant@10k")
			b.ReportMetric(nsLarge/nsSmall, "ratio")
		})
	}
}
