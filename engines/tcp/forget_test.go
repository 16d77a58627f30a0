package tcp

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// watchSettle is how long the target-side forget tests watch memory after
// ForgetPeer returned for bytes that must no longer land.
const watchSettle = 300 * time.Millisecond

// TestTargetForgetCutsConnectionsInSetup is the reported case: one of four
// striped connections is warm, a 64 MiB write is posted (three of its four
// parts still dialing or in HELLO) and B forgets A at once. Once ForgetPeer
// returned, B's memory must not change any more.
func TestTargetForgetCutsConnectionsInSetup(t *testing.T) {
	const size = 64 << 20
	for try := range 3 {
		v := newEnv(t)
		a, b := v.engine("a"), v.engine("b")
		src := v.buf(size, uint64(try+1), a)
		dst := v.buf(size, 0, b)
		connect(t, a, b)
		connect(t, b, a)
		// Warm one connection only: a single-part write uses one slot.
		op, err := a.PostWrite("b", []transfer.WriteOp{{Src: sub(src, 0, 64), Dst: sub(dst, 0, 64)}})
		mustDone(t, op, err)
		clear(dst.Bytes()[:64])

		op, err = a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.ForgetPeer("a"); err != nil {
			t.Fatal(err)
		}
		snap := bytes.Clone(dst.Bytes())
		st, _ := wait(t, op)
		time.Sleep(watchSettle)
		if k := firstChange(dst.Bytes(), snap); k >= 0 {
			t.Fatalf("try %d: destination byte %d changed after B.ForgetPeer(a) returned (%d bytes in all; the write ended %v)",
				try, k, countChanged(dst.Bytes(), snap), st)
		}
	}
}

// TestTargetForgetRefusesLaterWrites: a write A posts after B forgot it
// fails and lands nothing, until B loads A again.
func TestTargetForgetRefusesLaterWrites(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	src := v.buf(1<<20, 3, a)
	dst := v.buf(1<<20, 0, b)
	connect(t, a, b)
	connect(t, b, a)
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: sub(src, 0, 4096), Dst: sub(dst, 0, 4096)}})
	mustDone(t, op, err)
	clear(dst.Bytes())
	if err := b.ForgetPeer("a"); err != nil {
		t.Fatal(err)
	}
	// Several posts: the first may meet the connection B just cut, the
	// later ones a fresh connection B must refuse.
	for i := range 4 {
		op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
		if err != nil {
			if !errors.Is(err, transfer.ErrPeerLost) {
				t.Fatalf("post %d after B forgot A: %v; want ErrPeerLost", i, err)
			}
			continue
		}
		mustFail(t, op, transfer.ErrPeerLost)
	}
	time.Sleep(watchSettle)
	if n := countChanged(dst.Bytes(), make([]byte, len(dst.Bytes()))); n > 0 {
		t.Fatalf("%d bytes landed from writes A posted after B forgot it", n)
	}
	// A is refused until B loads it again.
	connect(t, b, a)
	op, err = a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	mustDone(t, op, err)
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("after B loaded A again, the write did not land")
	}
}

// TestTargetForgetRefusesConnectionInHello drives the race by hand: a
// connection of the peer is accepted but has not sent HELLO yet when B
// forgets the peer. Its HELLO and WRITE must land nothing.
func TestTargetForgetRefusesConnectionInHello(t *testing.T) {
	v := newEnv(t)
	b := v.engine("b")
	dst := v.buf(64<<10, 0, b)
	warm := dialRaw(t, b)
	warm.send(helloFrame("slow"))
	eventually(t, "b learns slow", func() bool { _, err := b.peer("slow"); return err == nil })
	late := dialRaw(t, b)
	eventually(t, "b accepts the second connection", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.incoming) == 2
	})
	if err := b.ForgetPeer("slow"); err != nil {
		t.Fatal(err)
	}
	late.send(helloFrame("slow"), writeFrameBytes(1, []segment{{dst.Desc().Addr, 4096}}), bytes.Repeat([]byte{7}, 4096))
	late.expectClosed("connection of a forgotten peer")
	if n := countChanged(dst.Bytes(), make([]byte, len(dst.Bytes()))); n > 0 {
		t.Fatalf("%d bytes landed from a connection of the forgotten peer", n)
	}
	if _, err := b.peer("slow"); err == nil {
		t.Fatal("the refused HELLO made the forgotten peer known again")
	}
}

