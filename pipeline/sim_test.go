package pipeline

import (
	"container/heap"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/pipeline/credit"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// The deterministic simulation: agents whose reactors are stepped by the
// test (no goroutines), on a simulated clock, over a simulated control
// channel, engine and copy stages that inject seeded faults. Every seed runs
// to quiescence and checks the contracts (see simWorld.finalCheck).
//
//	go test ./pipeline -run TestSim -sim.seeds=100000     # more seeds (make sim)
//	go test ./pipeline -run TestSim -sim.seed=1234 -v     # replay one, with its transcript
var (
	simSeeds = flag.Int("sim.seeds", 0, "number of simulation seeds TestSim runs (0: 3000, or 250 under the race detector)")
	simSeed  = flag.Int64("sim.seed", -1, "run only this simulation seed and print its transcript")
	simFirst = flag.Int64("sim.first", 1, "first seed TestSim runs")
)

type simClock struct{ t time.Time }

func (c *simClock) Now() time.Time { return c.t }

// simFaults are one seed's fault rates and events.
type simFaults struct {
	msgDelay, opDelay   time.Duration // maximum delays
	sendDrop            float64       // a Send refused: queue full
	writeFail           float64       // a write fails before any byte moved
	writeLate           float64       // a write fails without proof, and lands later
	writePeerLost       float64       // a write fails with ErrPeerLost
	scatterFail         float64       // a scatter fails
	busy                int           // copy ops a stage accepts at once (ErrBusy beyond)
	crashSender         bool          // one sender is killed mid-run
	restart             bool          // and comes back under a new name
	forgetDead          bool          // survivors ForgetPeer the dead (a peer-lost report)
	crashReceiver       bool          // one receiver is killed mid-run
	partition           bool          // one sender–receiver pair is cut for a while
	partFrom, partUntil time.Duration // the partition's window
	fence               bool          // engines fence forgotten peers
	// lieFence makes the engine claim a fence it does not provide (a
	// broken engine): TestSimCatchesBrokenFence checks the harness sees it.
	lieFence bool
}

func (f simFaults) String() string {
	return fmt.Sprintf("msgDelay=%v opDelay=%v sendDrop=%.3f writeFail=%.3f writeLate=%.3f writePeerLost=%.3f scatterFail=%.3f busy=%d crashSender=%v restart=%v forgetDead=%v crashReceiver=%v partition=%v[%v,%v] fence=%v",
		f.msgDelay, f.opDelay, f.sendDrop, f.writeFail, f.writeLate, f.writePeerLost, f.scatterFail, f.busy,
		f.crashSender, f.restart, f.forgetDead, f.crashReceiver, f.partition, f.partFrom, f.partUntil, f.fence)
}

const (
	simTimeout  = 200 * time.Millisecond // request timeout (virtual)
	simArena    = 256 << 10
	simGran     = 4 << 10
	simMaxChunk = 32 << 10
	simBuf      = 1 << 20 // each agent's user memory
)

// simWorld is one seed's universe.
type simWorld struct {
	seed   int64
	rng    *rand.Rand
	clock  *simClock
	start  time.Time
	f      simFaults
	agents []*simAgent // in creation order (the stepping order)
	byName map[string]*simAgent
	events simEvents
	seq    uint64
	// writes lists every write whose bytes may still land (pending, or
	// failed without proof); scatters every scatter op not yet done.
	writes   []*simWrite
	scatters []*simCopy
	log      []string
	bad      []string
	stats    *simTotals
}

// simTotals counts what all seeds did, for the summary line.
type simTotals struct {
	seeds, requests, succeeded, failed                    int
	drops, writeFails, lateWrites, peerLost, scatterFails int
	crashes, restarts, partitions, forgets, lateLanded    int
	bytes                                                 uint64
}

type simAgent struct {
	name     string
	w        *simWorld
	a        *Agent
	reg      *mem.Registry
	buf      []byte
	base     uint64
	bump     uint64 // next free byte of buf
	dead     bool
	receiver bool
	peers    map[string]bool // control peers added
	copies   int             // copy ops outstanding in this agent's stages
	reqs     []*simReq
}

// simReq is one submitted request and the bytes it must deliver.
type simReq struct {
	from, to string
	b        *Batch
	src, dst []transfer.Desc
	want     [][]byte // the pattern of each descriptor
	poisoned bool
}

type simEvent struct {
	at  time.Time
	seq uint64
	fn  func()
}

type simEvents []*simEvent

func (h simEvents) Len() int { return len(h) }
func (h simEvents) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h simEvents) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *simEvents) Push(x any)   { *h = append(*h, x.(*simEvent)) }
func (h *simEvents) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func (w *simWorld) at(d time.Duration, fn func()) {
	w.seq++
	heap.Push(&w.events, &simEvent{at: w.clock.t.Add(d), seq: w.seq, fn: fn})
}

