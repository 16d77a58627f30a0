package tcp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/transfer"
)

// keyring is a set of test agents' identities; each engine built from it
// admits the agents introduced to it.
type keyring map[string]security.Identity

func (k keyring) id(t testing.TB, name string) security.Identity {
	t.Helper()
	if id, ok := k[name]; ok {
		return id
	}
	id, err := security.Generate(nil)
	if err != nil {
		t.Fatal(err)
	}
	k[name] = id
	return id
}

// authed returns a Config modifier that authenticates name with its key and
// admits the agents in admit, each with its key in k.
func (k keyring) authed(t testing.TB, name string, admit ...string) func(*Config) {
	peers := security.NewPeers(security.Authenticate, k.id(t, name), security.Policy{Loaded: true})
	for _, n := range admit {
		if err := peers.Introduce(n, k.id(t, n).Public); err != nil {
			t.Fatal(err)
		}
	}
	return func(c *Config) { c.Peers = peers }
}

func encrypted(c *Config) { c.Encrypt = true }

// TestAuthenticatedWrites: mutually admitted engines move bytes exactly,
// with encryption off and on, striped and in many small segments.
func TestAuthenticatedWrites(t *testing.T) {
	for _, enc := range []bool{false, true} {
		t.Run(fmt.Sprintf("encryption=%v", enc), func(t *testing.T) {
			k := keyring{}
			v := newEnv(t)
			mods := func(name, peer string) []func(*Config) {
				m := []func(*Config){k.authed(t, name, peer), func(c *Config) { c.StripeBytes = 256 << 10 }}
				if enc {
					m = append(m, encrypted)
				}
				return m
			}
			a, b := v.engine("a", mods("a", "b")...), v.engine("b", mods("b", "a")...)
			const size = 9<<20 + 123
			src := v.buf(size, 3, a)
			dst := v.buf(size, 0, b)
			connect(t, a, b)
			op, err := a.PostWrite("b", []transfer.WriteOp{{Src: sub(src, 0, size), Dst: sub(dst, 0, size)}})
			mustDone(t, op, err)
			var ops []transfer.WriteOp
			for i := 0; i < 2000; i++ {
				ops = append(ops, transfer.WriteOp{Src: sub(src, i*4096+7, 100), Dst: sub(dst, i*4096+9, 100)})
			}
			op, err = a.PostWrite("b", ops)
			mustDone(t, op, err)
			want := append([]byte(nil), src.Bytes()...)
			for i := 0; i < 2000; i++ {
				copy(want[i*4096+9:i*4096+109], src.Bytes()[i*4096+7:i*4096+107])
			}
			if !bytes.Equal(dst.Bytes(), want) {
				t.Fatal("destination differs")
			}
			// Notifications ride the same authenticated connection.
			connect(t, b, a)
			if err := a.Notify("b", []byte("note")); err != nil {
				t.Fatal(err)
			}
			m, err := b.RecvNotification(hangGuard)
			if err != nil || m.Peer != "a" || string(m.Payload) != "note" {
				t.Fatalf("notification %+v, %v", m, err)
			}
			if st := b.Stats(); st != (Stats{IncomingConns: st.IncomingConns}) {
				t.Fatalf("receiver counted refusals for a legitimate peer: %+v", st)
			}
		})
	}
}

// TestRawHelloAndWriteRefused replays attack (a) of issue 12: a plain HELLO
// with a made-up name and one WRITE frame into the receiver's buffer. It is
// refused before a byte lands and counted; a legitimate peer's write
// running at the same time lands exactly.
func TestRawHelloAndWriteRefused(t *testing.T) {
	k := keyring{}
	v := newEnv(t)
	b := v.engine("b", k.authed(t, "b", "a"))
	a := v.engine("a", k.authed(t, "a", "b"))
	dst := v.buf(2<<20, 0, b)
	src := v.buf(1<<20, 9, a)
	connect(t, a, b)

	attack := bytes.Repeat([]byte{0xee}, 1<<20)
	for _, name := range []string{"mallory", "a"} { // a made-up name, and a legitimate peer's name
		r := dialRaw(t, b)
		r.send(helloFrame(name), writeFrameBytes(1, []segment{{addr: dst.Desc().Addr + 1<<20, n: 1 << 20}}), attack)
		r.expectClosed("raw hello + write from " + name)
	}
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: sub(dst, 0, 1<<20)}})
	mustDone(t, op, err)
	if !bytes.Equal(dst.Bytes()[:1<<20], src.Bytes()) {
		t.Fatal("legitimate write did not land exactly")
	}
	if !bytes.Equal(dst.Bytes()[1<<20:], make([]byte, 1<<20)) {
		t.Fatal("attacker bytes landed in the receiver's buffer")
	}
	if st := b.Stats(); st.Unauthenticated != 2 {
		t.Fatalf("stats %+v, want 2 unauthenticated connections", st)
	}
}

