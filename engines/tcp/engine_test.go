package tcp

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

func TestWriteRandomSizesUnaligned(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	const size = 17 << 20
	src := v.buf(size, 1, a)
	dst := v.buf(size, 0, b)
	connect(t, a, b)
	shadow := make([]byte, size)
	r := rand.New(rand.NewPCG(2, 3))
	sizes := []int{1, 2, 3, 7, 4095, 4097, 1<<20 + 1, 8 << 20}
	for range 24 {
		sizes = append(sizes, 1+int(r.ExpFloat64()*float64(256<<10))%(8<<20))
	}
	for i, n := range sizes {
		so, do := r.IntN(size-n+1), r.IntN(size-n+1)
		op, err := a.PostWrite("b", []transfer.WriteOp{{Src: sub(src, so, n), Dst: sub(dst, do, n)}})
		mustDone(t, op, err)
		copy(shadow[do:do+n], src.Bytes()[so:so+n])
		if !bytes.Equal(dst.Bytes(), shadow) {
			t.Fatalf("write %d (%d bytes, src+%d -> dst+%d): destination differs", i, n, so, do)
		}
	}
}

func TestManyOpsInOnePost(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	src := v.buf(4<<20, 4, a)
	dst := v.buf(16<<20, 0, b)
	connect(t, a, b)
	shadow := make([]byte, len(dst.Bytes()))
	r := rand.New(rand.NewPCG(5, 6))
	// More ops than MaxSegments, so the post spans several frames by count.
	var ops []transfer.WriteOp
	off := 0
	for len(ops) < MaxSegments+5000 {
		n := 1 + r.IntN(100)
		so := r.IntN(len(src.Bytes()) - n)
		ops = append(ops, transfer.WriteOp{Src: sub(src, so, n), Dst: sub(dst, off, n)})
		copy(shadow[off:off+n], src.Bytes()[so:so+n])
		off += n + r.IntN(3)
	}
	r.Shuffle(len(ops), func(i, j int) { ops[i], ops[j] = ops[j], ops[i] })
	ops = append(ops, transfer.WriteOp{}) // zero-length ops move nothing
	op, err := a.PostWrite("b", ops)
	mustDone(t, op, err)
	if !bytes.Equal(dst.Bytes(), shadow) {
		t.Fatal("destination differs from expected")
	}
}

func TestEmptyPostIsDone(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	connect(t, a, b)
	op, err := a.PostWrite("b", nil)
	mustDone(t, op, err)
}

