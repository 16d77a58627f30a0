// Package plugins runs any of bounce's five components — an engine, a
// control channel, a gather stage, a scatter stage or a writer — in a
// separate process on hashicorp/go-plugin over gRPC.
//
// The host loads a plugin binary with Load (or LoadSpec) and gets ordinary
// transfer.Engine, transfer.ControlChannel, transfer.Gatherer,
// transfer.Scatterer or transfer.Writer values whose methods are gRPC
// calls; a plugin author wraps implementations in a one-line main with
// Serve. Operations cross the wire as handles that the host polls (one call
// per chunk, never per descriptor); errors carry their transfer sentinels,
// so errors.Is works on the host. KV bytes never cross gRPC: host memory
// given to a plugin is memfd-backed (mem.Alloc, mem.NewArena) and the plugin
// maps it at the same virtual addresses (see docs/PLUGINS.md).
//
// Plugins are secure by default: the connection is mutually authenticated
// TLS (go-plugin's AutoMTLS), a binary can be pinned by its SHA-256
// (Spec.Checksum), and the plugin's environment holds only what Spec.Env
// lists unless Spec.InheritEnv is set. One plugin process serves one
// instance: closing the component a Client opened also closes the Client
// and ends the process.
package plugins

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/bouncekv/bounce/mem"
	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	"github.com/bouncekv/bounce/transfer"
)

// Plugin kinds, as dispensed by go-plugin and accepted by Load.
const (
	KindEngine  = "engine"
	KindControl = "control"
	KindGather  = "gather"
	KindScatter = "scatter"
	KindWriter  = "writer"
)

// Kinds lists the plugin kinds Load accepts.
func Kinds() []string { return []string{KindEngine, KindControl, KindGather, KindScatter, KindWriter} }

// Timeouts of the host side.
const (
	// StartTimeout bounds starting a plugin process and its handshake.
	StartTimeout = 10 * time.Second
	// CallTimeout bounds every gRPC call that is not a bounded wait.
	CallTimeout = 5 * time.Second
	// PollTimeout bounds one Poll call; a Poll that gets no reply in time
	// reports Pending (the op may still run) unless the plugin is gone.
	PollTimeout = 750 * time.Millisecond
	// waitSlack is added to the caller's timeout of a blocking receive.
	waitSlack = 2 * time.Second
)

// ProtocolVersion is the version of the bounce plugin protocol this
// package speaks. Host and plugin must speak the same one: a plugin built
// against another version is refused at start with a message naming both.
// Version 1 was engines and control channels without mTLS; version 2 adds
// the stage and writer services.
const ProtocolVersion = 2

// Handshake is the go-plugin handshake bounce hosts and plugins share. A
// binary started without the cookie refuses to run as a plugin. The
// versions themselves are negotiated through go-plugin's versioned plugin
// sets (ProtocolVersion).
func Handshake() plugin.HandshakeConfig {
	return plugin.HandshakeConfig{
		ProtocolVersion:  ProtocolVersion,
		MagicCookieKey:   "BOUNCE_PLUGIN",
		MagicCookieValue: "bounce-kv-plugin-v1",
	}
}

// ServeOpts lists the constructors a plugin binary offers; nil ones are not
// served. Each gets the agent's name and the options the host passes (see
// docs/PLUGINS.md, "Options the host passes").
type ServeOpts struct {
	// Engine opens the engine. Options: engine.options and the plugin
	// block's options, plus "listen" and "connections" when set.
	Engine func(name string, opts map[string]string) (transfer.Engine, error)
	// Control opens the control channel. Options: the plugin block's
	// options plus "bind_address", "interface" and "send_hwm" when set.
	Control func(name string, opts map[string]string) (transfer.ControlChannel, error)
	// Gatherer opens the gather stage. reg holds the host memory the host
	// shared with this process (mapped at the same addresses); validate
	// every run against it. Options: the plugin block's options plus
	// "copy_contexts" and "copy_workers".
	Gatherer func(name string, opts map[string]string, reg *mem.Registry) (transfer.Gatherer, error)
	// Scatterer opens the scatter stage, like Gatherer.
	Scatterer func(name string, opts map[string]string, reg *mem.Registry) (transfer.Scatterer, error)
	// Writer opens the writer. engine is the host's engine, reached back
	// over the plugin connection: PostWrite, Poll, Metadata, Name and
	// Notify work; the host alone registers memory, loads peers and
	// closes it. A writer that implements io.Closer is closed with the
	// plugin. Options: the plugin block's options.
	Writer func(name string, opts map[string]string, engine transfer.Engine) (transfer.Writer, error)
	// TracerProvider and Propagator trace the calls the host makes for a
	// traced operation (their spans join the host's trace); nil means the
	// otel globals. A plugin's environment is explicit (Spec.Env): list the
	// OTEL_* variables in its plugin block's env (or set inherit_env) for a
	// provider built from them to export where the host does.
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator
}

