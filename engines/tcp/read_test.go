package tcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// allowRange is a read guard that lets peer read r and nothing else.
func allowRange(peer string, r transfer.Desc) transfer.ReadGuard {
	return func(p string, src transfer.Desc) (transfer.Desc, error) {
		if p != peer {
			return transfer.Desc{}, fmt.Errorf("%q is not %q: %w", p, peer, transfer.ErrForbidden)
		}
		if !r.Contains(src.Addr, src.Len) {
			return transfer.Desc{}, fmt.Errorf("%v outside %v: %w", src, r, transfer.ErrForbidden)
		}
		return r, nil
	}
}

// TestReadByteExact: reads of random sizes and offsets, several per post
// and striped over four connections, land exactly the holder's bytes.
func TestReadByteExact(t *testing.T) {
	v := newEnv(t)
	a := v.engine("a", func(c *Config) { c.Connections, c.StripeBytes = 4, 64<<10 })
	b := v.engine("b")
	const size = 17 << 20
	src := v.buf(size, 9, b)
	dst := v.buf(size, 0, a)
	b.SetReadGuard(allowRange("a", src.Desc()))
	connect(t, a, b)
	connect(t, b, a)
	shadow := make([]byte, size)
	r := rand.New(rand.NewPCG(4, 5))
	for i := range 24 {
		var ops []transfer.ReadOp
		const quarter = size / 4 // one op per quarter: their destinations never overlap
		for q := range 1 + r.IntN(4) {
			n := 1 + int(r.ExpFloat64()*float64(512<<10))%(4<<20)
			so, do := r.IntN(size-n+1), q*quarter+r.IntN(quarter-n+1)
			ops = append(ops, transfer.ReadOp{Src: sub(src, so, n), Dst: sub(dst, do, n)})
		}
		op, err := a.PostRead("b", ops)
		mustDone(t, op, err)
		for _, o := range ops {
			copy(shadow[o.Dst.Addr-dst.Desc().Addr:], src.Bytes()[o.Src.Addr-src.Desc().Addr:][:o.Src.Len])
		}
		if !bytes.Equal(dst.Bytes(), shadow) {
			t.Fatalf("read post %d (%d ops): destination differs", i, len(ops))
		}
	}
	op, err := a.PostRead("b", nil)
	mustDone(t, op, err)
}

