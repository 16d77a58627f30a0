package pipeline

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

func TestPullInproc(t *testing.T) { pullSuite(t, newWorld) }

func TestPullTCPZMQ(t *testing.T) { pullSuite(t, tcpZMQWorld) }

// pullSuite runs the pull path's byte-exact and refusal tests on one kind
// of world.
func pullSuite(t *testing.T, mk func(testing.TB) *world) {
	t.Run("blocks-byte-exact", func(t *testing.T) { testPullBlocks(t, mk(t)) })
	t.Run("descs-byte-exact", func(t *testing.T) { testPullDescs(t, mk(t)) })
	t.Run("refused-changes-nothing", func(t *testing.T) { testPullRefused(t, mk(t)) })
}

// waitEvent returns the next event on ch, failing the test after 30 s.
func waitEvent(t testing.TB, ch <-chan Received) Received {
	t.Helper()
	select {
	case ev := <-ch:
		return ev
	case <-time.After(30 * time.Second):
		t.Fatal("no Received event within 30s")
	}
	return Received{}
}

// testPullBlocks: b pulls random ids of a's pool into its own, over
// several chunks, and every destination byte is checked (the named pieces
// hold their sources, every other byte is guard); a reports each pull it
// served, quiescent, with the bytes.
func testPullBlocks(t *testing.T, w *world) {
	events := make(chan Received, 8)
	a, b := w.node("a", testConfig(), withReceived(events)), w.node("b", testConfig())
	const blocks, blen = 700, 2048
	src := newKVPool(t, a, "kv", 3, blocks, blen, blen+96, 5)
	dst := newKVPool(t, b, "kv-in", 3, blocks, blen, blen+40, 3)
	connect(t, a, b)
	rng := rand.New(rand.NewPCG(29, 5))
	var total uint64
	for round, n := range []int{1, 600, 333} {
		srcIDs, dstIDs := randomIDs(rng, n, blocks), randomIDs(rng, n, blocks)
		if round == 2 {
			for i := range srcIDs {
				srcIDs[i], dstIDs[i] = uint32(10+i), uint32(300+i)
			}
		}
		src.fillPieces(uint64(round+1), srcIDs)
		bt, err := b.Pull(PullRequest{Peer: "a", Tag: []byte("req"), Blocks: &BlockRequest{SrcPool: "kv", SrcIDs: srcIDs, DstPool: "kv-in", DstIDs: dstIDs}})
		if err != nil {
			t.Fatal(err)
		}
		if err := wait(t, bt); err != nil {
			t.Fatal(err)
		}
		if err := bt.Release(); err != nil {
			t.Fatal(err)
		}
		checkLanded(t, src, dst, srcIDs, dstIDs)
		ev := waitEvent(t, events)
		want := uint64(n) * 3 * blen
		total += want
		if !ev.Pull || ev.Peer != "b" || ev.Err != nil || !ev.Quiescent || ev.Bytes != want || string(ev.Tag) != "req" || ev.Request != bt.ID() {
			t.Fatalf("holder's event %+v, want a quiescent pull by b of %d bytes, request %d", ev, want, bt.ID())
		}
		for i := range dst.buf {
			dst.buf[i] = guardByte
		}
	}
	if st := a.Stats(); st.PullsServed != 3 || st.BounceBytes != total || st.RefusedPulls != 0 {
		t.Fatalf("holder stats: served %d, bounce bytes %d (want %d), refused %d", st.PullsServed, st.BounceBytes, total, st.RefusedPulls)
	}
	if st := b.Stats(); st.Pulls != 3 || st.Wants != 0 || st.Succeeded != 3 {
		t.Fatalf("puller stats: pulls %d, WANTs %d (a pull sends none), succeeded %d", st.Pulls, st.Wants, st.Succeeded)
	}
	settled(t, a, b)
	for n, p := range map[*node]string{a: "kv", b: "kv-in"} {
		if err := n.DeregisterPool(p); err != nil {
			t.Fatalf("%s: deregister pool %s after the pulls: %v", n.Name(), p, err)
		}
	}
}