// Serve runs the plugin side until the host ends the process. It is the
// whole main of a plugin binary:
//
//	func main() { plugins.Serve(plugins.ServeOpts{Engine: newEngine}) }
//
// The plugin must not write to stdout before Serve (the handshake uses
// it); what it writes to stderr, before Serve or after, reaches the host's
// log, one record per line, tagged with the plugin's name.
func Serve(o ServeOpts) {
	var se stderrBack
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  Handshake(),
		VersionedPlugins: map[int]plugin.PluginSet{ProtocolVersion: serverPlugins(o, newMapper())},
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return plugin.DefaultGRPCServer(append(opts,
				grpc.StatsHandler(serverTracing(o.TracerProvider, o.Propagator)),
				grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
					se.restore()
					return h(ctx, req)
				}),
				grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
					se.restore()
					return h(srv, ss)
				})))
		},
	})
}

// stderrBack points the plugin's os.Stderr at the process's own stderr
// again. go-plugin's Serve replaces os.Stderr by a pipe into its stdio
// stream, which the host reads asynchronously: a line written just before
// the process dies (a crash, os.Exit) would be lost with what was still in
// the pipe. At the first call from the host (Serve has replaced os.Stderr
// by then) restore makes the pipe's descriptor a duplicate of descriptor 2,
// so every later write lands synchronously where the host reads the
// process's stderr; the stream's end of the pipe sees end of file.
type stderrBack struct{ once sync.Once }

func (s *stderrBack) restore() {
	s.once.Do(func() {
		if fd := int(os.Stderr.Fd()); fd != 2 {
			_ = unix.Dup3(2, fd, unix.O_CLOEXEC)
		}
	})
}

// serverPlugins is the plugin-side go-plugin table for o.
func serverPlugins(o ServeOpts, m *mapper) plugin.PluginSet {
	ps := plugin.PluginSet{}
	if o.Engine != nil {
		ps[KindEngine] = &grpcPlugin{server: func(_ *plugin.GRPCBroker, s *grpc.Server) {
			pb.RegisterEngineServer(s, &engineServer{open: o.Engine, maps: m})
		}}
	}
	if o.Control != nil {
		ps[KindControl] = &grpcPlugin{server: func(_ *plugin.GRPCBroker, s *grpc.Server) {
			pb.RegisterControlServer(s, &controlServer{open: o.Control})
		}}
	}
	if o.Gatherer != nil {
		ps[KindGather] = &grpcPlugin{server: func(_ *plugin.GRPCBroker, s *grpc.Server) {
			pb.RegisterGatherServer(s, newStageServer(KindGather, m, func(name string, opts map[string]string, reg *mem.Registry) (stageImpl, error) {
				g, err := o.Gatherer(name, opts, reg)
				if err != nil {
					return nil, err
				}
				return gatherImpl{g}, nil
			}))
		}}
	}
	if o.Scatterer != nil {
		ps[KindScatter] = &grpcPlugin{server: func(_ *plugin.GRPCBroker, s *grpc.Server) {
			pb.RegisterScatterServer(s, newStageServer(KindScatter, m, func(name string, opts map[string]string, reg *mem.Registry) (stageImpl, error) {
				sc, err := o.Scatterer(name, opts, reg)
				if err != nil {
					return nil, err
				}
				return scatterImpl{sc}, nil
			}))
		}}
	}
	if o.Writer != nil {
		ps[KindWriter] = &grpcPlugin{server: func(b *plugin.GRPCBroker, s *grpc.Server) {
			pb.RegisterWriterServer(s, &writerServer{open: o.Writer, broker: b})
		}}
	}
	return ps
}

