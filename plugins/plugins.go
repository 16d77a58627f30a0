// Package plugins runs bounce engines and control channels in separate
// processes on hashicorp/go-plugin over gRPC. (Gather and scatter stage
// plugins are not served yet; the wire protocol reserves a Stage service for
// them.)
//
// The host loads a plugin binary with Load and gets ordinary transfer.Engine
// or transfer.ControlChannel values whose methods are gRPC calls; a plugin author wraps an implementation in a
// one-line main with Serve. Operations cross the wire as handles that the
// host polls; errors carry their transfer sentinels, so errors.Is works on
// the host. KV bytes never cross gRPC: host memory registered with a plugin
// is memfd-backed (mem.Alloc, mem.NewArena) and the plugin maps it at the
// same virtual addresses (see docs/PLUGINS.md).
//
// One plugin process serves one instance: closing the engine or channel a
// Client opened also closes the Client and ends the process.
package plugins

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	"github.com/bouncekv/bounce/transfer"
)

// Plugin kinds, as dispensed by go-plugin and accepted by Load.
const (
	KindEngine  = "engine"
	KindControl = "control"
)

// Kinds lists the plugin kinds Load accepts.
func Kinds() []string { return []string{KindEngine, KindControl} }

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

// Handshake is the go-plugin handshake bounce hosts and plugins share. A
// binary started without the cookie refuses to run as a plugin.
func Handshake() plugin.HandshakeConfig {
	return plugin.HandshakeConfig{
		ProtocolVersion:  1,
		MagicCookieKey:   "BOUNCE_PLUGIN",
		MagicCookieValue: "bounce-kv-plugin-v1",
	}
}

// ServeOpts lists the constructors a plugin binary offers; nil ones are not
// served. Options come from the host's configuration (engine.options, plus
// "listen" and "connections" when set; control_plane fields
// "bind_address", "interface" and "send_hwm").
type ServeOpts struct {
	Engine  func(name string, opts map[string]string) (transfer.Engine, error)
	Control func(name string, opts map[string]string) (transfer.ControlChannel, error)
	// TracerProvider and Propagator trace the calls the host makes for a
	// traced operation (their spans join the host's trace); nil means the
	// otel globals. The plugin process inherits the host's environment, so
	// a provider built from OTEL_* variables exports where the host does.
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator
}

// Serve runs the plugin side until the host ends the process. It is the
// whole main of a plugin binary:
//
//	func main() { plugins.Serve(plugins.ServeOpts{Engine: newEngine}) }
func Serve(o ServeOpts) {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake(),
		Plugins:         serverPlugins(o, newMapper()),
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return plugin.DefaultGRPCServer(append(opts, grpc.StatsHandler(serverTracing(o.TracerProvider, o.Propagator))))
		},
	})
}

// serverPlugins is the plugin-side go-plugin table for o.
func serverPlugins(o ServeOpts, m *mapper) plugin.PluginSet {
	ps := plugin.PluginSet{}
	if o.Engine != nil {
		ps[KindEngine] = &grpcPlugin{server: func(s *grpc.Server) {
			pb.RegisterEngineServer(s, &engineServer{open: o.Engine, maps: m})
		}}
	}
	if o.Control != nil {
		ps[KindControl] = &grpcPlugin{server: func(s *grpc.Server) {
			pb.RegisterControlServer(s, &controlServer{open: o.Control})
		}}
	}
	return ps
}

// hostPlugins is the host-side go-plugin table: every kind, client half.
func hostPlugins() plugin.PluginSet {
	return plugin.PluginSet{
		KindEngine:  &grpcPlugin{client: func(c *grpc.ClientConn) any { return pb.NewEngineClient(c) }},
		KindControl: &grpcPlugin{client: func(c *grpc.ClientConn) any { return pb.NewControlClient(c) }},
	}
}

// grpcPlugin is one go-plugin kind: a server registration (plugin side) or
// a client constructor (host side).
type grpcPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	server func(*grpc.Server)
	client func(*grpc.ClientConn) any
}

