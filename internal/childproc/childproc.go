// Package childproc runs the current test binary again as a child process
// in a role chosen by an environment variable, for tests that need a peer
// in another process. The test binary's TestMain checks Role and, when it
// is not empty, runs the role's code instead of the tests.
package childproc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ErrTimeout is returned by Child.Next when no line came in time.
var ErrTimeout = errors.New("childproc: no line from the child in time")

// Role is the role the current process was started in by Start with the
// same env, or "" in the parent (env not set).
func Role(env string) string { return os.Getenv(env) }

// Child is a running re-executed test binary. Its stdout is read line by
// line from the start (so the child never blocks writing it) and its
// stderr is the parent's.
type Child struct {
	// Cmd is the started command.
	Cmd *exec.Cmd
	// Stdin is the child's standard input.
	Stdin io.WriteCloser

	mu    sync.Mutex
	lines []string      // read, not yet taken by Next
	more  chan struct{} // a token when lines grew
	eof   chan struct{} // closed after the last line is queued

	waitOnce sync.Once
	waitErr  error
}

// Start runs the test binary (os.Executable, or os.Args[0] where that
// fails) with -test.run=^$ and env=role added to the current environment,
// followed by extraEnv ("NAME=value" each). It registers Close as a cleanup
// of t. It fails t if the child cannot be started.
func Start(t testing.TB, env, role string, extraEnv ...string) *Child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), env+"="+role), extraEnv...)
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
		t.Fatalf("start child %s=%s: %v", env, role, err)
	}
	c := &Child{Cmd: cmd, Stdin: stdin, more: make(chan struct{}, 1), eof: make(chan struct{})}
	go c.read(stdout)
	t.Cleanup(c.Close)
	return c
}

// read queues every line of r until it ends.
func (c *Child) read(r io.Reader) {
	defer close(c.eof)
	br := bufio.NewReader(r)
	for {
		l, err := br.ReadString('\n')
		if l != "" {
			c.mu.Lock()
			c.lines = append(c.lines, strings.TrimSuffix(strings.TrimSuffix(l, "\n"), "\r"))
			c.mu.Unlock()
			select {
			case c.more <- struct{}{}:
			default:
			}
		}
		if err != nil {
			return
		}
	}
}

// Next returns the child's next stdout line, without its line ending. It
// waits at most timeout (without limit when timeout <= 0) and then returns
// ErrTimeout; once the child's stdout ended and every line was taken it
// returns io.EOF.
func (c *Child) Next(timeout time.Duration) (string, error) {
	var expired <-chan time.Time
	if timeout > 0 {
		tm := time.NewTimer(timeout)
		defer tm.Stop()
		expired = tm.C
	}
	for {
		c.mu.Lock()
		if len(c.lines) > 0 {
			l := c.lines[0]
			c.lines = c.lines[1:]
			c.mu.Unlock()
			return l, nil
		}
		c.mu.Unlock()
		select {
		case <-c.eof:
			c.mu.Lock()
			n := len(c.lines)
			c.mu.Unlock()
			if n == 0 {
				return "", io.EOF
			}
		case <-c.more:
		case <-expired:
			return "", fmt.Errorf("%w (%v)", ErrTimeout, timeout)
		}
	}
}

// Kill sends SIGKILL to the child; it does not wait for it (see Wait).
func (c *Child) Kill() error { return c.Cmd.Process.Kill() }

// Stop sends SIGSTOP to the child: it stays alive but runs no more until
// it is killed.
func (c *Child) Stop() error { return c.Cmd.Process.Signal(syscall.SIGSTOP) }

// Wait waits until the child's stdout ended and the child exited, and
// returns its exit error as exec.Cmd.Wait does. Later calls return the same
// error without waiting again.
func (c *Child) Wait() error {
	c.waitOnce.Do(func() {
		<-c.eof
		c.waitErr = c.Cmd.Wait()
	})
	return c.waitErr
}

// Close ends the child at once: it closes the child's stdin, kills it and
// waits for it. Start registers it as a cleanup of the test; calling it
// earlier, or more than once, is harmless.
func (c *Child) Close() {
	c.Stdin.Close()
	c.Kill()
	c.Wait()
}