// hostPlugins is the host-side go-plugin table: every kind, client half.
func hostPlugins() plugin.PluginSet {
	return plugin.PluginSet{
		KindEngine:  &grpcPlugin{client: func(c *grpc.ClientConn, _ *plugin.GRPCBroker) any { return pb.NewEngineClient(c) }},
		KindControl: &grpcPlugin{client: func(c *grpc.ClientConn, _ *plugin.GRPCBroker) any { return pb.NewControlClient(c) }},
		KindGather:  &grpcPlugin{client: func(c *grpc.ClientConn, _ *plugin.GRPCBroker) any { return pb.NewGatherClient(c) }},
		KindScatter: &grpcPlugin{client: func(c *grpc.ClientConn, _ *plugin.GRPCBroker) any { return pb.NewScatterClient(c) }},
		KindWriter: &grpcPlugin{client: func(c *grpc.ClientConn, b *plugin.GRPCBroker) any {
			return writerConn{rpc: pb.NewWriterClient(c), broker: b}
		}},
	}
}

// grpcPlugin is one go-plugin kind: a server registration (plugin side) or
// a client constructor (host side).
type grpcPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	server func(*plugin.GRPCBroker, *grpc.Server)
	client func(*grpc.ClientConn, *plugin.GRPCBroker) any
}

// GRPCServer registers the kind's service.
func (p *grpcPlugin) GRPCServer(b *plugin.GRPCBroker, s *grpc.Server) error {
	if p.server == nil {
		return fmt.Errorf("plugin: this side serves no such kind")
	}
	p.server(b, s)
	return nil
}

// GRPCClient returns the kind's generated client.
func (p *grpcPlugin) GRPCClient(_ context.Context, b *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	if p.client == nil {
		return nil, fmt.Errorf("plugin: this side has no client for this kind")
	}
	return p.client(c, b), nil
}

// Client is a loaded plugin process serving one kind. It opens one
// instance; closing that instance closes the Client.
type Client struct {
	kind    string
	name    string // the plugin's name in errors and log lines
	raw     any
	exited  func() bool
	status  func() string // how the process ended, once exited
	kill    func()
	pid     int
	once    sync.Once
	mu      sync.Mutex
	opened  bool
	closedC chan struct{}
	notify  func()       // wakes the host when an op completes; may be nil
	log     *slog.Logger // the host's log (Spec.Logger); never nil
	// diedFirst is the exit status of a process that had died on its own
	// before Close: errors keep naming it rather than "closed".
	diedFirst string
}

// Spec says how the host starts a plugin binary. Every field but Path has
// a secure zero value: no arguments, an environment holding only Env (and
// go-plugin's own handshake variables), no checksum pin.
type Spec struct {
	// Path is the plugin binary. A bare name means a file in the current
	// directory: plugins are never looked up in $PATH.
	Path string
	// Args are the binary's arguments.
	Args []string
	// Env is the plugin's environment, NAME=value entries.
	Env []string
	// InheritEnv passes the host's whole environment too (before Env).
	InheritEnv bool
	// Checksum, when set, pins the binary: "sha256:<64 hex digits>". A
	// binary with another digest is refused before it starts.
	Checksum string
	// Name tags the plugin's log lines and errors; default the base name
	// of Path.
	Name string
	// Logger receives the plugin's stderr, one record per line with
	// plugin=Name (info; a panic's lines error; go-plugin's own lines at
	// their level, debug); nil discards it.
	Logger *slog.Logger
	// Notify, if set, is called (it must not block) when an op of the
	// plugin completes, so the caller need not poll: node passes the
	// agent's reactor wake-up.
	Notify func()
	// TracerProvider and Propagator trace the calls made for a traced
	// operation and put its trace context in their gRPC metadata; nil
	// means the otel globals.
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator
}

// Load starts the plugin binary at path with the default Spec and connects
// to its kind service (one of Kinds). See LoadSpec.
func Load(path, kind string, logger *slog.Logger) (*Client, error) {
	return LoadSpec(Spec{Path: path, Logger: logger}, kind)
}

// LoadOpts are LoadWith's optional dependencies.
type LoadOpts struct {
	// Logger receives the plugin's log lines; nil discards them.
	Logger *slog.Logger
	// TracerProvider and Propagator trace the calls made for a traced
	// operation and put its trace context in their gRPC metadata; nil
	// means the otel globals.
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator
}

// LoadWith is Load with telemetry; LoadSpec takes both and the rest.
func LoadWith(path, kind string, o LoadOpts) (*Client, error) {
	return LoadSpec(Spec{Path: path, Logger: o.Logger, TracerProvider: o.TracerProvider, Propagator: o.Propagator}, kind)
}

