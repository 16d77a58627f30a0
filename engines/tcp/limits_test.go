package tcp

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/bouncekv/bounce/internal/childproc"
	"github.com/bouncekv/bounce/transfer"
)

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// floodCase runs the flood child with conns connections against an
// engine with small caps and returns it with the growth of this process's
// descriptors and heap while the child holds its connections.
func floodCase(t *testing.T, conns int, names string, mods ...func(*Config)) (e *Engine, fds int, heap int64) {
	v := newEnv(t)
	e = v.engine("recv", append([]func(*Config){func(c *Config) {
		c.FrameTimeout, c.IdleTimeout = time.Minute, time.Minute
		c.MaxConnsPerPeer, c.MaxIncomingConns = 8, 32
		c.MaxBodyBytes, c.MaxBodyBytesPerPeer = 8<<20, 2<<20
	}}, mods...)...)
	fd0, heap0 := openFDs(t), heapInUse()
	c := &child{Child: childproc.Start(t, childEnv, "flood", "BOUNCE_TCP_TEST_ADDR="+e.Addr(),
		fmt.Sprintf("BOUNCE_TCP_TEST_CONNS=%d", conns), "BOUNCE_TCP_TEST_NAMES="+names), t: t}
	c.expect("SENT")
	// Every connection was admitted or refused (the pending cap may
	// refuse some before their HELLO too).
	deadline := time.Now().Add(hangGuard)
	for {
		st := e.Stats()
		if uint64(st.IncomingConns)+st.RefusedConns >= uint64(conns) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("connections never settled: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // let the refused ones close
	fds, heap = openFDs(t)-fd0, int64(heapInUse())-int64(heap0)
	t.Logf("%d connections (%s names): %+v; fds +%d, heap %+d KiB", conns, names, e.Stats(), fds, heap>>10)
	c.Stdin.Close()
	return e, fds, heap
}

// TestOnePeerSlowFramesBounded (issue 26 item 3): 128 connections of one
// peer, each holding an incomplete frame that declared the largest body,
// hold at most MaxConnsPerPeer connections and MaxBodyBytesPerPeer of
// body memory at the receiver; the rest are refused.
func TestOnePeerSlowFramesBounded(t *testing.T) {
	e, fds, heap := floodCase(t, 128, "same")
	st := e.Stats()
	if st.IncomingConns > 8 || st.RefusedConns < 120 {
		t.Fatalf("one peer holds %d connections (cap 8), %d refused", st.IncomingConns, st.RefusedConns)
	}
	if st.BodyBytes > 2<<20 {
		t.Fatalf("one peer's bodies hold %d bytes, cap %d", st.BodyBytes, 2<<20)
	}
	if fds > 8+8 || heap > 8<<20 {
		t.Fatalf("receiver grew by %d descriptors and %d heap bytes", fds, heap)
	}
}

// TestManyNamesSlowFramesBounded (issue 26 item 5): with the
// unauthenticated protocol (security.mode off), 300 connections claiming
// 300 names hold at most MaxIncomingConns connections and MaxBodyBytes of
// body memory in all.
func TestManyNamesSlowFramesBounded(t *testing.T) {
	e, fds, heap := floodCase(t, 300, "distinct")
	st := e.Stats()
	if st.IncomingConns > 32 || st.RefusedConns < 268 {
		t.Fatalf("peers hold %d connections (cap 32), %d refused", st.IncomingConns, st.RefusedConns)
	}
	if st.BodyBytes > 8<<20 {
		t.Fatalf("bodies hold %d bytes, cap %d", st.BodyBytes, 8<<20)
	}
	if fds > 32+8 || heap > 16<<20 {
		t.Fatalf("receiver grew by %d descriptors and %d heap bytes", fds, heap)
	}
}

// TestStagingShareOfOnePeer (issue 26 item 3): a peer whose connections
// each hold a device frame whose payload never comes holds at most half
// of the receiver's incoming staging buffers; another peer's device write
// still lands at once, and every hostile frame is cut at its deadline.
func TestStagingShareOfOnePeer(t *testing.T) {
	v := newEnv(t)
	fs, fr := newFakeDevice(), newFakeDevice()
	s := v.engine("s", func(c *Config) { c.Device, c.StageBuffers, c.StageBytes = fs, 4, 64<<10 })
	r := v.engine("r", func(c *Config) {
		c.Device, c.StageBuffers, c.StageBytes = fr, 4, 64<<10
		c.FrameTimeout, c.IdleTimeout = 4*time.Second, 4*time.Second
	})
	src := v.devBuf(64<<10, 9, s)
	dst := v.devBuf(64<<10, 0, r)
	connect(t, s, r)
	d := devSub(dst, 32<<10, 4096)
	var hostile []*rawPeer
	for range 4 { // the whole ring, were nothing capped
		p := dialRaw(t, r)
		p.send(helloFrame("mallory"), writeFrameBytes(1, []segment{{d.Addr, d.Len}}))
		hostile = append(hostile, p)
	}
	// Two of them hold a buffer each; the other two wait for their share.
	deadline := time.Now().Add(hangGuard)
	for r.stage.inShare.inUse() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the hostile frames never took their buffers")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if n := r.stage.inShare.inUse(); n != 2 {
		t.Fatalf("one peer holds %d of 4 incoming staging buffers, want its share 2", n)
	}
	op, err := s.PostWrite("r", []transfer.WriteOp{{Src: devSub(src, 0, 4096), Dst: devSub(dst, 0, 4096)}})
	mustDone(t, op, err) // long before the hostile frames' deadline
	if !bytes.Equal(dst.Bytes()[:4096], src.Bytes()[:4096]) {
		t.Fatal("the other peer's device write did not land")
	}
	// Every hostile frame (holding a buffer or waiting for its share) is
	// cut at its frame deadline, and the buffers come back.
	for _, p := range hostile {
		p.expectClosed("hostile frame")
	}
	deadline = time.Now().Add(hangGuard)
	for r.stage.inShare.inUse() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d staging buffers still held after the hostile frames were cut", r.stage.inShare.inUse())
		}
		time.Sleep(time.Millisecond)
	}
}
