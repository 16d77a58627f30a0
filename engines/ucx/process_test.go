package ucx

import (
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/internal/childproc"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// childEnv selects the child role when the test binary re-executes itself.
const childEnv = "BOUNCE_UCX_TEST_CHILD"

const childBufSize = 96 << 20

// childMain is the child process: an engine named "child" with one
// registered buffer. It prints its metadata as one hex line on stdout, then
// answers every "crc <n>" notification with "crc <n> <crc32 of its first n
// bytes>" to the sender, by name, without ever loading the sender.
func childMain() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "child:", err); return 1 }
	e, err := New(Config{Name: "child"})
	if err != nil {
		return fail(err)
	}
	defer e.Close()
	buf, err := mem.Alloc(childBufSize)
	if err != nil {
		return fail(err)
	}
	if err := e.RegisterMemory(buf.Desc()); err != nil {
		return fail(err)
	}
	md, err := e.Metadata()
	if err != nil {
		return fail(err)
	}
	fmt.Println(hex.EncodeToString(md))
	for {
		m, err := e.RecvNotification(time.Minute)
		if err != nil {
			return fail(err)
		}
		var n int
		if _, err := fmt.Sscanf(string(m.Payload), "crc %d", &n); err != nil || n > childBufSize {
			return fail(fmt.Errorf("bad request %q", m.Payload))
		}
		sum := crc32.ChecksumIEEE(buf.Bytes()[:n])
		if err := e.Notify(m.Peer, []byte(fmt.Sprintf("crc %d %08x", n, sum))); err != nil {
			return fail(err)
		}
	}
}

// startChild runs the child and loads its metadata into e.
func startChild(t *testing.T, e *Engine) (*childproc.Child, transfer.Desc) {
	t.Helper()
	c := childproc.Start(t, childEnv, "1")
	line, err := c.Next(0)
	if err != nil {
		t.Fatalf("reading child metadata: %v", err)
	}
	md, err := hex.DecodeString(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("child metadata: %v", err)
	}
	if _, err := e.LoadPeer(md); err != nil {
		t.Fatal(err)
	}
	info, err := decodeMetadata(md)
	if err != nil || len(info.Ranges) != 1 {
		t.Fatalf("child metadata: %+v, %v", info, err)
	}
	return c, transfer.Desc{Addr: info.Ranges[0].Addr, Len: info.Ranges[0].Len, Kind: transfer.Host}
}

// TestTwoProcesses writes into a child process, asks it by notification for
// a checksum of what it received and gets the answer over the reverse path
// the child built from the hello (it never loaded the parent).
func TestTwoProcesses(t *testing.T) {
	src := alloc(t, 8<<20)
	e := newEngine(t, Config{Name: "parent"})
	register(t, e, src)
	fill(src.Bytes(), 42)
	_, dst := startChild(t, e)
	const n = 8<<20 - 5
	op, err := e.PostWrite("child", []transfer.WriteOp{
		{Src: desc(src, 0, 3<<20), Dst: transfer.Desc{Addr: dst.Addr, Len: 3 << 20}},
		{Src: desc(src, 3<<20, n-3<<20), Dst: transfer.Desc{Addr: dst.Addr + 3<<20, Len: n - 3<<20}},
	})
	if err != nil {
		t.Fatal(err)
	}
	mustDone(t, op)
	if err := e.Notify("child", []byte(fmt.Sprintf("crc %d", n))); err != nil {
		t.Fatal(err)
	}
	m, err := e.RecvNotification(hangGuard)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("crc %d %08x", n, crc32.ChecksumIEEE(src.Bytes()[:n]))
	if m.Peer != "child" || string(m.Payload) != want {
		t.Fatalf("reply %q from %q, want %q from child", m.Payload, m.Peer, want)
	}
}

// TestChildKilledMidWrite stops the child so a large write cannot finish,
// kills it, and expects the parent's write to fail with ErrPeerLost (the
// wait is bounded by hangGuard: no hang) and the loss logged as a warning:
// a killed engine says no bye, so its end is not taken for a clean close.
func TestChildKilledMidWrite(t *testing.T) {
	src := alloc(t, 64<<20)
	lc := newLevelCounter()
	e := newEngine(t, Config{Name: "parent", Logger: slog.New(lc)})
	register(t, e, src)
	c, dst := startChild(t, e)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	op, err := e.PostWrite("child", []transfer.WriteOp{{Src: src.Desc(), Dst: transfer.Desc{Addr: dst.Addr, Len: 64 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := op.Poll(); s != transfer.Pending {
		t.Skipf("64 MiB write to a stopped process finished (%v): this transport does not need the target to progress", s)
	}
	if err := op.Release(); !errors.Is(err, transfer.ErrInUse) {
		t.Fatalf("release of pending op: %v", err)
	}
	if err := e.DeregisterMemory(src.Desc()); !errors.Is(err, transfer.ErrInUse) {
		t.Fatalf("deregister in use: %v", err)
	}
	c.Kill()
	c.Wait()
	mustFail(t, op, transfer.ErrPeerLost)
	if err := op.Release(); err != nil {
		t.Fatal(err)
	}
	if err := e.Notify("child", []byte("x")); !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("notify lost peer: %v", err)
	}
	if _, err := e.PostWrite("child", []transfer.WriteOp{{Src: desc(src, 0, 1), Dst: transfer.Desc{Addr: dst.Addr, Len: 1}}}); !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("write to lost peer: %v", err)
	}
	if err := e.DeregisterMemory(src.Desc()); err != nil {
		t.Fatalf("deregister after failure: %v", err)
	}
	if w := lc.list(); len(w) != 1 || !strings.Contains(w[0], "peer endpoint failed peer=child") {
		t.Fatalf("warnings after the kill: %q, want one naming the failed endpoint to child", w)
	}
}

// TestCloseWithWriteInFlight closes the writer while its write to a stopped
// child cannot finish: after DrainTimeout the write fails with ErrClosed and
// Close returns. (The target is another process because UCX 1.13 aborts a
// target that later processes emulated puts from a destroyed worker; see
// doc.go.)
func TestCloseWithWriteInFlight(t *testing.T) {
	src := alloc(t, 64<<20)
	e := newEngine(t, Config{Name: "parent", DrainTimeout: time.Millisecond})
	register(t, e, src)
	c, dst := startChild(t, e)
	dstAll := transfer.Desc{Addr: dst.Addr, Len: 64 << 20}
	op, err := e.PostWrite("child", []transfer.WriteOp{{Src: desc(src, 0, 1), Dst: transfer.Desc{Addr: dst.Addr, Len: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	mustDone(t, op)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	op, err = e.PostWrite("child", []transfer.WriteOp{{Src: src.Desc(), Dst: dstAll}})
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := op.Poll(); s != transfer.Pending {
		t.Skipf("64 MiB write to a stopped process finished (%v): this transport does not need the target to progress", s)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	mustFail(t, op, transfer.ErrClosed)
	if err := op.Release(); err != nil {
		t.Fatal(err)
	}
}