// ParseChecksum decodes a "sha256:<hex>" pin.
func ParseChecksum(s string) ([]byte, error) {
	hexPart, ok := strings.CutPrefix(s, "sha256:")
	if !ok {
		return nil, fmt.Errorf("checksum %q: want sha256:<64 hex digits>", s)
	}
	sum, err := hex.DecodeString(hexPart)
	if err != nil || len(sum) != sha256.Size {
		return nil, fmt.Errorf("checksum %q: want sha256:<64 hex digits>", s)
	}
	return sum, nil
}

// FileChecksum returns the "sha256:<hex>" pin of the file at path.
func FileChecksum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// LoadSpec starts the plugin binary s describes and connects to its kind
// service over mutually authenticated TLS. Starting is bounded by
// StartTimeout; a binary that is missing, fails its checksum, is not a
// bounce plugin, speaks another protocol version or does not serve kind is
// a clear error naming the plugin and the cause.
func LoadSpec(s Spec, kind string) (*Client, error) {
	if s.Name == "" {
		s.Name = filepath.Base(s.Path)
	}
	if !validKind(kind) {
		return nil, fmt.Errorf("plugin %s: unknown kind %q; accepted: %v", s.Name, kind, Kinds())
	}
	if s.Path == "" {
		return nil, fmt.Errorf("plugin: no binary path")
	}
	// Never $PATH: a bare name is a file in the current directory.
	path, err := filepath.Abs(s.Path)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w", s.Name, err)
	}
	if st, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("plugin %s: %w", s.Name, err)
	} else if st.IsDir() || st.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("plugin %s: %s is not an executable file", s.Name, path)
	}
	var secure *plugin.SecureConfig
	if s.Checksum != "" {
		sum, err := ParseChecksum(s.Checksum)
		if err != nil {
			return nil, fmt.Errorf("plugin %s: %w", s.Name, err)
		}
		secure = &plugin.SecureConfig{Checksum: sum, Hash: sha256.New()}
	}
	for _, e := range s.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return nil, fmt.Errorf("plugin %s: env entry %q: want NAME=value", s.Name, e)
		}
	}
	cmd := exec.Command(path, s.Args...)
	cmd.Env = []string{}
	if s.InheritEnv {
		cmd.Env = append(cmd.Env, os.Environ()...)
	}
	cmd.Env = append(cmd.Env, s.Env...)
	logs := newPluginLog(s.Logger, s.Name)
	pc := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  Handshake(),
		VersionedPlugins: map[int]plugin.PluginSet{ProtocolVersion: hostPlugins()},
		Cmd:              cmd,
		SkipHostEnv:      true, // cmd.Env is the whole environment
		SecureConfig:     secure,
		AutoMTLS:         true,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		StartTimeout:     StartTimeout,
		// The process's own stderr: what the plugin wrote before Serve,
		// the log package's lines, a panic, go-plugin's JSON lines.
		Stderr: logs.raw,
		// What it writes to os.Stderr (os.Stdout) once Serve runs:
		// go-plugin replaces both by its stdio stream.
		SyncStderr: logs.stderr,
		SyncStdout: logs.stdout,
		// go-plugin's own logger would re-log stderr lines (at debug);
		// they reach Logger through Stderr instead.
		Logger:          hclog.NewNullLogger(),
		GRPCDialOptions: []grpc.DialOption{grpc.WithStatsHandler(clientTracing(s.TracerProvider, s.Propagator))},
	})
	fail := func(what string, err error) (*Client, error) {
		pc.Kill()
		logs.flush()
		return nil, fmt.Errorf("plugin %s: %s: %w", s.Name, what, explainStart(err, pc, cmd))
	}
	rpc, err := pc.Client()
	if err != nil {
		if errors.Is(err, plugin.ErrChecksumsDoNotMatch) {
			got, _ := FileChecksum(path)
			pc.Kill()
			return nil, fmt.Errorf("plugin %s: refusing to start %s: checksum mismatch: configured %s, the binary is %s", s.Name, path, s.Checksum, got)
		}
		return fail("start", err)
	}
	raw, err := rpc.Dispense(kind)
	if err != nil {
		return fail(fmt.Sprintf("it does not serve kind %q", kind), err)
	}
	c := &Client{kind: kind, name: s.Name, raw: raw, notify: s.Notify, log: orDiscard(s.Logger), exited: pc.Exited, kill: func() { pc.Kill(); logs.flush() }, closedC: make(chan struct{})}
	c.status = func() string { return exitStatus(pc, cmd) }
	if rc := pc.ReattachConfig(); rc != nil {
		c.pid = rc.Pid
	}
	return c, nil
}

