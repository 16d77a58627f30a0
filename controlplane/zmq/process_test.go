package zmq

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestCrossProcess exchanges messages with a child process (this test
// binary re-executed in its child role, see runChild) over real TCP.
func TestCrossProcess(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Skipf("cannot locate test binary: %v", err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	t.Cleanup(func() {
		if !waited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})

	line, err := bufio.NewReader(stdout).ReadString('\n')
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
	if _, err := fmt.Fprintln(stdin, parent.LocalEndpoint()); err != nil {
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

	waited = true
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child exited: %v", err)
	}
	st := parent.Stats()
	if st.Sent != n+2 || st.Received != n+1 || st.Dropped != 0 {
		t.Fatalf("parent stats %+v, want sent %d received %d dropped 0", st, n+2, n+1)
	}
}
