package tcp

import (
	"bytes"
	"errors"
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