// TestReadOutsideGuardRefused: a read the guard does not allow (partly
// outside the allowed range, another peer's range, or any read with no
// guard installed) fails with ErrForbidden, reads nothing, is counted, and
// the connection stays usable.
func TestReadOutsideGuardRefused(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	src := v.buf(1<<20, 3, b)
	dst := v.buf(1<<20, 0, a)
	connect(t, a, b)
	connect(t, b, a)
	read := func(so, do, n int) (transfer.Op, error) {
		return a.PostRead("b", []transfer.ReadOp{{Src: sub(src, so, n), Dst: sub(dst, do, n)}})
	}
	// No guard: nothing is served.
	op, err := read(0, 0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	mustFail(t, op, transfer.ErrForbidden)
	b.SetReadGuard(allowRange("a", sub(src, 0, 64<<10)))
	cases := []struct {
		name      string
		so, do, n int
	}{
		{"straddles the allowed end", 60 << 10, 0, 8 << 10},
		{"outside", 512 << 10, 4096, 4096},
		{"one segment of several outside", 0, 0, 4096},
	}
	for _, c := range cases {
		var ops []transfer.ReadOp
		ops = append(ops, transfer.ReadOp{Src: sub(src, c.so, c.n), Dst: sub(dst, c.do, c.n)})
		if c.name == "one segment of several outside" {
			ops = append(ops, transfer.ReadOp{Src: sub(src, 700<<10, 100), Dst: sub(dst, 8192, 100)})
		}
		op, err := a.PostRead("b", ops)
		if err != nil {
			t.Fatal(err)
		}
		mustFail(t, op, transfer.ErrForbidden)
		if bytes.ContainsFunc(dst.Bytes(), func(r rune) bool { return r != 0 }) {
			t.Fatalf("%s: a refused read changed the destination", c.name)
		}
	}
	if st := b.Stats(); st.ForbiddenReads != 1+uint64(len(cases)) {
		t.Fatalf("ForbiddenReads = %d, want %d", st.ForbiddenReads, 1+len(cases))
	}
	if n := b.Refusals()["forbidden_read"]; n != 1+uint64(len(cases)) {
		t.Fatalf("forbidden_read refusals = %d", n)
	}
	// Another peer's name is refused too.
	b.SetReadGuard(allowRange("c", src.Desc()))
	op, err = read(0, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	mustFail(t, op, transfer.ErrForbidden)
	// The same connection serves an allowed read afterwards.
	b.SetReadGuard(allowRange("a", src.Desc()))
	op, err = read(100, 200, 1000)
	mustDone(t, op, err)
	if !bytes.Equal(dst.Bytes()[200:1200], src.Bytes()[100:1100]) {
		t.Fatal("allowed read after refusals differs")
	}
}

// TestReadArgumentsChecked: a destination not registered here and a
// source outside what the peer advertised are refused before a frame goes.
func TestReadArgumentsChecked(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	src := v.buf(1<<20, 3, b)
	dst := v.buf(1<<20, 0, a)
	other := v.buf(4096, 0, nil)
	b.SetReadGuard(allowRange("a", src.Desc()))
	connect(t, a, b)
	if _, err := a.PostRead("b", []transfer.ReadOp{{Src: sub(src, 0, 4096), Dst: other.Desc()}}); !errors.Is(err, transfer.ErrNotRegistered) && !errors.Is(err, transfer.ErrOutOfBounds) {
		t.Fatalf("unregistered destination: %v", err)
	}
	if _, err := a.PostRead("b", []transfer.ReadOp{{Src: other.Desc(), Dst: sub(dst, 0, 4096)}}); !errors.Is(err, transfer.ErrNotRegistered) && !errors.Is(err, transfer.ErrOutOfBounds) {
		t.Fatalf("source the peer did not advertise: %v", err)
	}
	if _, err := a.PostRead("b", []transfer.ReadOp{{Src: sub(src, 0, 10), Dst: sub(dst, 0, 11)}}); !errors.Is(err, transfer.ErrOutOfBounds) {
		t.Fatalf("unequal lengths: %v", err)
	}
	if _, err := a.PostRead("nobody", []transfer.ReadOp{{Src: sub(src, 0, 10), Dst: sub(dst, 0, 10)}}); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("unknown peer: %v", err)
	}
	// A destination in use cannot be deregistered.
	hold := make(chan struct{})
	var once sync.Once
	b.SetReadGuard(func(p string, d transfer.Desc) (transfer.Desc, error) {
		<-hold
		return src.Desc(), nil
	})
	op, err := a.PostRead("b", []transfer.ReadOp{{Src: sub(src, 0, 4096), Dst: sub(dst, 0, 4096)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.DeregisterMemory(dst.Desc()); !errors.Is(err, transfer.ErrInUse) {
		t.Fatalf("deregister a read's destination in flight: %v", err)
	}
	once.Do(func() { close(hold) })
	mustDone(t, op, nil)
}

// blockingGuard holds every read in the guard until release is closed,
// then allows r; entered is signalled once per read.
func blockingGuard(r transfer.Desc, entered chan<- struct{}, release <-chan struct{}) transfer.ReadGuard {
	return func(p string, src transfer.Desc) (transfer.Desc, error) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		return r, nil
	}
}

// readInFlight posts a read from b into dst that b holds in its guard.
func readInFlight(t *testing.T, a, b *Engine, src, dst *mem.Buffer) (transfer.Op, chan struct{}) {
	t.Helper()
	entered, release := make(chan struct{}, 1), make(chan struct{})
	b.SetReadGuard(blockingGuard(src.Desc(), entered, release))
	op, err := a.PostRead("b", []transfer.ReadOp{{Src: src.Desc(), Dst: dst.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(hangGuard):
		t.Fatal("the read never reached the holder's guard")
	}
	return op, release
}

// TestReaderForgetFailsReadInFlight: the reader forgets the holder while
// a read is in flight; the read fails with ErrPeerLost, and once it is
// terminal nothing of it lands, even when the holder answers after.
func TestReaderForgetFailsReadInFlight(t *testing.T) {
	v := newEnv(t)
	a := v.engine("a", func(c *Config) { c.FenceTimeout = time.Second })
	b := v.engine("b")
	src := v.buf(4<<20, 5, b)
	dst := v.buf(4<<20, 0, a)
	connect(t, a, b)
	connect(t, b, a)
	op, release := readInFlight(t, a, b, src, dst)
	forgot := make(chan error, 1)
	go func() { forgot <- a.ForgetPeer("b") }()
	mustFail(t, op, transfer.ErrPeerLost)
	close(release) // the holder answers now: the bytes must not land
	if err := <-forgot; err != nil {
		t.Fatal(err)
	}
	time.Sleep(watchSettle)
	if bytes.ContainsFunc(dst.Bytes(), func(r rune) bool { return r != 0 }) {
		t.Fatal("a read's bytes landed after the reader forgot the holder")
	}
}

// TestHolderForgetFailsReadInFlight: the holder forgets the reader while
// serving its read; the read fails with ErrPeerLost and nothing lands.
func TestHolderForgetFailsReadInFlight(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	src := v.buf(4<<20, 5, b)
	dst := v.buf(4<<20, 0, a)
	connect(t, a, b)
	connect(t, b, a)
	op, release := readInFlight(t, a, b, src, dst)
	forgot := make(chan error, 1)
	go func() { forgot <- b.ForgetPeer("a") }()
	time.Sleep(10 * time.Millisecond)
	close(release)
	if err := <-forgot; err != nil {
		t.Fatal(err)
	}
	st, err := wait(t, op)
	if st == transfer.Done {
		// The response was complete before the forget cut the connection.
		if !bytes.Equal(dst.Bytes(), src.Bytes()) {
			t.Fatal("a read Done with other bytes")
		}
		return
	}
	if !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("read = %v, %v; want peer lost", st, err)
	}
	// After the forget, a new read is refused (the reader is fenced).
	op, err = a.PostRead("b", []transfer.ReadOp{{Src: sub(src, 0, 64), Dst: sub(dst, 0, 64)}})
	if err == nil {
		st, _ = wait(t, op)
	}
	if err == nil && st == transfer.Done {
		t.Fatal("a forgotten reader read the holder's memory")
	}
}

// TestCloseFailsReadInFlight: Close fails an in-flight read with
// ErrClosed and returns once it is terminal.
func TestCloseFailsReadInFlight(t *testing.T) {
	v := newEnv(t)
	a := v.engine("a", func(c *Config) { c.FenceTimeout = time.Second })
	b := v.engine("b")
	src := v.buf(1<<20, 5, b)
	dst := v.buf(1<<20, 0, a)
	connect(t, a, b)
	op, release := readInFlight(t, a, b, src, dst)
	defer close(release)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if st, _ := op.Poll(); st != transfer.Failed {
		t.Fatalf("read after Close returned: %v", st)
	}
	mustFail(t, op, transfer.ErrClosed)
}

// TestFenceReadsIdle: FenceReads with nothing being served returns at once
// and cuts nothing; a read served afterwards still works.
func TestFenceReadsIdle(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	src := v.buf(1<<20, 5, b)
	dst := v.buf(1<<20, 0, a)
	b.SetReadGuard(allowRange("a", src.Desc()))
	connect(t, a, b)
	op, err := a.PostRead("b", []transfer.ReadOp{{Src: src.Desc(), Dst: dst.Desc()}})
	mustDone(t, op, err)
	start := time.Now()
	b.FenceReads(src.Desc())
	if took := time.Since(start); took > readFenceGrace/2+boundSlack {
		t.Fatalf("idle FenceReads took %v", took)
	}
	if st := b.Stats(); st.FencedReads != 0 {
		t.Fatalf("FencedReads = %d after an idle fence", st.FencedReads)
	}
	clear(dst.Bytes())
	op, err = a.PostRead("b", []transfer.ReadOp{{Src: src.Desc(), Dst: dst.Desc()}})
	mustDone(t, op, err)
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("read after fence differs")
	}
}

// TestFenceReadsCutsStalledResponse: a reader that asks for 16 MiB and
// never reads leaves the holder's response blocked mid-send; FenceReads of
// the range cuts it within its grace, counts it and returns once the
// connection's server stopped (nothing of the range is sent after).
func TestFenceReadsCutsStalledResponse(t *testing.T) {
	v := newEnv(t)
	b := v.engine("b")
	src := v.buf(MaxFramePayload, 5, b)
	b.SetReadGuard(allowRange("a", src.Desc()))
	r := dialRaw(t, b)
	if tc, ok := r.conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4096)
	}
	body := binary.LittleEndian.AppendUint32(nil, 1)
	body = appendSegment(body, src.Desc().Addr, src.Desc().Len)
	r.send(helloFrame("a"), encodeFrame(frameRead, 7, body))
	serving := func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		for ic := range b.incoming {
			if ic.readingIn(src.Desc()) != nil {
				return true
			}
		}
		return false
	}
	eventually(t, "the holder serves the read", serving)
	time.Sleep(50 * time.Millisecond) // the response is blocked on the socket by now
	start := time.Now()
	b.FenceReads(sub(src, 1<<20, 4096))
	if took := time.Since(start); took > readFenceGrace+boundSlack {
		t.Fatalf("FenceReads took %v", took)
	}
	if serving() {
		t.Fatal("the response is still being served after FenceReads returned")
	}
	if st := b.Stats(); st.FencedReads != 1 {
		t.Fatalf("FencedReads = %d, want 1", st.FencedReads)
	}
	r.expectClosed("fenced read")
}