func firstChange(got, want []byte) int {
	for i := range got {
		if got[i] != want[i] {
			return i
		}
	}
	return -1
}

func countChanged(got, want []byte) int {
	n := 0
	for i := range got {
		if got[i] != want[i] {
			n++
		}
	}
	return n
}

// TestSourceForgetLandsNothingAfterFailure is the defect CI found: A
// forgets B with large writes in flight; once a write reports a failure
// that does not wrap ErrNotQuiescent, none of its bytes may land at B any
// more. A reset alone does not prove that — B's kernel still holds bytes
// it received, and B's reader copies them into memory after A gave up.
func TestSourceForgetLandsNothingAfterFailure(t *testing.T) {
	const size = 32 << 20
	for try := range 5 {
		v := newEnv(t)
		a, b := v.engine("a"), v.engine("b")
		src := v.buf(size, uint64(try+1), a)
		dst := v.buf(size, 0, b)
		connect(t, a, b)
		// Warm every connection, so the big write streams at once.
		op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
		mustDone(t, op, err)
		clear(dst.Bytes())

		op, err = a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(try) * time.Millisecond)
		if err := a.ForgetPeer("b"); err != nil {
			t.Fatal(err)
		}
		st, werr := wait(t, op)
		snap := bytes.Clone(dst.Bytes())
		time.Sleep(watchSettle)
		if st == transfer.Failed && !errors.Is(werr, transfer.ErrPeerLost) {
			t.Fatalf("try %d: write failed with %v; want ErrPeerLost", try, werr)
		}
		// B is alive and reading: the fence must prove quiescence.
		if errors.Is(werr, transfer.ErrNotQuiescent) {
			t.Fatalf("try %d: write failed non-quiescent with a live peer: %v", try, werr)
		}
		if k := firstChange(dst.Bytes(), snap); k >= 0 {
			t.Fatalf("try %d: destination byte %d changed after the write ended %v (%v); %d bytes in all",
				try, k, st, werr, countChanged(dst.Bytes(), snap))
		}
		_ = op.Release()
	}
}

// fakeClock is the fence's clock in tests: it moves only when told to.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// refusesHello reports whether e refuses a HELLO naming name (a raw
// connection whose HELLO and WRITE land nothing and that e closes), as a
// forgotten peer's late connection would be.
func refusesHello(t *testing.T, e *Engine, name string, dst transfer.Desc) bool {
	t.Helper()
	c := dialRaw(t, e)
	c.send(helloFrame(name), writeFrameBytes(1, []segment{{dst.Addr, 64}}), bytes.Repeat([]byte{9}, 64))
	c.conn.SetReadDeadline(time.Now().Add(hangGuard))
	h, body := c.readFrame()
	switch h.typ {
	case frameAck:
		c.conn.Close()
		return false
	case frameNack:
		c.expectClosed("connection of a forgotten peer")
		return true
	}
	t.Fatalf("reply to %q: frame type %d (%q)", name, h.typ, body)
	return false
}