// testPullDescs pulls a fragmented descriptor list, several at once.
func testPullDescs(t *testing.T, w *world) {
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	layout := kvLayout{count: 512, size: 4096, fragmented: true}
	const n = 3
	var jobs []job
	var batches []*Batch
	for i := range n {
		srcB, dstB := a.buffer(t, 512*4096), b.buffer(t, 512*4096)
		jobs = append(jobs, prepare(srcB, dstB, layout, uint64(40+i)))
	}
	connect(t, a, b)
	for _, j := range jobs {
		bt, err := b.Pull(PullRequest{Peer: "a", Src: j.src, Dst: j.dst})
		if err != nil {
			t.Fatal(err)
		}
		batches = append(batches, bt)
	}
	for i, bt := range batches {
		if err := wait(t, bt); err != nil {
			t.Fatal(err)
		}
		if _, q := bt.Retirement(); !q {
			t.Fatal("a successful pull is not quiescent")
		}
		jobs[i].verify(t)
	}
	settled(t, a, b)
}

// regBuffer allocates host memory on n registered for peers only.
func (n *node) regBuffer(t testing.TB, size uint64, peers ...string) []byte {
	t.Helper()
	bf, err := mem.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.RegisterMemoryFor(bf.Desc(), peers...); err != nil {
		t.Fatal(err)
	}
	n.w.bufs = append(n.w.bufs, bf)
	return bf.Bytes()
}