func TestConcurrentPosts(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a", func(c *Config) { c.StripeBytes = 64 << 10 }), v.engine("b")
	const workers, posts, region = 8, 25, 1 << 20
	src := v.buf(region, 7, a)
	dst := v.buf(workers*region, 0, b)
	connect(t, a, b)
	shadow := make([]byte, len(dst.Bytes()))
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		// Each worker owns one destination region; work out its bytes first.
		r := rand.New(rand.NewPCG(uint64(w), 9))
		var all [][]transfer.WriteOp
		for range posts {
			var ops []transfer.WriteOp
			// Ops of one post land in distinct quarters: their order is
			// not defined.
			for q := range 1 + r.IntN(4) {
				n := 1 + r.IntN(region/4)
				so, do := r.IntN(region-n+1), q*region/4+r.IntN(region/4-n+1)
				ops = append(ops, transfer.WriteOp{Src: sub(src, so, n), Dst: sub(dst, w*region+do, n)})
				copy(shadow[w*region+do:], src.Bytes()[so:so+n])
			}
			all = append(all, ops)
		}
		wg.Go(func() {
			// Posts of one worker overlap, so each waits for the previous.
			for i, ops := range all {
				op, err := a.PostWrite("b", ops)
				if err != nil {
					errs <- err
					return
				}
				<-op.(*writeOp).done
				if st, err := op.Poll(); st != transfer.Done {
					errs <- fmt.Errorf("worker %d post %d: %v %v", w, i, st, err)
					return
				}
				op.Release()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if !bytes.Equal(dst.Bytes(), shadow) {
		t.Fatal("destination differs from expected")
	}
}

func TestSenderRejectsBeforeSending(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	src := v.buf(8192, 11, a)
	unreg := v.buf(4096, 12, nil)
	big := v.buf(3*4096, 0, nil)
	dst := sub(big, 4096, 4096)
	if err := b.RegisterMemory(dst); err != nil {
		t.Fatal(err)
	}
	connect(t, a, b)
	// LoadPeer dials nothing; rejected posts add nothing.
	incoming := func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.incoming)
	}
	ok := transfer.WriteOp{Src: sub(src, 0, 100), Dst: dst}
	ok.Dst.Len = 100
	cases := []struct {
		name string
		ops  []transfer.WriteOp
		want error
	}{
		{"unregistered source", []transfer.WriteOp{{Src: sub(unreg, 0, 10), Dst: sub(big, 4096, 10)}}, transfer.ErrNotRegistered},
		{"source past end", []transfer.WriteOp{{Src: transfer.Desc{Addr: src.Desc().Addr + 8000, Len: 200}, Dst: sub(big, 4096, 200)}}, transfer.ErrOutOfBounds},
		{"destination past end", []transfer.WriteOp{{Src: sub(src, 0, 10), Dst: sub(big, 8190, 10)}}, transfer.ErrOutOfBounds},
		{"destination unregistered", []transfer.WriteOp{{Src: sub(src, 0, 10), Dst: sub(big, 4000, 10)}}, transfer.ErrNotRegistered},
		{"valid then invalid", []transfer.WriteOp{ok, {Src: sub(src, 0, 10), Dst: sub(big, 9000, 10)}}, transfer.ErrNotRegistered},
		{"device memory", []transfer.WriteOp{{Src: transfer.Desc{Addr: 1 << 40, Len: 4, Kind: transfer.CUDA}, Dst: sub(big, 4096, 4)}}, transfer.ErrUnsupported},
	}
	for _, c := range cases {
		op, err := a.PostWrite("b", c.ops)
		if op != nil || !errors.Is(err, c.want) {
			t.Errorf("%s: op=%v err=%v, want %v", c.name, op, err, c.want)
		}
	}
	if _, err := a.PostWrite("b", []transfer.WriteOp{{Src: sub(src, 0, 10), Dst: sub(big, 4096, 11)}}); err == nil {
		t.Error("length mismatch accepted")
	}
	if _, err := a.PostWrite("nobody", []transfer.WriteOp{ok}); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Errorf("unknown peer: %v", err)
	}
	if !bytes.Equal(big.Bytes(), make([]byte, len(big.Bytes()))) {
		t.Fatal("rejected writes changed the destination")
	}
	// Nothing was sent: no connection.
	time.Sleep(50 * time.Millisecond)
	if n := incoming(); n != 0 {
		t.Fatalf("b has %d incoming connections after rejected posts, want none", n)
	}
	if n := a.reg.Pinned(); n != 0 {
		t.Fatalf("rejected posts left %d pins", n)
	}
}

func TestLoadPeerRefreshAndBadMetadata(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	src := v.buf(4096, 13, a)
	d1 := v.buf(4096, 0, b)
	d2 := v.buf(4096, 0, nil)
	connect(t, a, b)
	if _, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: d2.Desc()}}); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("write to unadvertised memory: %v", err)
	}
	if err := b.RegisterMemory(d2.Desc()); err != nil {
		t.Fatal(err)
	}
	connect(t, a, b) // refresh
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: d2.Desc()}, {Src: src.Desc(), Dst: d1.Desc()}})
	mustDone(t, op, err)
	if !bytes.Equal(d1.Bytes(), src.Bytes()) || !bytes.Equal(d2.Bytes(), src.Bytes()) {
		t.Fatal("bytes differ after refresh")
	}

	md, _ := b.Metadata()
	for _, c := range badMetadata(md) {
		if _, err := a.LoadPeer(c.md); !errors.Is(err, transfer.ErrBadMetadata) {
			t.Errorf("%s: err = %v, want ErrBadMetadata", c.name, err)
		}
	}
}

