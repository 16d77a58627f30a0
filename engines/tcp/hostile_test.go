package tcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// rawPeer speaks the wire protocol by hand, to send what a correct engine
// never would.
type rawPeer struct {
	t    testing.TB
	conn net.Conn
}

func dialRaw(t testing.TB, e *Engine) *rawPeer {
	t.Helper()
	c, err := net.Dial("tcp", e.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawPeer{t: t, conn: c}
}

func (r *rawPeer) send(b ...[]byte) {
	r.t.Helper()
	r.conn.SetWriteDeadline(time.Now().Add(hangGuard))
	// The engine may close the connection before reading everything.
	_, _ = (*net.Buffers)(&b).WriteTo(r.conn)
}

func helloFrame(name string) []byte {
	return encodeFrame(frameHello, 0, encodeMetadata(metadata{name: name, addr: "127.0.0.1:9"}))
}

func writeFrameBytes(id uint64, segs []segment) []byte {
	body := binary.LittleEndian.AppendUint32(nil, uint32(len(segs)))
	for _, s := range segs {
		body = appendSegment(body, s.addr, s.n)
	}
	return encodeFrame(frameWrite, id, body)
}

func (r *rawPeer) readFrame() (frameHeader, []byte) {
	r.t.Helper()
	r.conn.SetReadDeadline(time.Now().Add(hangGuard))
	var h [headerSize]byte
	if _, err := io.ReadFull(r.conn, h[:]); err != nil {
		r.t.Fatalf("read reply: %v", err)
	}
	fh, err := parseHeader(h[:])
	if err != nil {
		r.t.Fatal(err)
	}
	body := make([]byte, fh.bodyLen)
	if _, err := io.ReadFull(r.conn, body); err != nil {
		r.t.Fatalf("read reply body: %v", err)
	}
	return fh, body
}

// expectClosed reads until the engine closes the connection.
func (r *rawPeer) expectClosed(what string) {
	r.t.Helper()
	r.conn.SetReadDeadline(time.Now().Add(hangGuard))
	_, err := io.Copy(io.Discard, r.conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		r.t.Fatalf("%s: engine kept the connection open", what)
	}
}

func TestReceiverRejectsForeignMemory(t *testing.T) {
	v := newEnv(t)
	b := v.engine("b")
	big := v.buf(3*4096, 0, nil)
	dst := sub(big, 4096, 4096)
	if err := b.RegisterMemory(dst); err != nil {
		t.Fatal(err)
	}
	r := dialRaw(t, b)
	r.send(helloFrame("mallory"))
	payload := bytes.Repeat([]byte{0xAA}, 64)
	cases := []struct {
		name string
		segs []segment
		code byte
	}{
		{"past the end", []segment{{dst.Addr + 4096 - 10, 20}}, nackOutOfBounds},
		{"before the start", []segment{{dst.Addr - 20, 20}}, nackNotRegistered},
		{"after the end", []segment{{dst.Addr + 4096, 20}}, nackNotRegistered},
		{"valid then invalid", []segment{{dst.Addr, 44}, {dst.Addr + 4090, 20}}, nackOutOfBounds},
		{"far away", []segment{{1 << 62, 64}}, nackNotRegistered},
	}
	for i, c := range cases {
		var n uint64
		for _, s := range c.segs {
			n += s.n
		}
		id := uint64(100 + i)
		r.send(writeFrameBytes(id, c.segs), payload[:n])
		h, body := r.readFrame()
		if h.typ != frameNack || h.id != id || len(body) == 0 || body[0] != c.code {
			t.Fatalf("%s: reply type %d id %d body %q, want NACK %d code %d", c.name, h.typ, h.id, body, id, c.code)
		}
		if !bytes.Equal(big.Bytes(), make([]byte, len(big.Bytes()))) {
			t.Fatalf("%s: rejected frame wrote memory", c.name)
		}
	}
	// The connection stays usable: a valid frame lands and is acknowledged.
	r.send(writeFrameBytes(7, []segment{{dst.Addr + 1, 3}, {dst.Addr + 4095, 1}}), []byte{1, 2, 3, 4})
	if h, _ := r.readFrame(); h.typ != frameAck || h.id != 7 {
		t.Fatalf("valid frame: reply type %d id %d, want ACK 7", h.typ, h.id)
	}
	want := make([]byte, len(big.Bytes()))
	copy(want[4096+1:], []byte{1, 2, 3})
	want[8191] = 4
	if !bytes.Equal(big.Bytes(), want) {
		t.Fatal("valid frame: memory differs")
	}
}

func TestReceiverClosesOnMalformedFrames(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	src := v.buf(4096, 21, a)
	dst := v.buf(4096, 0, b)
	d := dst.Desc()
	hdr := func(typ, version, reserved byte, bodyLen uint32) []byte {
		h := make([]byte, headerSize)
		putHeader(h, frameHeader{typ: typ, bodyLen: bodyLen, id: 1})
		h[1], h[2] = version, reserved
		return h
	}
	valid := writeFrameBytes(1, []segment{{d.Addr, 4}})
	cases := []struct {
		name  string
		hello bool
		frame []byte
	}{
		{"write before hello", false, append(valid, 1, 2, 3, 4)},
		{"garbage instead of hello", false, []byte("GET / HTTP/1.1\r\n\r\n")},
		{"bad version", true, hdr(frameWrite, 9, 0, 20)},
		{"reserved bytes", true, hdr(frameWrite, protoVersion, 1, 20)},
		{"unknown type", true, hdr(99, protoVersion, 0, 0)},
		{"write body too large", true, hdr(frameWrite, protoVersion, 0, 4+16*MaxSegments+16)},
		{"zero segments", true, writeFrameBytes(1, nil)},
		{"count mismatch", true, append(hdr(frameWrite, protoVersion, 0, 20), 2, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16)},
		{"empty segment", true, writeFrameBytes(1, []segment{{d.Addr, 0}})},
		{"wrapping segment", true, writeFrameBytes(1, []segment{{^uint64(0) - 5, 10}})},
		{"payload too large", true, writeFrameBytes(1, []segment{{d.Addr, MaxFramePayload}, {d.Addr, 1}})},
		{"ack from sender", true, encodeFrame(frameAck, 1, nil)},
		{"second hello", true, helloFrame("again")},
		{"notification too large", true, hdr(frameNotif, protoVersion, 0, MaxNotification+1)},
	}
	for _, c := range cases {
		r := dialRaw(t, b)
		if c.hello {
			r.send(helloFrame("mallory"))
		}
		r.send(c.frame)
		r.expectClosed(c.name)
		if !bytes.Equal(dst.Bytes(), make([]byte, 4096)) {
			t.Fatalf("%s: memory written", c.name)
		}
	}
	// A sender that dies inside a payload may leave that frame's
	// destination partly written, never anything outside it, and gets no ACK.
	r := dialRaw(t, b)
	r.send(helloFrame("mallory"), valid, []byte{1, 2})
	r.conn.(*net.TCPConn).CloseWrite()
	r.expectClosed("truncated write")
	if want := append([]byte{1, 2}, make([]byte, 4094)...); !bytes.Equal(dst.Bytes(), want) {
		t.Fatal("truncated write: memory outside the landed prefix changed")
	}
	clear(dst.Bytes())
	// A HELLO with bad metadata is answered with a NACK before closing.
	r = dialRaw(t, b)
	r.send(encodeFrame(frameHello, 0, []byte("BKVT\x01\x00junk")))
	if h, body := r.readFrame(); h.typ != frameNack || h.id != 0 || body[0] != nackBadMetadata {
		t.Fatalf("bad hello: reply type %d id %d code %d", h.typ, h.id, body[0])
	}
	r.expectClosed("bad hello")
	// The engine still serves well-behaved peers.
	connect(t, a, b)
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: d}})
	mustDone(t, op, err)
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("bytes differ")
	}
}