func (w *simWorld) logf(format string, args ...any) {
	w.log = append(w.log, fmt.Sprintf("%9.3fms ", float64(w.clock.t.Sub(w.start))/1e6)+fmt.Sprintf(format, args...))
}

func (w *simWorld) violation(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	w.logf("VIOLATION %s", msg)
	w.bad = append(w.bad, msg)
}

func (w *simWorld) chance(p float64) bool { return p > 0 && w.rng.Float64() < p }

func (w *simWorld) delay(max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	return time.Duration(w.rng.Int64N(int64(max)))
}

// cut reports whether the control and data paths between a and b are
// partitioned now.
func (w *simWorld) cut(a, b string) bool {
	if !w.f.partition {
		return false
	}
	now := w.clock.t.Sub(w.start)
	if now < w.f.partFrom || now >= w.f.partUntil {
		return false
	}
	pa, pb := w.agents[0].name, w.agents[len(w.agents)-1].name
	return a == pa && b == pb || a == pb && b == pa
}

func newSimWorld(seed int64, totals *simTotals, mutate func(*simFaults)) *simWorld {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	start := time.Unix(1_000_000, 0)
	w := &simWorld{seed: seed, rng: rng, clock: &simClock{t: start}, start: start, byName: map[string]*simAgent{}, stats: totals}
	f := simFaults{
		msgDelay: time.Duration(rng.IntN(3000)) * time.Microsecond,
		opDelay:  time.Duration(rng.IntN(2000)+1) * time.Microsecond,
		busy:     1 + rng.IntN(6),
	}
	if rng.IntN(2) == 0 {
		f.sendDrop = rng.Float64() * 0.03
	}
	if rng.IntN(2) == 0 {
		f.writeFail = rng.Float64() * 0.03
		f.writeLate = rng.Float64() * 0.03
		f.writePeerLost = rng.Float64() * 0.01
	}
	if rng.IntN(2) == 0 {
		f.scatterFail = rng.Float64() * 0.03
	}
	f.crashSender = rng.IntN(4) == 0
	f.restart = f.crashSender && rng.IntN(2) == 0
	f.forgetDead = rng.IntN(2) == 0
	f.crashReceiver = !f.crashSender && rng.IntN(8) == 0
	f.fence = rng.IntN(3) == 0
	if rng.IntN(4) == 0 {
		f.partition = true
		f.partFrom = time.Duration(rng.IntN(40)) * time.Millisecond
		f.partUntil = f.partFrom + time.Duration(1+rng.IntN(int(simTimeout/time.Millisecond/2)))*time.Millisecond
	}
	if mutate != nil {
		mutate(&f)
	}
	w.f = f
	return w
}

func (w *simWorld) addAgent(name string, receiver bool) *simAgent {
	return w.addAgentWith(name, receiver, nil)
}

// addAgentWith is addAgent with the seed's configuration adjusted by tune
// (nil: none) before the agent is built.
func (w *simWorld) addAgentWith(name string, receiver bool, tune func(*Config)) *simAgent {
	s := &simAgent{name: name, w: w, reg: &mem.Registry{}, receiver: receiver, peers: map[string]bool{}}
	s.buf = make([]byte, simBuf)
	s.base = uint64(uintptr(unsafe.Pointer(&s.buf[0])))
	eng := &simEngine{s: s}
	set := Settings{
		Name: name, Engine: eng, Control: &simCtrl{s: s},
		Gatherer: &simStage{s: s, gather: true}, Scatterer: &simStage{s: s},
		Registry: s.reg, Clock: w.clock,
	}
	cfg := Config{
		Enabled: true, ArenaSize: simArena, Granularity: simGran, MaxChunk: simMaxChunk,
		MaxInflight: 1 + w.rng.IntN(4), ScatterWorkers: 2, MinDescriptors: 1, MaxAvgDescriptor: simMaxChunk,
		RequestTimeout: simTimeout, QuiesceTimeout: simTimeout, EagerGather: w.rng.IntN(2) == 0,
	}
	if tune != nil {
		tune(&cfg)
	}
	a, err := build(set, cfg)
	if err != nil {
		panic(err)
	}
	if ok, why := a.BounceEnabled(); !ok {
		panic("sim agent without bounce: " + why)
	}
	s.a = a
	if err := a.RegisterMemory(transfer.Desc{Addr: s.base, Len: simBuf}); err != nil {
		panic(err)
	}
	w.agents = append(w.agents, s)
	w.byName[name] = s
	w.logf("%s starts (%s, W=%d, eager=%v)", name, map[bool]string{true: "receiver", false: "sender"}[receiver], cfg.MaxInflight, cfg.EagerGather)
	return s
}

