//go:build nixl

package nixl

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/internal/childproc"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// childEnv selects the child role when the test binary re-executes itself.
const childEnv = "BOUNCE_NIXL_TEST_CHILD"

const childBufSize = 32 << 20

// childMain is the child process: an engine named "child" with one
// registered buffer. It prints its metadata as one hex line, reads the
// parent's as one hex line from stdin and loads it, then answers every
// "crc <n>" notification with "crc <n> <crc32 of its first n bytes>".
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
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		return fail(err)
	}
	pmd, err := hex.DecodeString(strings.TrimSpace(line))
	if err != nil {
		return fail(err)
	}
	if _, err := e.LoadPeer(pmd); err != nil {
		return fail(err)
	}
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

// TestTwoProcesses writes into another process's memory and checks the
// bytes there through a notification round trip.
func TestTwoProcesses(t *testing.T) {
	c := childproc.Start(t, childEnv, "1")
	defer c.Close()
	// NIXL itself prints to stdout ("Loaded plugin ..."): the metadata is
	// the line holding the hex of the envelope's magic.
	var cmd2 []byte
	for cmd2 == nil {
		line, err := c.Next(0)
		if err != nil {
			t.Fatalf("child metadata: %v", err)
		}
		if line = strings.TrimSpace(line); strings.HasPrefix(line, hex.EncodeToString([]byte(mdMagic))) {
			if cmd2, err = hex.DecodeString(line); err != nil {
				t.Fatal(err)
			}
		}
	}
	e := newEngine(t, Config{Name: "parent"})
	buf := alloc(t, childBufSize)
	register(t, e, buf)
	peer, err := e.LoadPeer(cmd2)
	if err != nil || peer != "child" {
		t.Fatalf("load child: %q %v", peer, err)
	}
	m, err := decodeMetadata(cmd2)
	if err != nil || len(m.ranges) != 1 {
		t.Fatalf("child ranges: %v %v", m.ranges, err)
	}
	dst := m.ranges[0]
	md, err := e.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c.Stdin, hex.EncodeToString(md)+"\n"); err != nil {
		t.Fatal(err)
	}
	for i, n := range []uint64{1, 4097, 1 << 20, childBufSize} {
		fill(buf.Bytes()[:n], uint64(100+i))
		op, err := e.PostWrite("child", []transfer.WriteOp{{Src: sub(buf, 0, n), Dst: transfer.Desc{Addr: dst.Addr, Len: n}}})
		if err != nil {
			t.Fatal(err)
		}
		mustDone(t, op)
		if err := e.Notify("child", []byte(fmt.Sprintf("crc %d", n))); err != nil {
			t.Fatal(err)
		}
		reply := recv(t, e)
		want := fmt.Sprintf("crc %d %08x", n, crc32.ChecksumIEEE(buf.Bytes()[:n]))
		if reply.Peer != "child" || string(reply.Payload) != want {
			t.Fatalf("%d bytes: child answered %q from %q, want %q", n, reply.Payload, reply.Peer, want)
		}
	}
}