func TestSenderSeesRejectionFromReceiver(t *testing.T) {
	// b advertised a range and then deregistered it: the sender's check
	// passes, the receiver's own check rejects and nothing is written.
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	src := v.buf(8192, 22, a)
	dst := v.buf(8192, 0, b)
	connect(t, a, b)
	if err := b.DeregisterMemory(dst.Desc()); err != nil {
		t.Fatal(err)
	}
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	mustFail(t, op, transfer.ErrNotRegistered)
	if !bytes.Equal(dst.Bytes(), make([]byte, 8192)) {
		t.Fatal("rejected write changed memory")
	}
	// Same connection, memory registered again: the next write lands.
	if err := b.RegisterMemory(dst.Desc()); err != nil {
		t.Fatal(err)
	}
	op, err = a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	mustDone(t, op, err)
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("bytes differ")
	}
}

func TestIncomingWritePinsDestination(t *testing.T) {
	v := newEnv(t)
	b := v.engine("b")
	dst := v.buf(1<<20, 0, b)
	r := dialRaw(t, b)
	r.send(helloFrame("slow"), writeFrameBytes(1, []segment{{dst.Desc().Addr, 1 << 20}}), bytes.Repeat([]byte{9}, 8192))
	eventually(t, "first bytes land", func() bool { return dst.Bytes()[0] == 9 })
	if err := b.DeregisterMemory(dst.Desc()); !errors.Is(err, transfer.ErrInUse) {
		t.Fatalf("deregister while a write lands: %v, want ErrInUse", err)
	}
	r.conn.Close()
	eventually(t, "deregister after the sender vanished", func() bool { return b.DeregisterMemory(dst.Desc()) == nil })
}
