package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"
)

// receiver is a `bounce serve --stdin-control` child process.
type receiver struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan []byte
	hello hello
	blob  []byte
}

// startReceiver starts this executable as a serve child with args and waits
// (at most timeout) for its descriptor line.
func startReceiver(args []string, stderr io.Writer, timeout time.Duration) (*receiver, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	cmd := exec.Command(exe, append([]string{"serve", "--stdin-control"}, args...)...)
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start receiver: %w", err)
	}
	r := &receiver{cmd: cmd, stdin: stdin, lines: make(chan []byte, 4)}
	go func() {
		defer close(r.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			r.lines <- append([]byte(nil), sc.Bytes()...)
		}
	}()
	line, err := r.next(timeout)
	if err != nil {
		r.kill()
		return nil, fmt.Errorf("receiver did not publish its descriptor: %w", err)
	}
	if err := json.Unmarshal(line, &r.hello); err != nil {
		r.kill()
		return nil, fmt.Errorf("receiver descriptor line %q: %w", line, err)
	}
	if r.blob, err = base64.StdEncoding.DecodeString(r.hello.Descriptor); err != nil {
		r.kill()
		return nil, fmt.Errorf("receiver descriptor: %w", err)
	}
	return r, nil
}

func (r *receiver) next(timeout time.Duration) ([]byte, error) {
	select {
	case l, ok := <-r.lines:
		if !ok {
			return nil, errors.New("receiver exited")
		}
		return l, nil
	case <-time.After(timeout):
		return nil, fmt.Errorf("no answer within %v", timeout)
	}
}

// call sends one command and returns the receiver's reply as an error.
func (r *receiver) call(c command, timeout time.Duration) (reply, error) {
	b, _ := json.Marshal(c)
	if _, err := r.stdin.Write(append(b, '\n')); err != nil {
		return reply{}, fmt.Errorf("receiver %s: %w", c.Op, err)
	}
	line, err := r.next(timeout)
	if err != nil {
		return reply{}, fmt.Errorf("receiver %s: %w", c.Op, err)
	}
	var rep reply
	if err := json.Unmarshal(line, &rep); err != nil {
		return reply{}, fmt.Errorf("receiver %s: reply %q: %w", c.Op, line, err)
	}
	if !rep.OK {
		return rep, fmt.Errorf("receiver %s: %s", c.Op, rep.Error)
	}
	return rep, nil
}

// close asks the receiver to quit and waits; it kills it after a grace period.
func (r *receiver) close() error {
	_, _ = r.call(command{Op: "quit"}, 5*time.Second)
	r.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(15 * time.Second):
		r.cmd.Process.Kill()
		<-done
		return errors.New("receiver did not exit; killed")
	}
}

func (r *receiver) kill() {
	r.cmd.Process.Kill()
	r.cmd.Wait()
}