// TestWrongKeysRefused: a dialer whose key the receiver does not admit, a
// dialer that pins a key the receiver does not hold, and an admitted key
// whose HELLO names another agent all fail, and nothing lands.
func TestWrongKeysRefused(t *testing.T) {
	k := keyring{}
	v := newEnv(t)
	b := v.engine("b", k.authed(t, "b", "a", "c"))
	dst := v.buf(1<<20, 0, b)
	check := func(name string, e *Engine, peer string, want error) {
		t.Helper()
		src := v.buf(4096, 5, e)
		op, err := e.PostWrite(peer, []transfer.WriteOp{{Src: src.Desc(), Dst: sub(dst, 0, 4096)}})
		if err != nil {
			t.Fatal(err)
		}
		if err := mustFail(t, op, want); err == nil {
			t.Fatalf("%s: write succeeded", name)
		}
		if !bytes.Equal(dst.Bytes(), make([]byte, 1<<20)) {
			t.Fatalf("%s: bytes landed", name)
		}
	}

	// x knows b's key, b does not know x.
	x := v.engine("x", k.authed(t, "x", "b"))
	connect(t, x, b)
	check("unadmitted key", x, "b", transfer.ErrPeerLost)

	// a believes b holds imp's key.
	a := v.engine("a", k.authed(t, "a"))
	a.cfg.Peers.Introduce("b", k.id(t, "imp").Public)
	connect(t, a, b)
	check("pinned to the wrong key", a, "b", transfer.ErrPeerLost)

	// c holds an admitted key but calls itself "a".
	liar := v.engine("a", func(c *Config) {
		p := security.NewPeers(security.Authenticate, k.id(t, "c"), security.Policy{Loaded: true})
		p.Introduce("b", k.id(t, "b").Public)
		c.Peers = p
	})
	connect(t, liar, b)
	check("hello naming another agent", liar, "b", transfer.ErrPeerLost)

	if st := b.Stats(); st.Unauthenticated != 3 {
		t.Fatalf("stats %+v, want 3 unauthenticated", st)
	}
}

// TestReplayedHandshakeCannotWrite: an attacker who recorded a legitimate
// peer's handshake message 1 and replays it gets the listener's answer but
// cannot produce the sealed HELLO, so nothing it sends is accepted, even
// with encryption off.
func TestReplayedHandshakeCannotWrite(t *testing.T) {
	k := keyring{}
	v := newEnv(t)
	b := v.engine("b", k.authed(t, "b", "a"))
	dst := v.buf(1<<20, 0, b)
	// A recording proxy between a and b.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	recorded := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		c.SetReadDeadline(time.Now().Add(hangGuard))
		n, _ := c.Read(buf) // message 1 arrives in one write
		recorded <- append([]byte(nil), buf[:n]...)
	}()
	a := v.engine("a", k.authed(t, "a", "b"))
	md, err := decodeMetadata(b.metadata())
	if err != nil {
		t.Fatal(err)
	}
	md.addr = ln.Addr().String()
	if _, err := a.LoadPeer(encodeMetadata(md)); err != nil {
		t.Fatal(err)
	}
	src := v.buf(4096, 1, a)
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: sub(dst, 0, 4096)}})
	if err != nil {
		t.Fatal(err)
	}
	var m1 []byte
	select {
	case m1 = <-recorded:
	case <-time.After(hangGuard):
		t.Fatal("no handshake recorded")
	}
	wait(t, op)
	if len(m1) < len(authMagic) || string(m1[:len(authMagic)]) != authMagic {
		t.Fatalf("recorded %d bytes that are not a handshake", len(m1))
	}

	r := dialRaw(t, b)
	r.send(m1, helloFrame("a"), writeFrameBytes(1, []segment{{addr: dst.Desc().Addr, n: 4096}}), bytes.Repeat([]byte{0xee}, 4096))
	r.expectClosed("replayed handshake")
	if !bytes.Equal(dst.Bytes(), make([]byte, 1<<20)) {
		t.Fatal("bytes landed after a replayed handshake")
	}
}

// TestSlowAndIdleConnectionsBounded: connections that never finish their
// handshake are capped (MaxPendingConns) and cut after FrameTimeout, and an
// authenticated peer trickling a frame is cut too; a legitimate write
// still lands.
func TestSlowAndIdleConnectionsBounded(t *testing.T) {
	k := keyring{}
	v := newEnv(t)
	b := v.engine("b", k.authed(t, "b", "a"), func(c *Config) {
		c.MaxPendingConns = 8
		c.FrameTimeout = time.Second
	})
	// One connection: the settling write below proves every connection a
	// will use is up, so none of a's own dials races the flood (a lazily
	// dialed second connection could be refused over the pending cap or
	// cut as slow on a loaded machine, failing the legitimate write).
	a := v.engine("a", k.authed(t, "a", "b"), func(c *Config) { c.Connections = 1 })
	dst := v.buf(1<<20, 0, b)
	src := v.buf(1<<20, 4, a)
	connect(t, a, b)
	// a dials b at LoadPeer, possibly before b knows a's key: let a's
	// connection settle (a write lands) and count the flood from there.
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	mustDone(t, op, err)
	base := b.Stats()
	var idle []*rawPeer
	for i := 0; i < 20; i++ {
		c, err := net.Dial("tcp", b.Addr())
		if err != nil {
			continue // refused so early that the dial saw the reset
		}
		t.Cleanup(func() { c.Close() })
		idle = append(idle, &rawPeer{t: t, conn: c})
	}
	for i, r := range idle {
		r.expectClosed(fmt.Sprintf("idle connection %d", i))
	}
	deadline := time.Now().Add(hangGuard)
	for st := b.Stats(); st.RefusedConns+st.SlowConns-base.RefusedConns-base.SlowConns < 20 && time.Now().Before(deadline); st = b.Stats() {
		time.Sleep(10 * time.Millisecond)
	}
	st := b.Stats()
	refused, slow := st.RefusedConns-base.RefusedConns, st.SlowConns-base.SlowConns
	if refused < 12 || refused+slow != 20 {
		t.Fatalf("stats %+v (before the flood %+v): want at least 11 refused over the pending cap and every idle connection cut", st, base)
	}
	// A legitimate write lands after the flood.
	clear(dst.Bytes())
	op, err = a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	mustDone(t, op, err)
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("legitimate write differs")
	}
}