// connect loads each of the two agents' descriptors into the other.
func (w *simWorld) connect(x, y *simAgent) {
	for _, p := range [][2]*simAgent{{x, y}, {y, x}} {
		d, err := p[1].a.Descriptor()
		if err != nil {
			panic(err)
		}
		if _, err := p[0].a.LoadPeer(d); err != nil {
			panic(err)
		}
	}
}

// patternKey and pattern give the byte a request's descriptor holds at
// offset i: distinct per seed, sender, request and descriptor, never zero.
func patternKey(seed int64, who string, req, desc int) uint32 {
	h := fnv.New32a()
	fmt.Fprintf(h, "%d/%s/%d/%d", seed, who, req, desc)
	return h.Sum32()
}

func pattern(key uint32, i int) byte { return byte(key>>uint(i%24)+uint32(i)) | 1 }

// submit starts one request from s to the receiver to.
func (w *simWorld) submit(s *simAgent, to *simAgent) {
	if s.dead || to.dead {
		return
	}
	n := 1 + w.rng.IntN(24)
	size := uint64(256 << w.rng.IntN(5)) // 256 B .. 4 KiB
	if s.bump+uint64(n)*size > simBuf || to.bump+uint64(n)*size > simBuf {
		return
	}
	q := &simReq{from: s.name, to: to.name}
	idx := len(s.reqs)
	for i := 0; i < n; i++ {
		src := transfer.Desc{Addr: s.base + s.bump, Len: size}
		dst := transfer.Desc{Addr: to.base + to.bump, Len: size}
		s.bump += size
		to.bump += size
		p := make([]byte, size)
		key := patternKey(w.seed, s.name, idx, i)
		for j := range p {
			p[j] = pattern(key, j)
		}
		copy(s.bytes(src), p)
		q.src, q.dst, q.want = append(q.src, src), append(q.dst, dst), append(q.want, p)
	}
	b, err := s.a.Submit(Request{Peer: to.name, Src: q.src, Dst: q.dst})
	if err != nil {
		if errors.Is(err, transfer.ErrUnknownPeer) {
			return // forgotten meanwhile
		}
		w.violation("%s submit to %s: %v", s.name, to.name, err)
		return
	}
	q.b = b
	s.reqs = append(s.reqs, q)
	w.stats.requests++
	w.logf("%s submits request %d to %s: %d × %d B (route %v)", s.name, b.ID(), to.name, n, size, b.Route())
}

// bytes returns the agent's user memory d covers.
func (s *simAgent) bytes(d transfer.Desc) []byte {
	off := d.Addr - s.base
	return s.buf[off : off+d.Len]
}

// crash kills an agent: its reactor is never stepped again and messages to
// it are lost. Writes it posted may still land (a NIC does not stop when
// its process dies), within the engine's bound.
func (w *simWorld) crash(s *simAgent) {
	if s.dead {
		return
	}
	s.dead = true
	w.stats.crashes++
	w.logf("%s CRASHES", s.name)
	if !w.f.forgetDead {
		return
	}
	// The survivors learn it after a detection delay (a peer-lost report).
	w.at(time.Duration(w.rng.IntN(50))*time.Millisecond, func() {
		for _, o := range w.agents {
			if !o.dead {
				w.stats.forgets++
				w.logf("%s forgets %s", o.name, s.name)
				_ = o.a.ForgetPeer(s.name)
			}
		}
	})
}

// step runs every live reactor until none makes progress, handing scatter
// jobs to the simulated workers and checking conservation after each pass.
func (w *simWorld) step() {
	for pass := 0; pass < 1000; pass++ {
		progressed := false
		for _, s := range w.agents {
			if s.dead {
				continue
			}
			if s.a.r.tick() {
				progressed = true
			}
			for {
				select {
				case t := <-s.a.r.jobs:
					w.startScatterTask(s, t)
					progressed = true
					continue
				default:
				}
				break
			}
			if err := s.a.r.sched.Check(); err != nil {
				w.violation("%s conservation: %v", s.name, err)
			}
		}
		if !progressed {
			return
		}
	}
	w.violation("reactors did not settle in 1000 passes")
}

