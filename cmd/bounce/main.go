// Command bounce moves LLM KV cache between agents through the bounce-buffer
// pipeline. Run `bounce --help` for the subcommands; `bounce run` is the main
// job: two agent processes move a KV-shaped transfer, verify it byte for byte
// and print a summary.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/discovery"
	"github.com/bouncekv/bounce/security"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailed  = 1 // the job ran and failed: a transfer, a verification, a rule
	exitUsage   = 2 // bad flags, bad configuration
	exitRuntime = 3 // the environment failed: a child process, a socket
)

// exitError carries an exit code with the error.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func failed(err error) error  { return &exitError{exitFailed, err} }
func usage(err error) error   { return &exitError{exitUsage, err} }
func runtime(err error) error { return &exitError{exitRuntime, err} }

// classify gives err the exit code of its class where the cause says it
// (README, "Exit codes"): the environment failed (3) for an etcd that does
// not answer, an agent name a live agent holds, an address in use or not
// on this host; bad configuration (2) for a bad agent name or key file.
// Anything else gets otherwise's code.
func classify(err error, otherwise func(error) error) error {
	switch {
	case errors.Is(err, discovery.ErrUnavailable), errors.Is(err, discovery.ErrDuplicate),
		errors.Is(err, syscall.EADDRINUSE), errors.Is(err, syscall.EADDRNOTAVAIL):
		return runtime(err)
	case errors.Is(err, discovery.ErrBadName), errors.Is(err, security.ErrKeyFileMode):
		return usage(err)
	}
	return otherwise(err)
}

func main() {
	os.Exit(execute(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// execute runs the CLI and returns the exit code.
func execute(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRoot(stdin, stdout, stderr)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "bounce:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return exitUsage // cobra's own errors are about flags and arguments
}

func newRoot(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "bounce",
		Short: "Move LLM KV cache between agents through a bounce-buffer pipeline",
		Long: `bounce gathers thousands of small scattered KV blocks into one registered
region, writes it to a region the receiving agent granted in one bulk
transfer, and scatters it back on the receiver — with credit flow control,
fair sharing of one receiver by many senders, and a strict rule that no
caller frees memory a transport may still touch.

Exit codes: 0 success; 1 the job failed (a transfer, a verification, a
conformance rule); 2 bad usage or configuration (a flag, a key, a key
file); 3 the environment failed (etcd unreachable, agent name in use,
address in use, a child or plugin process).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       versionText(),
	}
	root.SetVersionTemplate("{{.Version}}")
	root.SetFlagErrorFunc(suggestFlag)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newRunCmd(), newServeCmd(), newSendCmd(), newPullCmd(), newConfigCmd(), newVersionCmd(), newKeyCmd())
	for _, c := range extraCommands() {
		root.AddCommand(c)
	}
	return root
}

// suggestFlag adds "did you mean" to an unknown flag error, from the
// command's flags (configuration keys included).
func suggestFlag(cmd *cobra.Command, err error) error {
	name, ok := strings.CutPrefix(err.Error(), "unknown flag: --")
	if !ok {
		return err
	}
	name, _, _ = strings.Cut(name, "=")
	var names, under []string
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		names = append(names, f.Name)
		if strings.HasPrefix(f.Name, name+".") {
			under = append(under, f.Name)
		}
	})
	// A section given as a flag (--engine tcp): its kind, else its keys.
	if len(under) > 0 {
		if slices.Contains(under, name+".kind") {
			return fmt.Errorf("%w; did you mean --%s.kind?", err, name)
		}
		if len(under) > 4 {
			under = append(under[:4], "...")
		}
		return fmt.Errorf("%w; %s is a section: its keys are --%s", err, name, strings.Join(under, ", --"))
	}
	if s := config.DidYouMean(name, names); s != "" {
		return fmt.Errorf("%w%s", err, strings.Replace(s, `"`, `"--`, 1))
	}
	return err
}
