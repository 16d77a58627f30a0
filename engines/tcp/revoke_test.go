package tcp

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bouncekv/bounce/internal/childproc"
	"github.com/bouncekv/bounce/transfer"
)

// TestFenceCutsTricklingWrite: a peer in another process is allowed to
// write a region, sends the frame's header and trickles its payload. The
// authorization ends (the guard now refuses the region) and FenceWrites
// returns: the frame was cut, not one byte lands in the region after, and
// the peer sees its connection broken. Without the fence its payload kept
// landing for up to FrameTimeout.
func TestFenceCutsTricklingWrite(t *testing.T) {
	v := newEnv(t)
	e := v.engine("recv", func(c *Config) { c.FrameTimeout, c.IdleTimeout = time.Minute, time.Minute })
	const size = 1 << 20
	buf := v.buf(size, 0, e)
	region := buf.Desc()
	var revoked atomic.Bool
	e.SetWriteGuard(func(peer string, d transfer.Desc) (transfer.Desc, error) {
		if peer != "trickler" || revoked.Load() || !region.Contains(d.Addr, d.Len) {
			return transfer.Desc{}, fmt.Errorf("not granted: %w", transfer.ErrForbidden)
		}
		return region, nil
	})
	c := &child{Child: childproc.Start(t, childEnv, "trickle",
		"BOUNCE_TCP_TEST_ADDR="+e.Addr(), fmt.Sprintf("BOUNCE_TCP_TEST_DST=%d", region.Addr), fmt.Sprintf("BOUNCE_TCP_TEST_SIZE=%d", size)), t: t}
	c.expect("STARTED")
	deadline := time.Now().Add(hangGuard)
	for bytes.IndexByte(buf.Bytes(), 0xEE) < 0 {
		if time.Now().After(deadline) {
			t.Fatal("the trickled payload never started landing")
		}
		time.Sleep(time.Millisecond)
	}
	revoked.Store(true)
	e.FenceWrites(region)
	after := bytes.Clone(buf.Bytes())
	if n := bytes.Count(after, []byte{0xEE}); n == size {
		t.Fatal("the whole frame landed before the fence: the test proves nothing")
	}
	c.expect("CUT")
	if !bytes.Equal(buf.Bytes(), after) {
		t.Fatal("bytes landed in the region after FenceWrites returned")
	}
	if st := e.Stats(); st.FencedWrites != 1 {
		t.Fatalf("FencedWrites = %d, want 1", st.FencedWrites)
	}
}

// TestFenceSparesCompleteWrites: a frame whose payload is in (ACKed) is not
// cut by a later fence of its memory, nor is a frame landing elsewhere:
// the connection stays usable.
func TestFenceSparesCompleteWrites(t *testing.T) {
	v := newEnv(t)
	e := v.engine("recv")
	buf := v.buf(2*4096, 0, e)
	d := buf.Desc()
	e.SetWriteGuard(func(peer string, w transfer.Desc) (transfer.Desc, error) { return d, nil })
	r := dialRaw(t, e)
	r.send(helloFrame("honest"))
	r.send(writeFrameBytes(1, []segment{{d.Addr, 4096}}), bytes.Repeat([]byte{1}, 4096))
	if h, _ := r.readFrame(); h.typ != frameAck || h.id != 1 {
		t.Fatalf("reply type %d id %d, want ACK 1", h.typ, h.id)
	}
	e.FenceWrites(d)
	r.send(writeFrameBytes(2, []segment{{d.Addr + 4096, 4096}}), bytes.Repeat([]byte{2}, 4096))
	if h, _ := r.readFrame(); h.typ != frameAck || h.id != 2 {
		t.Fatalf("after the fence: reply type %d id %d, want ACK 2", h.typ, h.id)
	}
	if st := e.Stats(); st.FencedWrites != 0 {
		t.Fatalf("FencedWrites = %d, want 0", st.FencedWrites)
	}
}