// exitStatus says how the plugin process ended ("signal: killed", "exit
// status 2"), or "" while it runs. go-plugin marks Exited only after
// cmd.Wait returned, so ProcessState is set by then.
func exitStatus(pc *plugin.Client, cmd *exec.Cmd) string {
	if !pc.Exited() || cmd.ProcessState == nil {
		return ""
	}
	return cmd.ProcessState.String()
}

// explainStart turns go-plugin's start errors into one line that names
// the cause: the process's exit status, a binary that is not a bounce
// plugin, or a protocol version mismatch.
func explainStart(err error, pc *plugin.Client, cmd *exec.Cmd) error {
	msg := err.Error()
	first, _, _ := strings.Cut(msg, "\n")
	for i := 0; i < 50 && !pc.Exited(); i++ {
		time.Sleep(2 * time.Millisecond) // let the exit status land
	}
	st := exitStatus(pc, cmd)
	switch {
	case strings.Contains(msg, "incompatible API version"):
		return fmt.Errorf("it speaks another bounce plugin protocol version than this host (%d); rebuild it against this release of github.com/bouncekv/bounce/plugins: %w", ProtocolVersion, err)
	case strings.Contains(msg, "Failed to read any lines") && st != "":
		return fmt.Errorf("not a bounce plugin: it ended (%s) before the go-plugin handshake; a plugin's main calls plugins.Serve", st)
	case strings.Contains(msg, "Unrecognized remote plugin message"):
		return fmt.Errorf("not a bounce plugin: its first line on stdout is not a go-plugin handshake (%s); a plugin's main calls plugins.Serve and never prints to stdout", strings.TrimPrefix(first, "Unrecognized remote plugin message: "))
	case st != "":
		return fmt.Errorf("%s (process %s)", first, st)
	}
	return errors.New(first)
}

// newClient wraps an already connected kind client (tests: an in-process
// gRPC hop); stop ends the connection.
func newClient(kind, name string, raw any, stop func()) *Client {
	return &Client{kind: kind, name: name, raw: raw, log: orDiscard(nil), exited: func() bool { return false }, status: func() string { return "" }, kill: stop, closedC: make(chan struct{})}
}

func validKind(k string) bool {
	for _, x := range Kinds() {
		if x == k {
			return true
		}
	}
	return false
}

// Name returns the plugin's name (Spec.Name).
func (c *Client) Name() string { return c.name }

// ExitStatus says how the plugin process ended ("signal: killed", "exit
// status 1"); it is "" while the process runs.
func (c *Client) ExitStatus() string { return c.status() }

// Exited reports whether the plugin process has ended.
func (c *Client) Exited() bool { return c.exited() }

// Pid returns the plugin's process id (0 when not known).
func (c *Client) Pid() int { return c.pid }

// Close ends the plugin process. It is idempotent; operations still in
// flight resolve Failed with ErrClosed.
func (c *Client) Close() error {
	c.once.Do(func() {
		if c.exited() {
			c.mu.Lock()
			c.diedFirst = c.status()
			c.mu.Unlock()
		}
		close(c.closedC)
		c.kill()
	})
	return nil
}

func (c *Client) closed() bool {
	select {
	case <-c.closedC:
		return true
	default:
		return false
	}
}

// gone reports whether the plugin can no longer touch memory: the host
// closed it or its process exited.
func (c *Client) gone() bool { return c.closed() || c.exited() }

