package tcp

import (
	"bytes"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

var _ transfer.WriteStaller = (*Engine)(nil)

// stalledWatch is how long a stalled write is watched for bytes: long
// enough that a write the stall does not hold lands within it (a 1 MiB
// write over loopback takes milliseconds), short enough to keep the test
// quick. It bounds nothing the engine does.
const stalledWatch = 200 * time.Millisecond

// TestStallWritesHoldsUntilReleased: while stalled, a write — posted
// before its connection exists and posted on a warm one — stays pending
// and lands nothing; nested stalls hold until both are released (release
// is idempotent); then both writes land byte-exact.
func TestStallWritesHoldsUntilReleased(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	const size = 1 << 20
	src := v.buf(2*size, 7, a)
	dst := v.buf(2*size, 0, b)
	connect(t, a, b)

	outer, err := a.StallWrites()
	if err != nil {
		t.Fatal(err)
	}
	cold, err := a.PostWrite("b", []transfer.WriteOp{{Src: sub(src, 0, size), Dst: sub(dst, 0, size)}})
	if err != nil {
		t.Fatal(err)
	}
	inner, _ := a.StallWrites()
	warm, err := a.PostWrite("b", []transfer.WriteOp{{Src: sub(src, size, size), Dst: sub(dst, size, size)}})
	if err != nil {
		t.Fatal(err)
	}
	held := func(when string) {
		t.Helper()
		time.Sleep(stalledWatch)
		for i, op := range []transfer.Op{cold, warm} {
			if st, err := op.Poll(); st != transfer.Pending {
				t.Fatalf("%s: write %d polled %v, %v; want pending while stalled", when, i, st, err)
			}
		}
		if k := firstChange(dst.Bytes(), make([]byte, 2*size)); k >= 0 {
			t.Fatalf("%s: destination byte %d changed while stalled", when, k)
		}
	}
	held("stalled twice")
	inner()
	inner() // idempotent: the outer stall still holds
	held("one of two stalls released")
	outer()
	mustDone(t, cold, nil)
	mustDone(t, warm, nil)
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("destination differs from the source once released")
	}
	// The gate is open again: a later write goes through unheld.
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: sub(src, 0, 4097), Dst: sub(dst, 0, 4097)}})
	mustDone(t, op, err)
}

// TestStallWritesForgetFailsHeld: ForgetPeer fails a stalled write with
// ErrPeerLost (nothing of it went out, so it is quiescent), and nothing
// lands when the stall ends.
func TestStallWritesForgetFailsHeld(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	const size = 1 << 20
	src := v.buf(size, 9, a)
	dst := v.buf(size, 0, b)
	connect(t, a, b)
	release, _ := a.StallWrites()
	defer release()
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.ForgetPeer("b"); err != nil {
		t.Fatal(err)
	}
	werr := mustFail(t, op, transfer.ErrPeerLost)
	if k := firstChange(dst.Bytes(), make([]byte, size)); k >= 0 {
		t.Fatalf("destination byte %d changed by a write failed while held (%v)", k, werr)
	}
	release()
	time.Sleep(stalledWatch)
	if k := firstChange(dst.Bytes(), make([]byte, size)); k >= 0 {
		t.Fatalf("destination byte %d changed after the stall ended; the write had failed with %v", k, werr)
	}
}
