package zmq

import (
	"fmt"
	"strings"
	"testing"

	"github.com/bouncekv/bounce/internal/childproc"
)

// TestCrossProcess exchanges messages with a child process (this test
// binary re-executed in its child role, see runChild) over real TCP.
func TestCrossProcess(t *testing.T) {
	c := childproc.Start(t, childEnv, "1")
	line, err := c.Next(0)
	if err != nil {
		t.Fatalf("read child endpoint: %v", err)
	}
	childEP := strings.TrimSpace(line)
	if !strings.HasPrefix(childEP, "tcp://127.0.0.1:") {
		t.Fatalf("child endpoint %q, want tcp://127.0.0.1:<port>", childEP)
	}

	parent := newTestChannel(t, "parent")
	if err := parent.AddPeer("child", childEP); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintln(c.Stdin, parent.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}

	const n = 200
	for i := range n {
		mustSend(t, parent, "child", fmt.Sprintf("msg-%d", i))
	}
	for i := range n {
		expectMsg(t, parent, "child", fmt.Sprintf("echo:msg-%d", i))
	}
	mustSend(t, parent, "child", "bye")
	expectMsg(t, parent, "child", "bye-ack")
	mustSend(t, parent, "child", "done")

	if err := c.Wait(); err != nil {
		t.Fatalf("child exited: %v", err)
	}
	st := parent.Stats()
	if st.Sent != n+2 || st.Received != n+1 || st.Dropped != 0 {
		t.Fatalf("parent stats %+v, want sent %d received %d dropped 0", st, n+2, n+1)
	}
}