// claim marks the Client's one instance as opened.
func (c *Client) claim(kind string) error {
	if c.kind != kind {
		return fmt.Errorf("plugin %s: loaded as %q, not %q", c.name, c.kind, kind)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.opened {
		return fmt.Errorf("plugin %s: one plugin process serves one %s; load another", c.name, kind)
	}
	if c.closed() {
		return fmt.Errorf("plugin %s: %w", c.name, transfer.ErrClosed)
	}
	c.opened = true
	return nil
}

// rpcErr is rpcError with the Client's name, closed state and, once the
// process has exited, its exit status.
func (c *Client) rpcErr(what string, err error) error {
	what = c.name + ": " + what
	if isConnLost(err) && !c.closed() {
		// The connection usually breaks a moment before the process is
		// reaped: wait (bounded) for the exit status to name it.
		for i := 0; i < 50 && !c.exited(); i++ {
			time.Sleep(5 * time.Millisecond)
		}
	}
	c.mu.Lock()
	died := c.diedFirst
	c.mu.Unlock()
	if st := c.status(); st != "" && (!c.closed() || died != "") {
		return fmt.Errorf("plugin %s: plugin process exited (%s): %v: %w", what, st, err, transfer.ErrPeerLost)
	}
	return rpcError(what, err, c.closed())
}

func ctx(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// orDiscard returns l, or a logger that discards when l is nil.
func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// pluginLog is where a plugin process's output goes: its stderr, and
// the stdio stream go-plugin puts in place of os.Stderr and os.Stdout once
// Serve runs. Each becomes log records, one per line.
type pluginLog struct {
	raw, stderr, stdout *lineLogger
}

func newPluginLog(l *slog.Logger, name string) *pluginLog {
	l = orDiscard(l)
	return &pluginLog{
		raw:    &lineLogger{l: l, name: name, raw: true},
		stderr: &lineLogger{l: l, name: name},
		stdout: &lineLogger{l: l, name: name, stream: "stdout"},
	}
}

// flush logs the last line of each stream that lacks its newline.
func (p *pluginLog) flush() {
	p.raw.flush()
	p.stderr.flush()
	p.stdout.flush()
}

// lineLogger turns one stream of a plugin's output into log records, one
// per line, tagged plugin=<name> (and stream=stdout for stdout). A line is
// an info record except on the process's own stderr (raw): there a
// go-plugin JSON line (its hclog output) is a record at its own level with
// its message and fields, and from a "panic: " or "fatal error: " line on
// every line is an error record. Writes may split lines, so it buffers
// until the newline.
type lineLogger struct {
	l       *slog.Logger
	name    string
	stream  string
	raw     bool
	mu      sync.Mutex
	buf     []byte
	inPanic bool
}

// Write logs every complete line of p.
func (w *lineLogger) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.emit(w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > 64<<10 { // a runaway line: log what there is
		w.emit(w.buf)
		w.buf = nil
	}
	return len(p), nil
}

func (w *lineLogger) emit(line []byte) {
	s := strings.TrimRight(string(line), "\r")
	if s == "" {
		return
	}
	attrs := []any{"plugin", w.name}
	if w.stream != "" {
		attrs = append(attrs, "stream", w.stream)
	}
	if !w.raw {
		w.l.Info(s, attrs...)
		return
	}
	if lvl, msg, kv, ok := hclogLine(s); ok {
		w.l.Log(context.Background(), lvl, msg, append(attrs, kv...)...)
		return
	}
	if strings.HasPrefix(s, "panic: ") || strings.HasPrefix(s, "fatal error: ") {
		w.inPanic = true
	}
	if w.inPanic {
		w.l.Error(s, attrs...)
		return
	}
	w.l.Info(s, attrs...)
}

// hclogLine decodes a line of go-plugin's JSON log (hclog's JSONFormat:
// "@level", "@message", "@timestamp", "@module" and the fields).
func hclogLine(s string) (slog.Level, string, []any, bool) {
	if !strings.HasPrefix(s, "{") {
		return 0, "", nil, false
	}
	var m map[string]any
	if json.Unmarshal([]byte(s), &m) != nil {
		return 0, "", nil, false
	}
	level, ok1 := m["@level"].(string)
	msg, ok2 := m["@message"].(string)
	if !ok1 || !ok2 {
		return 0, "", nil, false
	}
	var lvl slog.Level
	switch level {
	case "trace", "debug":
		lvl = slog.LevelDebug
	case "info":
		lvl = slog.LevelInfo
	case "warn":
		lvl = slog.LevelWarn
	default:
		lvl = slog.LevelError
	}
	var kv []any
	for _, k := range slices.Sorted(maps.Keys(m)) {
		switch k {
		case "@level", "@message", "@timestamp":
		case "@module":
			kv = append(kv, "module", m[k])
		default:
			kv = append(kv, k, m[k])
		}
	}
	return lvl, msg, kv, true
}

// flush logs a last line without a newline.
func (w *lineLogger) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.emit(w.buf)
	w.buf = nil
}