// GRPCServer registers the kind's service.
func (p *grpcPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	if p.server == nil {
		return fmt.Errorf("plugin: this side serves no such kind")
	}
	p.server(s)
	return nil
}

// GRPCClient returns the kind's generated client.
func (p *grpcPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	if p.client == nil {
		return nil, fmt.Errorf("plugin: this side has no client for this kind")
	}
	return p.client(c), nil
}

// Client is a loaded plugin process serving one kind. It opens one
// instance; closing that instance closes the Client.
type Client struct {
	kind    string
	path    string
	raw     any
	exited  func() bool
	kill    func()
	pid     int
	once    sync.Once
	mu      sync.Mutex
	opened  bool
	closedC chan struct{}
}

// Load starts the plugin binary at path and connects to its kind service
// ("engine", "control", "gather" or "scatter"). Starting is bounded by
// StartTimeout; the plugin's log lines go to logger (nil discards them).
func Load(path, kind string, logger *slog.Logger) (*Client, error) {
	return LoadWith(path, kind, LoadOpts{Logger: logger})
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

// LoadWith is Load with telemetry.
func LoadWith(path, kind string, o LoadOpts) (*Client, error) {
	logger := o.Logger
	if !validKind(kind) {
		return nil, fmt.Errorf("plugin %s: unknown kind %q; accepted: %v", path, kind, Kinds())
	}
	pc := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  Handshake(),
		Plugins:          hostPlugins(),
		Cmd:              exec.Command(path),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		StartTimeout:     StartTimeout,
		Logger:           hclogger(logger),
		GRPCDialOptions:  []grpc.DialOption{grpc.WithStatsHandler(clientTracing(o.TracerProvider, o.Propagator))},
	})
	rpc, err := pc.Client()
	if err != nil {
		pc.Kill()
		return nil, fmt.Errorf("plugin %s: start: %w", path, err)
	}
	raw, err := rpc.Dispense(kind)
	if err != nil {
		pc.Kill()
		return nil, fmt.Errorf("plugin %s: it does not serve kind %q: %w", path, kind, err)
	}
	c := &Client{kind: kind, path: path, raw: raw, exited: pc.Exited, kill: pc.Kill, closedC: make(chan struct{})}
	if rc := pc.ReattachConfig(); rc != nil {
		c.pid = rc.Pid
	}
	return c, nil
}

// newClient wraps an already connected kind client (tests: an in-process
// gRPC hop); stop ends the connection.
func newClient(kind, name string, raw any, stop func()) *Client {
	return &Client{kind: kind, path: name, raw: raw, exited: func() bool { return false }, kill: stop, closedC: make(chan struct{})}
}

func validKind(k string) bool {
	for _, x := range Kinds() {
		if x == k {
			return true
		}
	}
	return false
}

// Pid returns the plugin's process id (0 when not known).
func (c *Client) Pid() int { return c.pid }

// Close ends the plugin process. It is idempotent; operations still in
// flight resolve Failed with ErrClosed.
func (c *Client) Close() error {
	c.once.Do(func() {
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
		return fmt.Errorf("plugin %s: loaded as %q, not %q", c.path, c.kind, kind)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.opened {
		return fmt.Errorf("plugin %s: one plugin process serves one %s; load another", c.path, kind)
	}
	if c.closed() {
		return fmt.Errorf("plugin %s: %w", c.path, transfer.ErrClosed)
	}
	c.opened = true
	return nil
}

// rpcErr is rpcError with the Client's closed state.
func (c *Client) rpcErr(what string, err error) error { return rpcError(what, err, c.closed()) }

func ctx(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// hclogger adapts slog for go-plugin; nil discards.
func hclogger(l *slog.Logger) hclog.Logger {
	if l == nil {
		return hclog.NewNullLogger()
	}
	return hclog.New(&hclog.LoggerOptions{Name: "plugin", Output: slogWriter{l}, Level: hclog.Info, DisableTime: true})
}

type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Info(strings.TrimSpace(string(p)))
	return len(p), nil
}