// TestForgottenFenceBounded: the fence refusing forgotten peers is bounded
// (it grew by one name per ForgetPeer forever): it holds at most
// MaxForgotten names, dropping the oldest first and counting it, and a
// name only for FenceHold; a recently forgotten peer is refused all along.
func TestForgottenFenceBounded(t *testing.T) {
	const max = 8
	v := newEnv(t)
	clk := &fakeClock{now: time.Unix(1e9, 0)}
	b := v.engine("b", func(c *Config) { c.MaxForgotten = max; c.FenceHold = time.Minute })
	b.mu.Lock()
	b.now = clk.Now
	b.mu.Unlock()
	dst := v.buf(4096, 0, b)
	// 1,000 peers, each connected and then forgotten, a second apart.
	const n = 1000
	for i := range n {
		name := fmt.Sprintf("p%d", i)
		c := dialRaw(t, b)
		c.send(helloFrame(name))
		eventually(t, "b learns "+name, func() bool { _, err := b.peer(name); return err == nil })
		if err := b.ForgetPeer(name); err != nil {
			t.Fatal(err)
		}
		c.expectClosed("a forgotten peer's connection")
		clk.Add(time.Second)
		if st := b.Stats(); st.Fenced > max {
			t.Fatalf("after %d forgets the fence holds %d names; the cap is %d", i+1, st.Fenced, max)
		}
	}
	st := b.Stats()
	if st.Fenced != max || st.FenceEvictions != n-max {
		t.Fatalf("fence holds %d names, %d evicted; want %d and %d", st.Fenced, st.FenceEvictions, max, n-max)
	}
	// The most recently forgotten are still refused; the oldest, pushed
	// out by the cap, is admitted again.
	for i := n - max; i < n; i++ {
		if !refusesHello(t, b, fmt.Sprintf("p%d", i), dst.Desc()) {
			t.Fatalf("p%d, forgotten %d s ago, was admitted", i, n-i)
		}
	}
	if refusesHello(t, b, "p0", dst.Desc()) {
		t.Fatal("p0, evicted from the fence by the cap, is still refused")
	}
	if n := countChanged(dst.Bytes(), make([]byte, len(dst.Bytes()))); n != 64 {
		t.Fatalf("%d bytes landed; want the 64 of p0's write only", n)
	}
	// Within its hold a name stays refused; once the hold passed it is
	// dropped without any other forget.
	if err := b.ForgetPeer("late"); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("forget of a never-seen name: %v; want ErrUnknownPeer", err)
	}
	clk.Add(time.Minute - time.Second)
	if !refusesHello(t, b, "late", dst.Desc()) {
		t.Fatal("late was admitted within its hold")
	}
	clk.Add(time.Second)
	if st := b.Stats(); st.Fenced != 0 {
		t.Fatalf("every hold ended, but the fence holds %d names", st.Fenced)
	}
	if refusesHello(t, b, "late", dst.Desc()) {
		t.Fatal("late is still refused after its hold")
	}
}

// TestFenceHoldRestartsOnForget: forgetting a held name again restarts its
// hold; LoadPeer lifts it at once.
func TestFenceHoldRestartsOnForget(t *testing.T) {
	v := newEnv(t)
	clk := &fakeClock{now: time.Unix(1e9, 0)}
	a := v.engine("a")
	b := v.engine("b", func(c *Config) { c.FenceHold = time.Minute })
	b.mu.Lock()
	b.now = clk.Now
	b.mu.Unlock()
	dst := v.buf(4096, 0, b)
	_ = b.ForgetPeer("x")
	clk.Add(50 * time.Second)
	_ = b.ForgetPeer("x")
	clk.Add(50 * time.Second)
	if !refusesHello(t, b, "x", dst.Desc()) {
		t.Fatal("x, forgotten again 50 s ago (hold 1 min), was admitted")
	}
	_ = b.ForgetPeer("a")
	connect(t, b, a)
	if refusesHello(t, b, "a", dst.Desc()) {
		t.Fatal("a is refused after b loaded it again")
	}
}

// TestStripedOpKeepsNotQuiescent: a write striped over several connections
// fails part by part; when one part fails quiescent first (a connection the
// peer closed, a part never sent) and another later without proof, the op
// must say ErrNotQuiescent — its first error alone would let the caller
// reuse memory the unproven part may still write.
func TestStripedOpKeepsNotQuiescent(t *testing.T) {
	v := newEnv(t)
	a := v.engine("a")
	for _, order := range [][]error{
		{transfer.ErrPeerLost, fmt.Errorf("lost: %w (%w)", transfer.ErrPeerLost, transfer.ErrNotQuiescent)},
		{fmt.Errorf("lost: %w (%w)", transfer.ErrPeerLost, transfer.ErrNotQuiescent), transfer.ErrPeerLost},
		{nil, transfer.ErrPeerLost, fmt.Errorf("lost: %w (%w)", transfer.ErrPeerLost, transfer.ErrNotQuiescent)},
	} {
		o := newWriteOp(a, "b", len(order), nil)
		for _, err := range order {
			o.partDone(err)
		}
		st, err := o.Poll()
		if st != transfer.Failed || !errors.Is(err, transfer.ErrNotQuiescent) || !errors.Is(err, transfer.ErrPeerLost) {
			t.Fatalf("parts %v: op %v, %v; want failed wrapping ErrPeerLost and ErrNotQuiescent", order, st, err)
		}
	}
}