// TestWriteGuardRefuses: with a guard installed, a write outside what it
// allows is NACKed with ErrForbidden, counted, and lands nothing; writes
// it allows land.
func TestWriteGuardRefuses(t *testing.T) {
	k := keyring{}
	v := newEnv(t)
	b := v.engine("b", k.authed(t, "b", "a"))
	a := v.engine("a", k.authed(t, "a", "b"))
	dst := v.buf(2<<20, 0, b)
	src := v.buf(1<<20, 6, a)
	connect(t, a, b)
	allowed := sub(dst, 0, 1<<20)
	b.SetWriteGuard(func(peer string, d transfer.Desc) (transfer.Desc, error) {
		if peer == "a" && allowed.Contains(d.Addr, d.Len) {
			return allowed, nil
		}
		return transfer.Desc{}, errors.New("not granted")
	})
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: sub(dst, 1<<20, 1<<20)}})
	if err != nil {
		t.Fatal(err)
	}
	mustFail(t, op, transfer.ErrForbidden)
	if !bytes.Equal(dst.Bytes(), make([]byte, 2<<20)) {
		t.Fatal("a forbidden write landed")
	}
	op, err = a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: allowed}})
	mustDone(t, op, err)
	if !bytes.Equal(dst.Bytes()[:1<<20], src.Bytes()) {
		t.Fatal("allowed write differs")
	}
	if st := b.Stats(); st.ForbiddenWrites == 0 {
		t.Fatalf("stats %+v, want the forbidden write counted", st)
	}
}

// FuzzAcceptHandshake feeds arbitrary bytes to the listener's side of the
// handshake: it never panics and never admits them.
func FuzzAcceptHandshake(f *testing.F) {
	f.Add([]byte(authMagic + "\x20\x00" + string(make([]byte, 32))))
	f.Add([]byte(authMagic + "\xff\xff"))
	f.Add([]byte("\x01\x01\x00\x00"))
	f.Add([]byte{})
	k := keyring{}
	v := newEnv(f)
	e := v.engine("b", k.authed(f, "b", "a"))
	f.Fuzz(func(t *testing.T, in []byte) {
		c1, c2 := net.Pipe()
		defer c1.Close()
		go func() {
			c2.Write(in)
			c2.Close()
		}()
		c1.SetDeadline(time.Now().Add(time.Second))
		go io.Copy(io.Discard, c2)
		if _, name, err := e.acceptHandshake(e.authenticator(), c1); err == nil {
			t.Fatalf("arbitrary bytes admitted as %q", name)
		}
	})
}

// TestLoadPeerBeforeAdmittedCountsNothing is the reported noise: A loads B
// before B admits A (two agents loading each other's descriptors, one
// first). A dialed at LoadPeer, its handshake was refused and B counted a
// legitimate sender as Unauthenticated. LoadPeer dials nothing now; once B
// admits A, A's write is served and B's counter stays 0.
func TestLoadPeerBeforeAdmittedCountsNothing(t *testing.T) {
	k := keyring{}
	v := newEnv(t)
	a := v.engine("a", k.authed(t, "a", "b"), func(c *Config) { c.Connections = 1 })
	b := v.engine("b", k.authed(t, "b"))
	src := v.buf(4096, 3, a)
	dst := v.buf(4096, 0, b)
	connect(t, a, b)
	time.Sleep(200 * time.Millisecond) // time for a dial at LoadPeer to reach B
	if err := b.cfg.Peers.Introduce("a", k.id(t, "a").Public); err != nil {
		t.Fatal(err)
	}
	// One connection: this write's session starts only after any earlier
	// one on it ended, so a refused early dial was counted by now.
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	mustDone(t, op, err)
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("destination differs")
	}
	if n := b.Stats().Unauthenticated; n != 0 {
		t.Fatalf("B counted %d unauthenticated connections from A, a sender it admitted before A's first write", n)
	}
	// A connection from a key B does not admit still counts.
	c := v.engine("c", k.authed(t, "c", "b"))
	connect(t, c, b)
	c.Connect("b")
	eventually(t, "B counts c's refused handshake", func() bool { return b.Stats().Unauthenticated == 1 })
}