// TestRawReadFrames: the wire form of a read as a raw peer sees it — a
// READ answered by READ_DATA with the bytes in segment order, a refused one
// by a NACK with the forbidden code, and a READ_DATA from a dialer (only
// listeners send one) closes the connection.
func TestRawReadFrames(t *testing.T) {
	v := newEnv(t)
	b := v.engine("b")
	src := v.buf(1<<20, 5, b)
	b.SetReadGuard(allowRange("a", sub(src, 0, 512<<10)))
	r := dialRaw(t, b)
	body := binary.LittleEndian.AppendUint32(nil, 2)
	body = appendSegment(body, src.Desc().Addr+1000, 10)
	body = appendSegment(body, src.Desc().Addr, 5)
	r.send(helloFrame("a"), encodeFrame(frameRead, 3, body))
	h, got := r.readFrame()
	if h.typ != frameReadData || h.id != 3 || len(got) != 0 {
		t.Fatalf("reply %+v, want READ_DATA for part 3 without body", h)
	}
	payload := make([]byte, 15)
	r.conn.SetReadDeadline(time.Now().Add(hangGuard))
	if _, err := io.ReadFull(r.conn, payload); err != nil {
		t.Fatal(err)
	}
	if want := append(bytes.Clone(src.Bytes()[1000:1010]), src.Bytes()[:5]...); !bytes.Equal(payload, want) {
		t.Fatalf("payload %x, want %x", payload, want)
	}
	body = binary.LittleEndian.AppendUint32(nil, 1)
	body = appendSegment(body, src.Desc().Addr+600<<10, 10)
	r.send(encodeFrame(frameRead, 4, body))
	h, got = r.readFrame()
	if h.typ != frameNack || h.id != 4 || len(got) == 0 || got[0] != nackForbidden {
		t.Fatalf("refused read answered %+v %q", h, got)
	}
	r.send(encodeFrame(frameReadData, 5, nil))
	r.expectClosed("READ_DATA from a dialer")
}