// TestCloseFencesPeersTogether: peers that accept our connections but never
// read or close (a hung receiver) each cost a full FenceTimeout to give up.
// Close stops every peer first and waits for them together, so it returns
// after about one FenceTimeout, not one per peer, and their writes fail
// non-quiescent (nothing proved the receivers stopped).
func TestCloseFencesPeersTogether(t *testing.T) {
	const peers, fence = 5, 2 * time.Second
	v := newEnv(t)
	a := v.engine("a", func(c *Config) { c.FenceTimeout = fence })
	src := v.buf(8<<20, 1, a)
	var ops []transfer.Op
	for i := range peers {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var held []net.Conn // accepted, never read, closed at the end
		var mu sync.Mutex
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				held = append(held, c)
				mu.Unlock()
			}
		}()
		t.Cleanup(func() {
			ln.Close()
			mu.Lock()
			for _, c := range held {
				c.Close()
			}
			mu.Unlock()
		})
		name := fmt.Sprintf("hung-%d", i)
		md := encodeMetadata(metadata{name: name, addr: ln.Addr().String(), ranges: []transfer.Desc{{Addr: 1 << 40, Len: 8 << 20}}})
		if _, err := a.LoadPeer(md); err != nil {
			t.Fatal(err)
		}
		op, err := a.PostWrite(name, []transfer.WriteOp{{Src: src.Desc(), Dst: transfer.Desc{Addr: 1 << 40, Len: 8 << 20}}})
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	time.Sleep(200 * time.Millisecond) // the writes fill the hung peers' buffers
	start := time.Now()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	for i, op := range ops {
		st, err := wait(t, op)
		if st != transfer.Failed || !errors.Is(err, transfer.ErrNotQuiescent) {
			t.Fatalf("write %d to a hung peer after Close: %v, %v; want failed wrapping ErrNotQuiescent", i, st, err)
		}
	}
	// One peer at a time would take at least peers × fence (10 s).
	if took >= (peers-1)*fence {
		t.Fatalf("Close took %v with %d hung peers: it waited for their fences one by one (FenceTimeout %v)", took, peers, fence)
	}
	t.Logf("Close with %d hung peers took %v (FenceTimeout %v)", peers, took, fence)
}

// TestForgetAdmitsNewIncarnation: a sender B only learned dies (its
// engine closed, as kill -9 leaves it) and B forgets it after the loss
// report, as the agent's fence does. The sender restarted under the same
// name (a new engine: a new incarnation) is admitted at once and its
// write lands; a connection naming the old incarnation is still refused
// for the hold and lands nothing.
func TestForgetAdmitsNewIncarnation(t *testing.T) {
	v := newEnv(t)
	b := v.engine("b")
	var lost sync.WaitGroup
	lost.Add(1)
	var once sync.Once
	b.SetPeerLost(func(peer string) {
		if peer == "a" {
			once.Do(lost.Done)
		}
	})
	dst := v.buf(1<<20, 0, b)
	a := v.engine("a")
	src := v.buf(1<<20, 5, a)
	connect(t, a, b)
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: sub(src, 0, 4096), Dst: sub(dst, 0, 4096)}})
	mustDone(t, op, err)
	oldInc := a.inc
	a.Close()
	lost.Wait()
	if err := b.ForgetPeer("a"); err != nil && !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatal(err)
	}
	clear(dst.Bytes())
	// The old incarnation is refused.
	old := dialRaw(t, b)
	old.send(encodeFrame(frameHello, 0, encodeMetadata(metadata{name: "a", addr: "127.0.0.1:9", inc: oldInc})),
		writeFrameBytes(1, []segment{{dst.Desc().Addr, 4096}}), bytes.Repeat([]byte{7}, 4096))
	old.expectClosed("connection of the fenced incarnation")
	// The new one is served.
	a2 := v.engine("a")
	if a2.inc == oldInc {
		t.Fatal("the restarted engine has the old incarnation")
	}
	src2 := v.buf(1<<20, 6, a2)
	connect(t, a2, b)
	op, err = a2.PostWrite("b", []transfer.WriteOp{{Src: src2.Desc(), Dst: dst.Desc()}})
	mustDone(t, op, err)
	if !bytes.Equal(dst.Bytes(), src2.Bytes()) {
		t.Fatal("the new incarnation's write did not land")
	}
	// A HELLO with no incarnation (an older peer) is refused like the old one.
	anon := dialRaw(t, b)
	if err := b.ForgetPeer("a"); err != nil {
		t.Fatal(err)
	}
	anon.send(helloFrame("a"))
	anon.expectClosed("connection of a fenced peer without an incarnation")
}