// badMetadata derives malformed blobs from a valid one.
func badMetadata(md []byte) []struct {
	name string
	md   []byte
} {
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), md...)) }
	m, _ := decodeMetadata(md)
	enc := func(f func(*metadata)) []byte {
		c := metadata{name: m.name, addr: m.addr, ranges: append(m.ranges[:0:0], m.ranges...)}
		f(&c)
		return encodeMetadata(c)
	}
	return []struct {
		name string
		md   []byte
	}{
		{"empty", nil},
		{"bad magic", mut(func(b []byte) []byte { b[0] = 'X'; return b })},
		{"future version", mut(func(b []byte) []byte { b[4] = 9; return b })},
		{"truncated", md[:len(md)-1]},
		{"trailing byte", append(append([]byte(nil), md...), 0)},
		{"empty name", enc(func(c *metadata) { c.name = "" })},
		{"control char in name", enc(func(c *metadata) { c.name = "a\nb" })},
		{"no port", enc(func(c *metadata) { c.addr = "127.0.0.1" })},
		{"port zero", enc(func(c *metadata) { c.addr = "127.0.0.1:0" })},
		{"empty range", enc(func(c *metadata) { c.ranges = append(c.ranges, transfer.Desc{Addr: 1 << 50}) })},
		{"wrapping range", enc(func(c *metadata) { c.ranges = append(c.ranges, transfer.Desc{Addr: ^uint64(0) - 5, Len: 10}) })},
		{"overlapping ranges", enc(func(c *metadata) { c.ranges = append(c.ranges, c.ranges[len(c.ranges)-1]) })},
		{"huge count", mut(func(b []byte) []byte { b[len(b)-16*len(m.ranges)-1] = 0x7f; return b })},
	}
}

func TestLoadPeerNewAddressReplaces(t *testing.T) {
	v := newEnv(t)
	a, b, b2 := v.engine("a"), v.engine("b"), v.engine("b")
	src := v.buf(4096, 14, a)
	d := v.buf(4096, 0, b)
	d2 := v.buf(4096, 0, b2)
	connect(t, a, b)
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: d.Desc()}})
	mustDone(t, op, err)
	connect(t, a, b2) // same name, new address
	op, err = a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: d2.Desc()}})
	mustDone(t, op, err)
	if !bytes.Equal(d2.Bytes(), src.Bytes()) {
		t.Fatal("write after re-load did not reach the new engine")
	}
}

func TestConfigValidation(t *testing.T) {
	bad := []Config{
		{},
		{Name: "bad\x00name"},
		{Name: "x", Connections: -1},
		{Name: "x", Connections: MaxConnections + 1},
		{Name: "x", IdleTimeout: -1},
		{Name: "x", NotifyQueue: -1},
		{Name: "x", StripeBytes: MaxFramePayload + 1},
		{Name: "x", Advertise: "nohostport"},
		{Name: "x", Advertise: "127.0.0.1:0"},
	}
	for _, c := range bad {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) succeeded", c)
		}
	}
	// A wildcard listen address needs Advertise; it is refused before
	// anything is bound.
	for _, l := range []string{"0.0.0.0:0", "[::]:0", ":0"} {
		if _, err := New(Config{Name: "x", Listen: l}); !errors.Is(err, transfer.ErrBadEndpoint) {
			t.Errorf("listen %q without Advertise: %v", l, err)
		}
	}
	v := newEnv(t)
	e := v.engine("adv", func(c *Config) { c.Advertise = "127.0.0.1:4242" })
	md, _ := e.Metadata()
	m, err := decodeMetadata(md)
	if err != nil || m.addr != "127.0.0.1:4242" || m.name != "adv" {
		t.Fatalf("advertised metadata = %+v, %v", m, err)
	}
}

func TestCloseIsIdempotentAndFinal(t *testing.T) {
	e, err := New(Config{Name: "c"})
	if err != nil {
		t.Fatal(err)
	}
	peer, err := New(Config{Name: "p"})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	connect(t, e, peer)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	md, _ := peer.Metadata()
	checks := map[string]error{
		"PostWrite": func() error { _, err := e.PostWrite("p", nil); return err }(),
		"Notify":    e.Notify("p", nil),
		"Recv":      func() error { _, err := e.RecvNotification(0); return err }(),
		"Register":  e.RegisterMemory(transfer.Desc{Addr: 4096, Len: 1}),
		"Metadata":  func() error { _, err := e.Metadata(); return err }(),
		"LoadPeer":  func() error { _, err := e.LoadPeer(md); return err }(),
	}
	for name, err := range checks {
		if !errors.Is(err, transfer.ErrClosed) {
			t.Errorf("%s after close: %v, want ErrClosed", name, err)
		}
	}
	if _, err := net.Dial("tcp", e.Addr()); err == nil {
		t.Error("listener still accepts after close")
	}
}

func TestIPv6Loopback(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	ln.Close()
	v := newEnv(t)
	six := func(c *Config) { c.Listen = "[::1]:0" }
	a, b := v.engine("a", six), v.engine("b", six)
	src := v.buf(1<<20, 15, a)
	dst := v.buf(1<<20, 0, b)
	connect(t, a, b)
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	mustDone(t, op, err)
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatal("bytes differ")
	}
}