// startScatterTask models a worker picking the task up after a queueing
// delay (a busy pool): a cancel in between means it never starts.
func (w *simWorld) startScatterTask(s *simAgent, t *scatterTask) {
	w.at(w.delay(w.f.opDelay), func() {
		if s.dead {
			return
		}
		op, err := t.launch(s.a.set.Scatterer)
		if err != nil {
			if errors.Is(err, transfer.ErrBusy) {
				w.startScatterTask(s, t) // retry later, as a worker does
				return
			}
			t.err = err
			s.a.r.reportScatter(t)
			return
		}
		var poll func()
		poll = func() {
			st, err := op.Poll()
			if !st.Terminal() {
				w.at(100*time.Microsecond, poll)
				return
			}
			_ = op.Release()
			t.err = err
			s.a.r.reportScatter(t)
		}
		poll()
	})
}

// run runs the seed: agents, traffic, faults, then time enough for every
// timeout, expiry and quarantine to pass; then the final checks.
func (w *simWorld) run() {
	nr := 1 + w.rng.IntN(2)
	ns := 2 + w.rng.IntN(4)
	var recvs, sends []*simAgent
	for i := 0; i < nr; i++ {
		recvs = append(recvs, w.addAgent(fmt.Sprintf("r%d", i), true))
	}
	for i := 0; i < ns; i++ {
		sends = append(sends, w.addAgent(fmt.Sprintf("s%d", i), false))
	}
	for _, s := range sends {
		for _, r := range recvs {
			w.connect(s, r)
		}
	}
	w.logf("faults: %v", w.f)
	// Traffic: each sender submits a few requests over the first 60 ms.
	for _, s := range sends {
		for k := 1 + w.rng.IntN(5); k > 0; k-- {
			s, to := s, recvs[w.rng.IntN(nr)]
			w.at(time.Duration(w.rng.IntN(60))*time.Millisecond, func() { w.submit(s, to) })
		}
	}
	if w.f.partition {
		w.stats.partitions++
	}
	if w.f.crashSender {
		victim := sends[w.rng.IntN(ns)]
		w.at(time.Duration(w.rng.IntN(40))*time.Millisecond, func() {
			w.crash(victim)
			if !w.f.restart {
				return
			}
			// It comes back under a new identity and sends again.
			w.at(time.Duration(w.rng.IntN(20))*time.Millisecond, func() {
				w.stats.restarts++
				n := w.addAgent(victim.name+"b", false)
				for _, r := range recvs {
					if !r.dead {
						w.connect(n, r)
						r := r
						w.at(time.Duration(w.rng.IntN(20))*time.Millisecond, func() { w.submit(n, r) })
					}
				}
			})
		})
	}
	if w.f.crashReceiver {
		victim := recvs[w.rng.IntN(nr)]
		w.at(time.Duration(w.rng.IntN(40))*time.Millisecond, func() { w.crash(victim) })
	}
	// Run until quiescence: no event pending, every live sender's batch
	// resolved, every live arena whole.
	limit := w.start.Add(60 * time.Second)
	for len(w.bad) == 0 {
		w.step()
		w.poisonRetired()
		if w.events.Len() == 0 && w.quiescent() {
			break
		}
		if w.clock.t.After(limit) {
			w.violation("not quiescent after %v of simulated time", limit.Sub(w.start))
			break
		}
		// Idle time passes in steps of a tenth of the request timeout,
		// fine enough for timeouts, expiry and quarantine to come due on
		// time within 10%.
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
	w.step()
	w.finalCheck()
}

// quiescent reports whether every live sender's batches resolved and
// every live arena is whole.
func (w *simWorld) quiescent() bool {
	for _, s := range w.agents {
		if s.dead {
			continue
		}
		for _, q := range s.reqs {
			if r, _ := q.b.Retirement(); !r {
				return false
			}
		}
		st := s.a.r.sched.Stats()
		if st.Flows != 0 || st.FreeBytes != st.Capacity || len(s.a.r.reqs) != 0 || len(s.a.r.flowSeen) != 0 {
			return false
		}
	}
	return true
}

// finalCheck: every live sender's batches resolved and truthfully retired;
// successful ones delivered exactly their bytes; no destination byte holds
// anything but zero or its own request's bytes (no cross-talk); every live
// arena is whole again (nothing held, staged or quarantined, no flows).
func (w *simWorld) finalCheck() {
	for _, s := range w.agents {
		if s.dead {
			continue
		}
		for _, q := range s.reqs {
			to := w.byName[q.to]
			retired, quiescent := q.b.Retirement()
			if !retired {
				w.violation("%s request %d to %s never resolved (hang)", s.name, q.b.ID(), q.to)
				continue
			}
			if !quiescent {
				w.violation("%s request %d retired but not quiescent (no engine here leaves ops running)", s.name, q.b.ID())
			}
			ok := q.b.Err() == nil
			if ok {
				w.stats.succeeded++
			} else {
				w.stats.failed++
			}
			if to.dead {
				continue
			}
			for i, d := range q.dst {
				got := to.bytes(d)
				for j, c := range got {
					switch {
					case c == q.want[i][j]:
					case c == 0 && !ok:
					default:
						w.violation("%s request %d desc %d byte %d: %#x, want %#x (succeeded=%v): cross-talk or a lost byte", s.name, q.b.ID(), i, j, c, q.want[i][j], ok)
						return
					}
				}
				if ok {
					w.stats.bytes += d.Len
				}
			}
		}
		st := s.a.r.sched.Stats()
		if st.Flows != 0 || st.HeldBytes != 0 || st.LocalBytes != 0 || st.Quarantined != 0 || st.FreeBytes != st.Capacity {
			w.violation("%s arena not whole at quiescence: %+v", s.name, st)
		}
		if n := len(s.a.r.reqs) + len(s.a.r.flowSeen) + len(s.a.r.tasks) + s.a.r.scatters; n != 0 {
			w.violation("%s tables not empty at quiescence: reqs %d flowSeen %d tasks %d scatters %d", s.name, len(s.a.r.reqs), len(s.a.r.flowSeen), len(s.a.r.tasks), s.a.r.scatters)
		}
	}
	for _, wr := range w.writes {
		if !wr.landed && !wr.lost {
			w.violation("a write from %s to %s is still pending at the end", wr.from, wr.to)
		}
	}
}

func (w *simWorld) close() {
	for _, s := range w.agents {
		if s.a.arena != nil {
			_ = s.a.arena.Close()
		}
	}
}

// poisonRetired poisons the source of every request retired quiescent: a
// gather that still read it would carry the poison to a destination, which
// the final check reports.
func (w *simWorld) poisonRetired() {
	for _, s := range w.agents {
		for _, q := range s.reqs {
			if q.poisoned {
				continue
			}
			if _, quiet := q.b.Retirement(); quiet {
				q.poisoned = true
				for _, d := range q.src {
					b := s.bytes(d)
					for i := range b {
						b[i] = 0xee
					}
				}
			}
		}
	}
}

// --- the simulated control channel ------------------------------------

type simCtrl struct{ s *simAgent }

func (c *simCtrl) Kind() string          { return "sim" }
func (c *simCtrl) LocalEndpoint() string { return "sim://" + c.s.name }
func (c *simCtrl) AddPeer(peer, ep string) error {
	if ep != "sim://"+peer {
		return fmt.Errorf("sim: endpoint %q for %q: %w", ep, peer, transfer.ErrBadEndpoint)
	}
	c.s.peers[peer] = true
	return nil
}
func (c *simCtrl) RemovePeer(peer string) error {
	if !c.s.peers[peer] {
		return transfer.ErrUnknownPeer
	}
	delete(c.s.peers, peer)
	return nil
}
func (c *simCtrl) Recv(time.Duration) (transfer.Message, error) {
	return transfer.Message{}, transfer.ErrTimeout
}
func (c *simCtrl) Close() error { return nil }

func (c *simCtrl) Send(peer string, payload []byte) error {
	w := c.s.w
	if !c.s.peers[peer] {
		return fmt.Errorf("sim: send to %q: %w", peer, transfer.ErrUnknownPeer)
	}
	m, _ := wire.Unmarshal(payload)
	desc := describe(m)
	if w.chance(w.f.sendDrop) {
		w.stats.drops++
		w.logf("%s → %s %s REFUSED (queue full)", c.s.name, peer, desc)
		return fmt.Errorf("sim: send queue to %q full: %w", peer, transfer.ErrBusy)
	}
	if g, ok := m.(*wire.Grant); ok {
		w.checkGrant(c.s, peer, g)
	}
	cut := w.cut(c.s.name, peer)
	w.logf("%s → %s %s%s", c.s.name, peer, desc, map[bool]string{true: " LOST (partition)"}[cut])
	if cut {
		return nil
	}
	from := c.s.name
	msg := transfer.Message{Peer: from, Payload: append([]byte(nil), payload...)}
	w.at(w.delay(w.f.msgDelay), func() {
		to := w.byName[peer]
		if to == nil || to.dead {
			return
		}
		w.logf("%s ← %s %s", peer, from, desc)
		to.a.r.onMessage(msg)
	})
	return nil
}

func describe(m wire.Message) string {
	switch m := m.(type) {
	case *wire.Want:
		if m.IsCancel() {
			return fmt.Sprintf("CANCEL req=%d", m.Request)
		}
		return fmt.Sprintf("WANT req=%d chunks=%d", m.Request, len(m.ChunkBytes))
	case *wire.Grant:
		var offs []string
		for _, c := range m.Credits {
			offs = append(offs, fmt.Sprintf("%d@%#x", c.Chunk, c.Region))
		}
		return fmt.Sprintf("GRANT req=%d %s", m.Request, strings.Join(offs, ","))
	case *wire.Data:
		return fmt.Sprintf("DATA req=%d chunk=%d region=%#x runs=%d", m.Request, m.Chunk, m.Region, len(m.Runs))
	case *wire.Ack:
		return fmt.Sprintf("ACK req=%d chunk=%d region=%#x", m.Request, m.Chunk, m.Region)
	case *wire.Nack:
		return fmt.Sprintf("NACK req=%d code=%d %s", m.Request, m.Code, m.Reason)
	}
	return fmt.Sprintf("%T", m)
}

// checkGrant: a region is never granted while a write may still land in it
// or a scatter still reads it.
func (w *simWorld) checkGrant(r *simAgent, peer string, g *wire.Grant) {
	for _, c := range g.Credits {
		lo, hi := c.Addr, c.Addr+c.Len
		for _, wr := range w.writes {
			if wr.to == r.name && !wr.landed && !wr.lost && wr.dst.Addr < hi && lo < wr.dst.Addr+wr.dst.Len {
				w.violation("%s grants region %#x to %s/%d while a write from %s may still land in it", r.name, c.Region, peer, g.Request, wr.from)
			}
		}
		for _, sc := range w.scatters {
			if sc.s == r && !sc.done && sc.region.Addr < hi && lo < sc.region.Addr+sc.region.Len {
				w.violation("%s grants region %#x to %s/%d while a scatter still reads it", r.name, c.Region, peer, g.Request)
			}
		}
	}
}

// --- the simulated engine -----------------------------------------------

type simEngine struct{ s *simAgent }

func (e *simEngine) Name() string                       { return e.s.name }
func (e *simEngine) RegisterMemory(transfer.Desc) error { return nil }
func (e *simEngine) DeregisterMemory(transfer.Desc) error {
	return nil
}
func (e *simEngine) Metadata() ([]byte, error) { return []byte(e.s.name), nil }
func (e *simEngine) LoadPeer(md []byte) (string, error) {
	return string(md), nil
}
func (e *simEngine) ForgetPeer(peer string) error {
	if e.s.w.f.fence && !e.s.w.f.lieFence {
		// A fence: every write from peer that has not landed never will.
		for _, wr := range e.s.w.writes {
			if wr.from == peer && wr.to == e.s.name && !wr.landed {
				wr.lost = true
			}
		}
	}
	return nil
}
func (e *simEngine) FencesForgottenPeers() bool { return e.s.w.f.fence }
func (e *simEngine) Close() error               { return nil }

// simWrite is one bulk write in flight.
type simWrite struct {
	from, to string
	src, dst transfer.Desc
	data     []byte // the source bytes, read when the write was posted
	landed   bool   // its bytes are in the target
	lost     bool   // its bytes will never land
	st       transfer.Status
	err      error
}

func (o *simWrite) Poll() (transfer.Status, error) { return o.st, o.err }
func (o *simWrite) Release() error                 { return nil }

func (e *simEngine) PostWrite(peer string, ops []transfer.WriteOp) (transfer.Op, error) {
	w := e.s.w
	if len(ops) != 1 {
		return nil, errors.New("sim: one write op at a time")
	}
	op := ops[0]
	src, err := e.s.reg.Slice(op.Src.Addr, op.Src.Len)
	if err != nil {
		return nil, err
	}
	wr := &simWrite{from: e.s.name, to: peer, src: op.Src, dst: op.Dst, data: append([]byte(nil), src...)}
	w.writes = append(w.writes, wr)
	d := w.delay(w.f.opDelay)
	if w.cut(e.s.name, peer) {
		d = w.f.partUntil - w.clock.t.Sub(w.start) + d
	}
	fail := func(err error) { wr.st, wr.err = transfer.Failed, err }
	switch x := w.rng.Float64(); {
	case x < w.f.writeFail:
		w.stats.writeFails++
		wr.lost = true
		w.at(d, func() { fail(errors.New("sim: write failed before any byte moved")) })
	case x < w.f.writeFail+w.f.writeLate:
		// Fails without proof; its bytes land a while later (within the
		// engine contract's bound, half the request timeout).
		w.stats.lateWrites++
		w.at(d, func() { fail(fmt.Errorf("sim: write outcome unknown: %w", transfer.ErrNotQuiescent)) })
		w.at(d+w.delay(simTimeout/2), func() { w.land(wr) })
	case x < w.f.writeFail+w.f.writeLate+w.f.writePeerLost:
		w.stats.peerLost++
		wr.lost = true
		w.at(d, func() { fail(fmt.Errorf("sim: connection to %q reset: %w", peer, transfer.ErrPeerLost)) })
	default:
		w.at(d, func() {
			w.land(wr)
			if wr.landed {
				wr.st = transfer.Done
			} else {
				fail(fmt.Errorf("sim: %q unreachable: %w", peer, transfer.ErrPeerLost))
			}
		})
	}
	dstOff := op.Dst.Addr
	if t := w.byName[peer]; t != nil {
		dstOff -= t.a.arenaD.Addr
	}
	w.logf("%s posts write staging %#x → %s region %#x+%d", e.s.name, op.Src.Addr-e.s.a.arenaD.Addr, peer, dstOff, op.Dst.Len)
	return wr, nil
}

// land moves a write's bytes into its target, checking that they land only
// in a region granted to the writing peer (and not being scattered) or in
// quarantine. A dead target (or a fenced write) takes nothing.
func (w *simWorld) land(wr *simWrite) {
	to := w.byName[wr.to]
	if wr.lost || to == nil || to.dead {
		wr.lost = true
		return
	}
	r := to.a.r
	off := wr.dst.Addr - r.a.arenaD.Addr
	if wr.dst.Addr < r.a.arenaD.Addr || off+wr.dst.Len > r.a.arenaD.Len {
		w.violation("write from %s to %s lands outside the arena at %#x+%d", wr.from, wr.to, wr.dst.Addr, wr.dst.Len)
		return
	}
	g, held := r.sched.Region(off)
	quarantined := slices.ContainsFunc(r.quarantined, func(q quarantined) bool { return q.off == off })
	switch {
	case held && !g.Orphan && !g.Scattering && g.Flow.Peer == wr.from && wr.dst.Len <= g.Block:
	case quarantined:
	default:
		w.violation("write from %s lands in %s's region %#x, which is %s", wr.from, wr.to, off, describeRegion(g, held))
		return
	}
	if !wr.landed && wr.st == transfer.Failed {
		w.stats.lateLanded++
		w.logf("late write from %s lands in %s region %#x (quarantined=%v)", wr.from, wr.to, off, quarantined)
	}
	b, err := to.reg.Slice(wr.dst.Addr, wr.dst.Len)
	if err != nil {
		w.violation("write from %s to %s: %v", wr.from, wr.to, err)
		return
	}
	copy(b, wr.data)
	wr.landed = true
}

func describeRegion(g credit.Region, held bool) string {
	if !held {
		return "free or local staging"
	}
	return fmt.Sprintf("held by %s/%d (scattering=%v orphan=%v)", g.Flow.Peer, g.Flow.Request, g.Scattering, g.Orphan)
}

// --- the simulated copy stages ----------------------------------------

type simStage struct {
	s      *simAgent
	gather bool
}

func (st *simStage) Close() error { return nil }

type simCopy struct {
	s      *simAgent
	region transfer.Desc
	done   bool
	status transfer.Status
	err    error
}

func (o *simCopy) Poll() (transfer.Status, error) { return o.status, o.err }
func (o *simCopy) Release() error                 { return nil }

func (st *simStage) Gather(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	return st.copyOp(region, runs)
}
func (st *simStage) Scatter(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	return st.copyOp(region, runs)
}

func (st *simStage) copyOp(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	s, w := st.s, st.s.w
	if s.copies >= w.f.busy {
		return nil, transfer.ErrBusy
	}
	if _, err := s.reg.Slice(region.Addr, region.Len); err != nil {
		return nil, err
	}
	for _, r := range runs {
		if r.Count == 0 || r.Len == 0 || r.RegionOff+(r.Count-1)*r.RegionStride+r.Len > region.Len {
			return nil, fmt.Errorf("sim: run %+v outside the region", r)
		}
	}
	s.copies++
	o := &simCopy{s: s, region: region}
	if !st.gather {
		w.scatters = append(w.scatters, o)
	}
	fails := !st.gather && w.chance(w.f.scatterFail)
	w.at(w.delay(w.f.opDelay), func() {
		s.copies--
		o.done = true
		if fails {
			w.stats.scatterFails++
			o.status, o.err = transfer.Failed, errors.New("sim: scatter failed")
			return
		}
		for _, r := range runs {
			for i := uint64(0); i < r.Count; i++ {
				a, err := s.reg.Slice(r.Addr+i*r.AddrStride, r.Len)
				if err != nil {
					o.status, o.err = transfer.Failed, err
					return
				}
				rb, err := s.reg.Slice(region.Addr+r.RegionOff+i*r.RegionStride, r.Len)
				if err != nil {
					o.status, o.err = transfer.Failed, err
					return
				}
				if st.gather {
					copy(rb, a)
				} else {
					copy(a, rb)
				}
			}
		}
		o.status = transfer.Done
	})
	return o, nil
}

// TestSim runs many seeds of the deterministic simulation; a failing seed
// prints its transcript and the command that replays it.
func TestSim(t *testing.T) {
	first, n := *simFirst, int64(*simSeeds)
	if n == 0 {
		n = 3000
		if raceBuild {
			n = 250
		}
	}
	if *simSeed >= 0 {
		first, n = *simSeed, 1
	}
	if testing.Short() {
		n = min(n, 200)
	}
	var tot simTotals
	for seed := first; seed < first+n; seed++ {
		w := newSimWorld(seed, &tot, nil)
		w.run()
		w.close()
		tot.seeds++
		if len(w.bad) > 0 || *simSeed >= 0 && testing.Verbose() {
			tail := w.log
			if len(tail) > 400 && *simSeed < 0 {
				tail = tail[len(tail)-400:]
			}
			t.Logf("seed %d transcript (%d lines):\n%s", seed, len(w.log), strings.Join(tail, "\n"))
		}
		if len(w.bad) > 0 {
			t.Fatalf("seed %d: %d violations, first: %s\nreplay: go test ./pipeline -run 'TestSim$' -sim.seed=%d -v", seed, len(w.bad), w.bad[0], seed)
		}
	}
	t.Logf("sim: %d seeds, %d requests (%d succeeded, %d failed), %d bytes delivered; faults: %d refused sends, %d failed writes, %d late writes (%d landed late), %d peer-lost writes, %d failed scatters, %d crashes, %d restarts, %d partitions, %d forgets; 0 violations",
		tot.seeds, tot.requests, tot.succeeded, tot.failed, tot.bytes, tot.drops, tot.writeFails, tot.lateWrites, tot.lateLanded, tot.peerLost, tot.scatterFails, tot.crashes, tot.restarts, tot.partitions, tot.forgets)
}

// TestSimCatchesBrokenFence runs the harness against an engine that claims
// to fence forgotten peers but lets their late writes land: the harness must
// report a write landing outside its grant (so a passing TestSim means
// something).
func TestSimCatchesBrokenFence(t *testing.T) {
	var tot simTotals
	for seed := int64(1); seed <= 3000; seed++ {
		w := newSimWorld(seed, &tot, func(f *simFaults) {
			f.fence, f.lieFence, f.crashSender, f.forgetDead, f.restart = true, true, true, true, true
			f.writeLate, f.crashReceiver = 0.5, false
		})
		w.run()
		w.close()
		for _, b := range w.bad {
			if strings.Contains(b, "lands in") || strings.Contains(b, "may still land") || strings.Contains(b, "cross-talk") {
				t.Logf("seed %d caught: %s", seed, b)
				return
			}
		}
	}
	t.Fatal("no seed caught an engine that lies about fencing")
}