// testPullRefused: pulls of memory the holder did not register for the
// puller (a pool in memory for another peer, memory for another peer,
// unregistered memory, the holder's arena) are refused with a reason the
// puller's batch names, counted, and change no destination byte; a pull
// the puller can refuse itself never leaves.
func testPullRefused(t *testing.T, w *world) {
	events := make(chan Received, 8)
	a, b := w.node("a", testConfig(), withReceived(events)), w.node("b", testConfig())
	// A pool in memory registered for "c" alone, and one for everyone.
	cbuf := a.regBuffer(t, 64*1024, "c")
	cbase := mem.DescOf(cbuf).Addr
	if err := a.RegisterPool("for-c", transfer.Pool{BlockLen: 1024, Stride: 1024, Blocks: 32, Kind: transfer.Host, Regions: []uint64{cbase, cbase + 32*1024}}); err != nil {
		t.Fatal(err)
	}
	newKVPool(t, a, "kv", 2, 32, 1024, 1024, 1)
	dst := newKVPool(t, b, "kv-in", 2, 32, 1024, 1024, 7)
	dbuf := b.buffer(t, 8192)
	for i := range dbuf {
		dbuf[i] = guardByte
	}
	other := a.regBuffer(t, 8192, "c")
	unreg, err := mem.Alloc(8192)
	if err != nil {
		t.Fatal(err)
	}
	defer unreg.Free()
	connect(t, a, b)
	ddesc := transfer.Desc{Addr: mem.DescOf(dbuf).Addr, Len: 4096, Kind: transfer.Host}
	arena := a.Arena()
	cases := []struct {
		name string
		req  PullRequest
		want string
	}{
		{"pool for another peer", PullRequest{Blocks: &BlockRequest{SrcPool: "for-c", SrcIDs: []uint32{0, 1}, DstPool: "kv-in", DstIDs: []uint32{0, 1}}}, `pool "for-c" is not registered for "b"`},
		{"src id out of range", PullRequest{Blocks: &BlockRequest{SrcPool: "kv", SrcIDs: []uint32{0, 99}, DstPool: "kv-in", DstIDs: []uint32{0, 1}}}, ""},
		{"memory for another peer", PullRequest{Src: []transfer.Desc{{Addr: mem.DescOf(other).Addr, Len: 4096, Kind: transfer.Host}}, Dst: []transfer.Desc{ddesc}}, `registered for [c], not "b"`},
		{"unregistered memory", PullRequest{Src: []transfer.Desc{{Addr: unreg.Desc().Addr, Len: 4096, Kind: transfer.Host}}, Dst: []transfer.Desc{ddesc}}, "not memory registered with the holder"},
		{"the holder's arena", PullRequest{Src: []transfer.Desc{{Addr: arena.Addr, Len: 4096, Kind: arena.Kind}}, Dst: []transfer.Desc{ddesc}}, "not memory registered with the holder"},
	}
	refused := uint64(0)
	for _, c := range cases {
		c.req.Peer = "a"
		bt, err := b.Pull(c.req)
		if c.want == "" { // refused by the puller itself, before anything leaves
			if err == nil || !strings.Contains(err.Error(), "not below") {
				t.Fatalf("%s: Pull = %v, want a refusal naming the id", c.name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		err = wait(t, bt)
		if !errors.Is(err, ErrRefused) || !errors.Is(err, transfer.ErrForbidden) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: batch error %v, want a refusal (forbidden) saying %q", c.name, err, c.want)
		}
		if _, q := bt.Retirement(); !q {
			t.Fatalf("%s: a refused pull is not quiescent", c.name)
		}
		if err := bt.Release(); err != nil {
			t.Fatal(err)
		}
		refused++
		if got := a.Stats().RefusedPulls; got != refused {
			t.Fatalf("%s: holder counted %d refused pulls, want %d", c.name, got, refused)
		}
	}
	for i, c := range dst.buf {
		if c != guardByte {
			t.Fatalf("destination pool byte %d changed (%#x) though every pull was refused", i, c)
		}
	}
	for i, c := range dbuf {
		if c != guardByte {
			t.Fatalf("destination byte %d changed (%#x) though every pull was refused", i, c)
		}
	}
	select {
	case ev := <-events:
		t.Fatalf("the holder reported a refused pull as served: %+v", ev)
	default:
	}
	settled(t, a, b)
}

// TestPullIncompatiblePeer: a peer that speaks another wire version (its
// handshake says 4) is not pulled from: Pull refuses at once, naming the
// versions, and nothing is sent.
func TestPullIncompatiblePeer(t *testing.T) {
	w := newWorld(t)
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	blob, err := a.Descriptor()
	if err != nil {
		t.Fatal(err)
	}
	d, err := wire.UnmarshalAgentDesc(blob)
	if err != nil {
		t.Fatal(err)
	}
	d.Handshake.Version = 4
	if _, err := b.LoadPeer(wire.MarshalAgentDesc(d)); err != nil {
		t.Fatal(err)
	}
	buf := b.buffer(t, 4096)
	_, err = b.Pull(PullRequest{Peer: "a", Src: []transfer.Desc{{Addr: 0x1000, Len: 4096}}, Dst: []transfer.Desc{mem.DescOf(buf)}})
	if !errors.Is(err, ErrBounceUnavailable) || !strings.Contains(err.Error(), fmt.Sprintf("wire version %d here vs 4", wire.Version)) {
		t.Fatalf("pull from a v4 peer: %v, want ErrBounceUnavailable naming the versions", err)
	}
	if st := b.Stats(); st.Pulls != 0 || st.SendDrops != 0 {
		t.Fatalf("a refused pull was counted or sent: %+v", st)
	}
	// A descriptor encoded by a v4 codec does not load at all, saying why.
	v4 := append([]byte(nil), blob...)
	v4[4] = 4
	if _, err := b.LoadPeer(v4); !errors.Is(err, wire.ErrBadVersion) || !strings.Contains(err.Error(), "version 4") {
		t.Fatalf("loading a v4 descriptor: %v", err)
	}
}

// recordingCtrl records the type of every control message its node sends.
type recordingCtrl struct {
	transfer.ControlChannel
	mu   sync.Mutex
	sent []wire.Type
}

func (c *recordingCtrl) Send(peer string, b []byte) error {
	if t, err := wire.PeekType(b); err == nil {
		c.mu.Lock()
		c.sent = append(c.sent, t)
		c.mu.Unlock()
	}
	return c.ControlChannel.Send(peer, b)
}

func (c *recordingCtrl) types() []wire.Type {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.sent)
}

func withRecording(rc **recordingCtrl) nodeOpt {
	return func(s *Settings) {
		c := &recordingCtrl{ControlChannel: s.Control}
		s.Control = c
		*rc = c
	}
}

// TestPullGrantTravelsWithRequest: a one-chunk pull costs the puller a
// PULL (carrying the grant) and an ACK, the holder one DATA (one STAGED
// when the puller reads): no WANT, no GRANT, one round trip fewer than a
// push.
func TestPullGrantTravelsWithRequest(t *testing.T) {
	for _, pr := range []PullRead{PullReadOff, PullReadAuto} {
		t.Run(pr.String(), func(t *testing.T) { testPullGrantTravels(t, pr) })
	}
}

func testPullGrantTravels(t *testing.T, pr PullRead) {
	w := newWorld(t)
	var ra, rb *recordingCtrl
	bcfg := testConfig()
	bcfg.PullRead = pr
	a, b := w.node("a", testConfig(), withRecording(&ra)), w.node("b", bcfg, withRecording(&rb))
	j := simple(t, a, b, 3) // 256 × 4 KiB: one 1 MiB chunk
	connect(t, a, b)
	bt, err := b.Pull(PullRequest{Peer: "a", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	j.verify(t)
	eventually(t, func() bool { return len(rb.types()) == 2 })
	if got, want := rb.types(), []wire.Type{wire.TypePull, wire.TypeAck}; !slices.Equal(got, want) {
		t.Fatalf("puller sent %v, want %v", got, want)
	}
	holder := []wire.Type{wire.TypeData}
	if pr == PullReadAuto { // loopback engines read
		holder = []wire.Type{wire.TypeStaged}
	}
	if got, want := ra.types(), holder; !slices.Equal(got, want) {
		t.Fatalf("holder sent %v, want %v", got, want)
	}
	settled(t, a, b)
}

// TestPullProperty: any pull of distinct destination ids (any count, any
// source ids, repeats allowed) lands exactly its pieces and nothing else,
// and leaves both arenas whole.
func TestPullProperty(t *testing.T) {
	w := newWorld(t)
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	const blocks, blen = 300, 1536
	src := newKVPool(t, a, "kv", 2, blocks, blen, blen+24, 7)
	dst := newKVPool(t, b, "kv-in", 2, blocks, blen, blen+8, 1)
	connect(t, a, b)
	src.fillPieces(5, func() []uint32 {
		ids := make([]uint32, blocks)
		for i := range ids {
			ids[i] = uint32(i)
		}
		return ids
	}())
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, blocks).Draw(rt, "n")
		dstIDs := rapid.Permutation(func() []uint32 {
			ids := make([]uint32, blocks)
			for i := range ids {
				ids[i] = uint32(i)
			}
			return ids
		}()).Draw(rt, "dst")[:n]
		srcIDs := rapid.SliceOfN(rapid.Uint32Range(0, blocks-1), n, n).Draw(rt, "src")
		for i := range dst.buf {
			dst.buf[i] = guardByte
		}
		bt, err := b.Pull(PullRequest{Peer: "a", Blocks: &BlockRequest{SrcPool: "kv", SrcIDs: srcIDs, DstPool: "kv-in", DstIDs: dstIDs}})
		if err != nil {
			rt.Fatal(err)
		}
		if err := wait(t, bt); err != nil {
			rt.Fatal(err)
		}
		checkLanded(t, src, dst, srcIDs, dstIDs)
		if err := bt.Release(); err != nil {
			rt.Fatal(err)
		}
	})
	settled(t, a, b)
}