// TestAuthenticatedReads: between authenticated engines (encryption off
// and on) reads move bytes exactly, striped; the holder's guard is asked
// with the reader's proven name, so a third admitted peer is refused a
// range allowed to "a" and reads nothing.
func TestAuthenticatedReads(t *testing.T) {
	for _, enc := range []bool{false, true} {
		t.Run(fmt.Sprintf("encryption=%v", enc), func(t *testing.T) {
			k := keyring{}
			v := newEnv(t)
			mods := func(name string, admit ...string) []func(*Config) {
				m := []func(*Config){k.authed(t, name, admit...), func(c *Config) { c.StripeBytes = 256 << 10 }}
				if enc {
					m = append(m, encrypted)
				}
				return m
			}
			a, b, c := v.engine("a", mods("a", "b")...), v.engine("b", mods("b", "a", "c")...), v.engine("c", mods("c", "b")...)
			const size = 9<<20 + 123
			src := v.buf(size, 3, b)
			dst := v.buf(size, 0, a)
			other := v.buf(4096, 0, c)
			var mu sync.Mutex
			var asked []string
			allow := allowRange("a", src.Desc())
			b.SetReadGuard(func(p string, d transfer.Desc) (transfer.Desc, error) {
				mu.Lock()
				asked = append(asked, p)
				mu.Unlock()
				return allow(p, d)
			})
			connect(t, a, b)
			connect(t, c, b)
			op, err := a.PostRead("b", []transfer.ReadOp{{Src: src.Desc(), Dst: dst.Desc()}})
			mustDone(t, op, err)
			if !bytes.Equal(dst.Bytes(), src.Bytes()) {
				t.Fatal("authenticated read differs")
			}
			op, err = c.PostRead("b", []transfer.ReadOp{{Src: sub(src, 0, 4096), Dst: other.Desc()}})
			if err != nil {
				t.Fatal(err)
			}
			mustFail(t, op, transfer.ErrForbidden)
			if bytes.ContainsFunc(other.Bytes(), func(r rune) bool { return r != 0 }) {
				t.Fatal("a refused authenticated read landed bytes")
			}
			mu.Lock()
			defer mu.Unlock()
			if len(asked) < 2 || asked[len(asked)-1] != "c" || asked[0] != "a" {
				t.Fatalf("guard asked for %v, want the readers' proven names a ... c", asked)
			}
		})
	}
}
