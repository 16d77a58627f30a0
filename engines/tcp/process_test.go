package tcp

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/internal/childproc"
	"github.com/bouncekv/bounce/transfer"
)

// child is the test binary re-executed in the "sink" role (see runChild).
type child struct {
	*childproc.Child
	t testing.TB
}

func startChild(t testing.TB, size int) *child {
	t.Helper()
	return &child{Child: childproc.Start(t, childEnv, "sink", fmt.Sprintf("BOUNCE_TCP_TEST_SIZE=%d", size)), t: t}
}

// expect returns the rest of the next line, which must start with prefix.
func (c *child) expect(prefix string) string {
	c.t.Helper()
	l, err := c.Next(hangGuard)
	switch {
	case errors.Is(err, io.EOF):
		c.t.Fatalf("child exited while waiting for %q", prefix)
	case err != nil:
		c.t.Fatalf("child silent for %v waiting for %q", hangGuard, prefix)
	case !strings.HasPrefix(l, prefix):
		c.t.Fatalf("child said %q, want %q", l, prefix)
	}
	return strings.TrimSpace(strings.TrimPrefix(l, prefix))
}

func (c *child) send(cmd string) {
	c.t.Helper()
	if _, err := fmt.Fprintln(c.Stdin, cmd); err != nil {
		c.t.Fatal(err)
	}
}

func (c *child) load(t testing.TB, a *Engine) transfer.Desc {
	t.Helper()
	md, err := hex.DecodeString(c.expect("META "))
	if err != nil {
		t.Fatal(err)
	}
	if name, err := a.LoadPeer(md); err != nil || name != "child" {
		t.Fatalf("load child: %q, %v", name, err)
	}
	m, _ := decodeMetadata(md)
	return m.ranges[0]
}

func TestTwoProcesses(t *testing.T) {
	const size = 24 << 20
	c := startChild(t, size)
	v := newEnv(t)
	a := v.engine("parent")
	src := v.buf(size, 51, a)
	dst := c.load(t, a)
	// Cover the child's buffer with ops of random sizes (1 B .. 2 MiB) in a
	// random order, all in one post.
	r := rand.New(rand.NewPCG(52, 53))
	var ops []transfer.WriteOp
	for off := 0; off < size; {
		n := min(size-off, 1+r.IntN(2<<20))
		if r.IntN(4) == 0 {
			n = min(size-off, 1+r.IntN(64))
		}
		ops = append(ops, transfer.WriteOp{Src: sub(src, off, n), Dst: transfer.Desc{Addr: dst.Addr + uint64(off), Len: uint64(n)}})
		off += n
	}
	r.Shuffle(len(ops), func(i, j int) { ops[i], ops[j] = ops[j], ops[i] })
	op, err := a.PostWrite("child", ops)
	mustDone(t, op, err)
	c.send("SUM")
	if got, want := c.expect("SUM "), fmt.Sprintf("%x", sha256.Sum256(src.Bytes())); got != want {
		t.Fatalf("child checksum %s, want %s (%d ops)", got, want, len(ops))
	}
	// The child answers over the reverse path, knowing the parent only from
	// its HELLO.
	c.send("NOTIFY parent")
	c.expect("NOTIFIED")
	if m := recv(t, a); m.Peer != "child" || string(m.Payload) != "from-child" {
		t.Fatalf("notification from child = {%q %q}", m.Peer, m.Payload)
	}
}

func TestKillChildMidWrite(t *testing.T) {
	const size = 16 << 20
	c := startChild(t, size)
	v := newEnv(t)
	cfg := func(c *Config) { c.IdleTimeout, c.WriteTimeout = 2*time.Second, 5*time.Second }
	a := v.engine("parent", cfg)
	src := v.buf(size, 54, a)
	dst := c.load(t, a)
	// 4 GiB in 16 MiB writes over the same destination: the child is
	// killed long before it could all land.
	ops := make([]transfer.WriteOp, 256)
	for i := range ops {
		ops[i] = transfer.WriteOp{Src: src.Desc(), Dst: dst}
	}
	op, err := a.PostWrite("child", ops)
	if err != nil {
		t.Fatal(err)
	}
	c.send("WATCH")
	c.expect("LANDED")
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	// The bound is WriteTimeout or 2×IdleTimeout; a killed process is
	// usually seen at once through the reset connection. wait's guard is
	// far above the bound.
	killed := time.Now()
	mustFailWithin(t, op, transfer.ErrPeerLost, killed, min(DefaultWriteTimeout, 2*DefaultIdleTimeout))
	t.Logf("failed %v after the kill", time.Since(killed))
}