// tamperedCtrl is a control channel whose outgoing messages tamper may
// rewrite (fault injection: a hostile or broken holder).
type tamperedCtrl struct {
	transfer.ControlChannel
	tamper func(wire.Message) wire.Message
}

func (c *tamperedCtrl) Send(peer string, payload []byte) error {
	if m, err := wire.Unmarshal(payload); err == nil {
		if m = c.tamper(m); m != nil {
			var err error
			if payload, err = wire.Marshal(m); err != nil {
				return err
			}
		}
	}
	return c.ControlChannel.Send(peer, payload)
}

// TestPullRefusesHolderData: where a pull's bytes land is the puller's
// business (its own plan): a holder whose DATA (written or STAGED) carries
// scatter runs — here into other memory the puller registered for it —,
// names another piece range (inside the request or not) or a chunk the
// pull does not have is refused with a NACK, the pull fails with
// ErrRefused and no byte of the puller's memory changes; descriptor and
// block pulls alike.
func TestPullRefusesHolderData(t *testing.T) {
	for _, form := range []string{"descs", "blocks"} {
		for _, read := range []PullRead{PullReadAuto, PullReadOff} {
			for _, c := range []struct {
				name string
				bad  func(d *wire.Data, victim transfer.Desc)
			}{
				{"runs", func(d *wire.Data, v transfer.Desc) {
					d.Pieces = wire.PieceRange{}
					d.Runs = []transfer.Run{{Addr: v.Addr, Len: 4096, Count: 1}}
				}},
				{"pieces", func(d *wire.Data, _ transfer.Desc) { d.Pieces.First++ }},
				{"fewer-pieces", func(d *wire.Data, _ transfer.Desc) { d.Pieces.Count-- }},
				{"chunk", func(d *wire.Data, _ transfer.Desc) { d.Chunk++ }},
			} {
				t.Run(form+"-"+read.String()+"-"+c.name, func(t *testing.T) {
					testPullRefusesHolderData(t, form, read, c.bad)
				})
			}
		}
	}
}

