package tcp

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bouncekv/bounce/engines/enginetest"
	"github.com/bouncekv/bounce/internal/childproc"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// childEnv selects a child role when the test binary is re-executed.
const childEnv = "BOUNCE_TCP_TEST_CHILD"

func TestMain(m *testing.M) {
	if role := childproc.Role(childEnv); role != "" {
		os.Exit(runChild(role))
	}
	goleak.VerifyTestMain(m)
}

// runChild is the child process: an engine named "child" with one
// registered buffer of BOUNCE_TCP_TEST_SIZE bytes. It prints "META <hex>"
// and then answers commands on stdin:
//
//	SUM          -> "SUM <sha256 of the buffer>"
//	WATCH        -> "LANDED" once the first page holds a non-zero byte
//	NOTIFY <peer> -> sends "from-child" to <peer> (learned from its HELLO)
//
// It closes the engine and exits 0 at end of input.
func runChild(role string) int {
	switch role {
	case "trickle":
		return runTrickler()
	case "flood":
		return runFlood()
	}
	if role != "sink" {
		fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
		return 2
	}
	size, err := strconv.ParseUint(os.Getenv("BOUNCE_TCP_TEST_SIZE"), 10, 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad size:", err)
		return 2
	}
	buf, err := mem.Alloc(size)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	e, err := New(Config{Name: "child", IdleTimeout: 2 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer buf.Free()
	defer e.Close()
	if err := e.RegisterMemory(buf.Desc()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	md, _ := e.Metadata()
	fmt.Printf("META %s\n", hex.EncodeToString(md))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := cutSpace(in.Text())
		switch cmd {
		case "SUM":
			fmt.Printf("SUM %x\n", sha256.Sum256(buf.Bytes()))
		case "WATCH":
			for !anyNonZero(buf.Bytes()[:4096]) {
				time.Sleep(100 * time.Microsecond)
			}
			fmt.Println("LANDED")
		case "NOTIFY":
			if err := e.Notify(arg, []byte("from-child")); err != nil {
				fmt.Println("ERR", err)
				continue
			}
			fmt.Println("NOTIFIED")
		default:
			fmt.Println("ERR unknown command", cmd)
		}
	}
	return 0
}

// runTrickler is the "trickle" child: a hostile peer named "trickler"
// that dials BOUNCE_TCP_TEST_ADDR, sends one WRITE frame for
// [BOUNCE_TCP_TEST_DST + BOUNCE_TCP_TEST_SIZE) and then its payload of
// 0xEE bytes, 1 KiB every 2 ms. It prints "STARTED" after the first KiB
// and "CUT" once the engine broke the connection.
func runTrickler() int {
	dst, err1 := strconv.ParseUint(os.Getenv("BOUNCE_TCP_TEST_DST"), 10, 64)
	size, err2 := strconv.ParseUint(os.Getenv("BOUNCE_TCP_TEST_SIZE"), 10, 64)
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "bad dst or size:", err1, err2)
		return 2
	}
	c, err := net.Dial("tcp", os.Getenv("BOUNCE_TCP_TEST_ADDR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	hello := encodeFrame(frameHello, 0, encodeMetadata(metadata{name: "trickler", addr: "127.0.0.1:9"}))
	body := binary.LittleEndian.AppendUint32(nil, 1)
	body = appendSegment(body, dst, size)
	if _, err := c.Write(append(hello, encodeFrame(frameWrite, 1, body)...)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	chunk := bytes.Repeat([]byte{0xEE}, 1024)
	for sent := uint64(0); sent < size; sent += uint64(len(chunk)) {
		c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(chunk); err != nil {
			fmt.Println("CUT")
			return 0
		}
		if sent == 0 {
			fmt.Println("STARTED")
		}
		time.Sleep(2 * time.Millisecond)
	}
	// All of it went: the engine never cut it. Wait for the reset or the
	// ACK, and say which.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var h [headerSize]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		fmt.Println("CUT")
		return 0
	}
	fmt.Println("LANDED")
	return 0
}

// runFlood is the "flood" child: BOUNCE_TCP_TEST_CONNS connections to
// BOUNCE_TCP_TEST_ADDR, each a HELLO (as "flooder", or "flooder-<i>" with
// BOUNCE_TCP_TEST_NAMES=distinct) and a WRITE frame declaring the largest
// body, all of which but its last byte is sent: every frame stays
// incomplete. It prints "SENT" once every connection sent what it could
// and holds them until its stdin closes.
func runFlood() int {
	n, err := strconv.Atoi(os.Getenv("BOUNCE_TCP_TEST_CONNS"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad conns:", err)
		return 2
	}
	distinct := os.Getenv("BOUNCE_TCP_TEST_NAMES") == "distinct"
	body := make([]byte, 4+16*MaxSegments)
	var conns []net.Conn
	done := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", os.Getenv("BOUNCE_TCP_TEST_ADDR"))
		if err != nil {
			done <- struct{}{}
			continue
		}
		conns = append(conns, c)
		name := "flooder"
		if distinct {
			name = fmt.Sprintf("flooder-%d", i)
		}
		go func() {
			defer func() { done <- struct{}{} }()
			var h [headerSize]byte
			putHeader(h[:], frameHeader{typ: frameWrite, id: 1, bodyLen: uint32(len(body))})
			msg := append(encodeFrame(frameHello, 0, encodeMetadata(metadata{name: name, addr: "127.0.0.1:9"})), h[:]...)
			msg = append(msg, body[:len(body)-1]...)
			c.SetWriteDeadline(time.Now().Add(2 * time.Second))
			c.Write(msg) // the engine may refuse it or stop reading
		}()
	}
	for range n {
		<-done
	}
	fmt.Println("SENT")
	io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
	return 0
}

func cutSpace(s string) (string, string, bool) {
	for i := range len(s) {
		if s[i] == ' ' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func anyNonZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return true
		}
	}
	return false
}

// env owns the engines and buffers of one test and closes the engines
// before it frees the memory they may touch.
type env struct {
	t       testing.TB
	engines []*Engine
	bufs    []*mem.Buffer
}

func newEnv(t testing.TB) *env {
	v := &env{t: t}
	t.Cleanup(func() {
		for _, e := range v.engines {
			if err := e.Close(); err != nil {
				t.Errorf("close %s: %v", e.Name(), err)
			}
		}
		for _, b := range v.bufs {
			b.Free()
		}
	})
	return v
}

func (v *env) engine(name string, mods ...func(*Config)) *Engine {
	v.t.Helper()
	cfg := Config{Name: name}
	for _, m := range mods {
		m(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		v.t.Fatal(err)
	}
	v.engines = append(v.engines, e)
	return e
}

// buf allocates size bytes, fills them from seed (0 leaves them zero) and
// registers them with e when e is not nil.
func (v *env) buf(size int, seed uint64, e *Engine) *mem.Buffer {
	v.t.Helper()
	b, err := mem.Alloc(uint64(size))
	if err != nil {
		v.t.Fatal(err)
	}
	v.bufs = append(v.bufs, b)
	if seed != 0 {
		fill(b.Bytes(), seed)
	}
	if e != nil {
		if err := e.RegisterMemory(b.Desc()); err != nil {
			v.t.Fatal(err)
		}
	}
	return b
}

// fill writes a seeded pattern with no zero bytes.
func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for len(b) >= 8 {
		binary.LittleEndian.PutUint64(b, r.Uint64()|0x0101010101010101)
		b = b[8:]
	}
	for i := range b {
		b[i] = byte(r.Uint32()) | 1
	}
}

// connect makes a know b (a dials b on first use).
var connect = enginetest.Load

// hangGuard bounds every wait in the tests; it is not a performance
// threshold, only a guard against a hang.
const hangGuard = 60 * time.Second

// wait blocks until op is terminal and returns its Poll result. It also
// checks the Release contract.
func wait(t testing.TB, op transfer.Op) (transfer.Status, error) {
	t.Helper()
	w := op.(*writeOp)
	select {
	case <-w.done:
	case <-time.After(hangGuard):
		t.Fatalf("operation still pending after %v", hangGuard)
	}
	st, err := op.Poll()
	if !st.Terminal() {
		t.Fatalf("done channel closed but Poll = %v", st)
	}
	if err := op.Release(); err != nil {
		t.Fatalf("release: %v", err)
	}
	if err := op.Release(); err == nil {
		t.Fatal("second release succeeded")
	}
	return st, err
}

func mustDone(t testing.TB, op transfer.Op, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if st, err := wait(t, op); st != transfer.Done || err != nil {
		t.Fatalf("op = %v, %v; want done", st, err)
	}
}

func mustFail(t testing.TB, op transfer.Op, want error) error {
	t.Helper()
	st, err := wait(t, op)
	if st != transfer.Failed || !errors.Is(err, want) {
		t.Fatalf("op = %v, %v; want failed with %v", st, err, want)
	}
	return err
}

// boundSlack is what a failure bound may overrun on a loaded machine: far
// below hangGuard, so a bound that regressed by an order of magnitude shows.
const boundSlack = 5 * time.Second

// mustFailWithin is mustFail, plus: the failure came no later than bound
// (and boundSlack) after start.
func mustFailWithin(t testing.TB, op transfer.Op, want error, start time.Time, bound time.Duration) {
	t.Helper()
	mustFail(t, op, want)
	if took := time.Since(start); took > bound+boundSlack {
		t.Fatalf("op failed after %v; the engine's bound is %v", took, bound)
	}
}

// eventually polls cond until it holds, within hangGuard.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v", what, hangGuard)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func sub(b *mem.Buffer, off, n int) transfer.Desc {
	return mem.DescOf(b.Bytes()[off : off+n])
}
