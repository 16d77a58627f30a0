package childproc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

const roleEnv = "BOUNCE_CHILDPROC_TEST_ROLE"

func TestMain(m *testing.M) {
	if role := Role(roleEnv); role != "" {
		os.Exit(runChild(role))
	}
	goleak.VerifyTestMain(m)
}

// runChild is the child: in role "echo" it prints "ready <extra>" (extra
// from BOUNCE_CHILDPROC_TEST_EXTRA) and then "echo <line>" for every line
// of stdin, exiting 3 at end of input; in role "mute" it prints nothing
// and waits for stdin to end; in role "hang" it only sleeps.
func runChild(role string) int {
	switch role {
	case "echo":
		fmt.Printf("ready %s\n", os.Getenv("BOUNCE_CHILDPROC_TEST_EXTRA"))
		for in := bufio.NewScanner(os.Stdin); in.Scan(); {
			fmt.Printf("echo %s\n", in.Text())
		}
		return 3
	case "mute":
		io.Copy(io.Discard, os.Stdin)
		return 0
	case "hang":
		time.Sleep(time.Hour)
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown role %q\n", role)
	return 2
}

const guard = time.Minute

func next(t *testing.T, c *Child, want string) {
	t.Helper()
	l, err := c.Next(guard)
	if err != nil || l != want {
		t.Fatalf("Next = %q, %v; want %q", l, err, want)
	}
}

func TestRoleOfParent(t *testing.T) {
	if r := Role(roleEnv); r != "" {
		t.Fatalf("parent role %q", r)
	}
}

// TestExchange starts an echo child, exchanges lines with it, ends its
// input and checks its exit status.
func TestExchange(t *testing.T) {
	c := Start(t, roleEnv, "echo", "BOUNCE_CHILDPROC_TEST_EXTRA=x y")
	next(t, c, "ready x y")
	for _, s := range []string{"a", "", "b c"} {
		if _, err := fmt.Fprintln(c.Stdin, s); err != nil {
			t.Fatal(err)
		}
	}
	next(t, c, "echo a")
	next(t, c, "echo ")
	next(t, c, "echo b c")
	c.Stdin.Close()
	if l, err := c.Next(guard); err != io.EOF {
		t.Fatalf("Next after end of input = %q, %v; want io.EOF", l, err)
	}
	var ee *exec.ExitError
	if err := c.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("Wait = %v, want exit status 3", err)
	}
	if err := c.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("second Wait = %v, want exit status 3", err)
	}
	c.Close()
}

// TestUnreadLines: a child that prints more than a pipe holds while the
// parent reads nothing does not block, and every line is kept in order.
func TestUnreadLines(t *testing.T) {
	c := Start(t, roleEnv, "echo")
	const n = 20000 // about 300 KiB of output
	for i := range n {
		fmt.Fprintf(c.Stdin, "%d\n", i)
	}
	c.Stdin.Close()
	c.Wait()
	next(t, c, "ready ")
	for i := range n {
		next(t, c, fmt.Sprintf("echo %d", i))
	}
}

// TestTimeoutStopKill: Next times out on a silent child, a stopped child
// is still there, and a killed one ends with SIGKILL.
func TestTimeoutStopKill(t *testing.T) {
	c := Start(t, roleEnv, "mute")
	if l, err := c.Next(10 * time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Next from a silent child = %q, %v; want ErrTimeout", l, err)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(); !killed(err) {
		t.Fatalf("Wait after kill = %v, want killed by SIGKILL", err)
	}
	if _, err := c.Next(guard); err != io.EOF {
		t.Fatalf("Next from a dead child: %v, want io.EOF", err)
	}
}

// killed reports whether err is the exit error of a process SIGKILL ended.
func killed(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// TestCleanup: the cleanup Start registers kills and waits for a child
// that would otherwise run for an hour.
func TestCleanup(t *testing.T) {
	var c *Child
	t.Run("start", func(t *testing.T) { c = Start(t, roleEnv, "hang") })
	if c.Cmd.ProcessState == nil {
		t.Fatal("child not waited for after the subtest's cleanup")
	}
	if err := c.Wait(); !killed(err) {
		t.Fatalf("child after cleanup: %v, want killed by SIGKILL", err)
	}
}