func testPullRefusesHolderData(t *testing.T, form string, read PullRead, bad func(*wire.Data, transfer.Desc)) {
	w := newWorld(t)
	var victim transfer.Desc
	tamper := func(s *Settings) {
		s.Control = &tamperedCtrl{ControlChannel: s.Control, tamper: func(m wire.Message) wire.Message {
			switch m := m.(type) {
			case *wire.Data:
				if wire.IsPullID(m.Request) {
					bad(m, victim)
					return m
				}
			case *wire.Staged:
				bad(&m.Data, victim)
				return m
			}
			return nil
		}}
	}
	cfg := testConfig()
	cfg.PullRead = read
	a, b := w.node("a", testConfig(), tamper), w.node("b", cfg)
	other := b.buffer(t, 4096)
	victim = mem.DescOf(other)
	var dstB []byte
	var req PullRequest
	if form == "blocks" {
		src := newKVPool(t, a, "kv", 2, 16, 2048, 2048, 0)
		dst := newKVPool(t, b, "kv-in", 2, 16, 2048, 2048, 0)
		src.fillPieces(7, []uint32{0, 1, 2, 3, 4, 5, 6, 7})
		dstB = dst.buf
		// Ids 4..11 of the destination: a range shifted by one still lies
		// in the request (the holder could pick other blocks of it).
		req.Blocks = &BlockRequest{SrcPool: "kv", SrcIDs: []uint32{0, 1, 2, 3, 4, 5, 6, 7}, DstPool: "kv-in", DstIDs: []uint32{4, 5, 6, 7, 8, 9, 10, 11}}
	} else {
		srcB := a.buffer(t, 16*4096)
		dstB = b.buffer(t, 16*4096)
		j := prepare(srcB, dstB, kvLayout{count: 16, size: 4096, fragmented: true}, 7)
		req.Src, req.Dst = j.src, j.dst
	}
	before := bytes.Clone(dstB)
	connect(t, a, b)
	req.Peer = "a"
	bt, err := b.Pull(req)
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); !errors.Is(err, ErrRefused) {
		t.Fatalf("pull err = %v, want ErrRefused", err)
	}
	if _, q := bt.Retirement(); !q {
		t.Fatal("the refused pull is not quiescent")
	}
	if !bytes.Equal(dstB, before) || !bytes.Equal(other, make([]byte, len(other))) {
		t.Fatal("a refused DATA changed the puller's memory")
	}
	if st := b.Stats(); st.BadRuns != 1 {
		t.Fatalf("puller counted %d bad DATAs, want 1", st.BadRuns)
	}
	settled(t, a, b)
}

// TestPullSkipsEmptyPairs: a descriptor pull with zero-length pairs among
// its descriptors moves the others byte-exact, as a push does (the PULL
// leaves the empty ones out; they are no piece of either plan); one of
// only empty pairs succeeds at once.
func TestPullSkipsEmptyPairs(t *testing.T) {
	w := newWorld(t)
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	srcB, dstB := a.buffer(t, 64*4096), b.buffer(t, 64*4096)
	j := prepare(srcB, dstB, kvLayout{count: 64, size: 4096, fragmented: true}, 11)
	var src, dst []transfer.Desc
	for i := range j.src {
		if i%5 == 0 { // an empty pair before every fifth
			src, dst = append(src, transfer.Desc{Addr: j.src[i].Addr, Kind: transfer.Host}), append(dst, transfer.Desc{Addr: j.dst[i].Addr, Kind: transfer.Host})
		}
		src, dst = append(src, j.src[i]), append(dst, j.dst[i])
	}
	connect(t, a, b)
	for _, req := range []PullRequest{{Peer: "a", Src: src, Dst: dst}, {Peer: "a", Src: src[:1], Dst: dst[:1]}} {
		bt, err := b.Pull(req)
		if err != nil {
			t.Fatal(err)
		}
		if err := wait(t, bt); err != nil {
			t.Fatalf("pull of %d pairs: %v", len(req.Src), err)
		}
	}
	j.verify(t)
	settled(t, a, b)
}
