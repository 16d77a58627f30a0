package tcp

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// fakeHolder is a holder a test plays by hand: it listens, advertises one
// range and answers the reader's READ with a READ_DATA payload the test
// sends piece by piece.
type fakeHolder struct {
	t    *testing.T
	ln   net.Listener
	src  transfer.Desc
	conn net.Conn
	read uint64 // the READ's part id
}

func newFakeHolder(t *testing.T, src transfer.Desc) *fakeHolder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return &fakeHolder{t: t, ln: ln, src: src}
}

func (h *fakeHolder) metadata() []byte {
	return encodeMetadata(metadata{name: "h", addr: h.ln.Addr().String(), ranges: []transfer.Desc{h.src}, inc: 7})
}

// accept takes the reader's connection and its HELLO and READ frames.
func (h *fakeHolder) accept() {
	h.t.Helper()
	c, err := h.ln.Accept()
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	h.conn = c
	for _, want := range []byte{frameHello, frameRead} {
		c.SetReadDeadline(time.Now().Add(hangGuard))
		var hb [headerSize]byte
		if _, err := io.ReadFull(c, hb[:]); err != nil {
			h.t.Fatalf("fake holder: read frame: %v", err)
		}
		fh, err := parseHeader(hb[:])
		if err != nil || fh.typ != want {
			h.t.Fatalf("fake holder: frame %+v (%v), want type %d", fh, err, want)
		}
		if _, err := io.CopyN(io.Discard, c, int64(fh.bodyLen)); err != nil {
			h.t.Fatal(err)
		}
		h.read = fh.id
	}
}

// send writes b to the reader (the first call writes the READ_DATA header
// first).
func (h *fakeHolder) send(b []byte, header bool) {
	h.t.Helper()
	if header {
		var hb [headerSize]byte
		putHeader(hb[:], frameHeader{typ: frameReadData, id: h.read})
		b = append(hb[:], b...)
	}
	h.conn.SetWriteDeadline(time.Now().Add(hangGuard))
	if _, err := h.conn.Write(b); err != nil {
		h.t.Fatalf("fake holder: send: %v", err)
	}
}

// awaitGivenUp waits for the reader's half-close (its session stopped).
func (h *fakeHolder) awaitGivenUp() {
	h.t.Helper()
	h.conn.SetReadDeadline(time.Now().Add(hangGuard))
	if n, err := io.Copy(io.Discard, h.conn); err != nil || n != 0 {
		h.t.Fatalf("fake holder: waiting for the reader's close: %d bytes, %v", n, err)
	}
}

// TestStoppedReadLandsNothingMore: a read whose session is given up
// (ForgetPeer) while its response is still arriving lands no piece that
// starts after the stop — at most the piece then being read — and fails
// (never Done with bytes missing from its destination). Given up before
// the response starts, nothing lands and the read fails too; it used to
// end Done with its destination untouched.
func TestStoppedReadLandsNothingMore(t *testing.T) {
	const piece = 1 << 20
	for _, c := range []struct {
		name   string
		before int // pieces sent before the stop
		landed int // pieces that may land: those before the stop and the one being read
	}{
		{"before-the-response", 0, 0},
		{"mid-response", 1, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := newEnv(t)
			a := v.engine("a", func(c *Config) { c.StripeBytes = 4 * piece }) // one part, one connection
			dst := v.buf(3*piece, 0, a)
			h := newFakeHolder(t, transfer.Desc{Addr: 0x10000000, Len: 3 * piece, Kind: transfer.Host})
			if _, err := a.LoadPeer(h.metadata()); err != nil {
				t.Fatal(err)
			}
			op, err := a.PostRead("h", []transfer.ReadOp{{Src: h.src, Dst: dst.Desc()}})
			if err != nil {
				t.Fatal(err)
			}
			h.accept()
			payload := bytes.Repeat([]byte{0xBB}, 3*piece)
			sent := 0
			if c.before > 0 {
				h.send(payload[:c.before*piece], true)
				sent = c.before * piece
				eventually(t, "the first piece landed", func() bool { return dst.Bytes()[sent-1] == 0xBB })
			}
			forgot := make(chan error, 1)
			go func() { forgot <- a.ForgetPeer("h") }()
			h.awaitGivenUp()
			h.send(payload[sent:], sent == 0)
			h.conn.Close() // the close the reader's fence waits for
			if err := <-forgot; err != nil {
				t.Fatal(err)
			}
			st, err := wait(t, op)
			if st != transfer.Failed || !errors.Is(err, transfer.ErrPeerLost) {
				t.Fatalf("read given up %s: %v %v, want Failed with ErrPeerLost", c.name, st, err)
			}
			got := dst.Bytes()
			if i := bytes.IndexByte(got[c.landed*piece:], 0xBB); i >= 0 {
				t.Fatalf("byte %d of the destination landed after the stop (pieces up to %d may)", c.landed*piece+i, c.landed)
			}
			_ = op.Release()
		})
	}
}

// TestFencedReadSeenByReader: what a reader sees when the holder's
// FenceReads cuts a response it was not draining (its grant ended while
// the response was still being sent, past the fence's grace): the
// connection is reset, the read fails with ErrPeerLost — quiescent, since
// a read lands only through the reader's session, which returned — and,
// the connection being the reader's last to the holder, its engine reports
// the holder lost (the agent then fails every request with it). The
// holder reports nobody lost. The next read dials a new connection and
// succeeds.
func TestFencedReadSeenByReader(t *testing.T) {
	v := newEnv(t)
	a := v.engine("a", func(c *Config) { c.Connections = 1 })
	b := v.engine("b")
	var lostA, lostB lostRecorder
	a.SetPeerLost(lostA.add)
	b.SetPeerLost(lostB.add)
	const size = 4 * MaxFramePayload // more than the sockets buffer
	src := v.buf(size, 5, b)
	dst := v.buf(size, 0, a)
	b.SetReadGuard(allowRange("a", src.Desc()))
	connect(t, a, b)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	a.landHold = func(abort <-chan struct{}) {
		select {
		case entered <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-abort:
		}
	}
	op, err := a.PostRead("b", []transfer.ReadOp{{Src: src.Desc(), Dst: dst.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(hangGuard):
		t.Fatal("the response never reached the reader")
	}
	b.FenceReads(sub(src, 0, 4096)) // the grant ended: cut past the grace
	if st := b.Stats(); st.FencedReads != 1 {
		t.Fatalf("holder's FencedReads = %d, want 1: the response was not cut", st.FencedReads)
	}
	close(release) // the reader drains again: into a reset connection
	err = mustFail(t, op, transfer.ErrPeerLost)
	if errors.Is(err, transfer.ErrNotQuiescent) {
		t.Fatalf("the cut read is not quiescent: %v", err)
	}
	eventually(t, "the reader reports the holder lost", func() bool { return len(lostA.get()) > 0 })
	if got := lostA.get(); len(got) != 1 || got[0] != "b" {
		t.Fatalf("reader reported %v lost, want [b]", got)
	}
	if got := lostB.get(); len(got) != 0 {
		t.Fatalf("holder reported %v lost after its own cut", got)
	}
	a.landHold = nil
	clear(dst.Bytes())
	op, err = a.PostRead("b", []transfer.ReadOp{{Src: src.Desc(), Dst: dst.Desc()}})
	mustDone(t, op, err)
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("the read after the cut differs")
	}
}
