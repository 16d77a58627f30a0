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
	"sync"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/node"
)

// receiver is a `bounce serve --stdin-control` child process, or the same
// command run in this process for engines whose agents meet only within
// one process (startLocalReceiver).
type receiver struct {
	stdin io.WriteCloser
	lines chan []byte
	hello hello
	blob  []byte
	wait  func() error // waits for the receiver to exit
	stop  func()       // kills it
	pid   int          // its process (this one's when in-process)
}

// inProcessEngines are the engine kinds whose agents reach each other only
// within one process: bounce run and bench start their receiver in-process
// for them.
var inProcessEngines = map[string]bool{"loopback": true, "cudacopy": true}

// inProcess reports whether an engine so configured reaches agents of
// this process only (cudacopy with the ipc option reaches other processes).
func inProcess(e config.EngineConfig) bool {
	if e.Kind == "cudacopy" && e.Options["ipc"] == "true" {
		return false
	}
	return inProcessEngines[e.Kind]
}

// startLocalReceiver runs serve --stdin-control with args on a goroutine
// of this process, building its agent from f, and waits (at most timeout)
// for its descriptor line.
func startLocalReceiver(f node.Factories, args []string, stderr io.Writer, timeout time.Duration) (*receiver, error) {
	cmd := newServeCmdWith(func() node.Factories { return f })
	cmd.SetArgs(append([]string{"--stdin-control"}, args...))
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	cmd.SetIn(inR)
	cmd.SetOut(outW)
	cmd.SetErr(stderr)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	done := make(chan error, 1)
	go func() {
		err := cmd.Execute()
		if err != nil {
			fmt.Fprintf(stderr, "in-process receiver: %v\n", err)
		}
		outW.Close()
		done <- err
	}()
	r := &receiver{stdin: inW, lines: make(chan []byte, 4), pid: os.Getpid()}
	var once sync.Once
	var werr error
	r.wait = func() error {
		once.Do(func() { werr = <-done })
		return werr
	}
	r.stop = func() { inW.Close(); _ = r.wait() }
	return r, r.start(outR, timeout)
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
	r := &receiver{stdin: stdin, lines: make(chan []byte, 4), wait: cmd.Wait, pid: cmd.Process.Pid}
	r.stop = func() { cmd.Process.Kill(); cmd.Wait() }
	return r, r.start(stdout, timeout)
}

// start reads the receiver's output lines and waits for its descriptor.
func (r *receiver) start(stdout io.Reader, timeout time.Duration) error {
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
		return fmt.Errorf("receiver did not publish its descriptor: %w", err)
	}
	if err := json.Unmarshal(line, &r.hello); err != nil {
		r.kill()
		return fmt.Errorf("receiver descriptor line %q: %w", line, err)
	}
	if r.blob, err = base64.StdEncoding.DecodeString(r.hello.Descriptor); err != nil {
		r.kill()
		return fmt.Errorf("receiver descriptor: %w", err)
	}
	return nil
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
	go func() { done <- r.wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(15 * time.Second):
		r.stop()
		<-done
		return errors.New("receiver did not exit; killed")
	}
}

func (r *receiver) kill() { r.stop() }
