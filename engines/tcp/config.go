package tcp

import (
	"cmp"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/transfer"
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultListen       = "127.0.0.1:0"
	DefaultConnections  = 4
	DefaultDialTimeout  = 5 * time.Second
	DefaultWriteTimeout = 30 * time.Second
	DefaultIdleTimeout  = 15 * time.Second
	DefaultNotifyQueue  = 256
	DefaultRecvQueue    = 1024
	DefaultStripeBytes  = 1 << 20
	// DefaultFrameTimeout bounds a handshake and the receipt of one frame.
	DefaultFrameTimeout = 15 * time.Second
	// DefaultMaxPendingConns caps incoming connections still in their
	// handshake or HELLO.
	DefaultMaxPendingConns = 64
	// DefaultFenceTimeout bounds the wait, when a connection is given up,
	// for the peer to close it after applying what it received.
	DefaultFenceTimeout = 2 * time.Second
	// DefaultFenceHold is how long ForgetPeer keeps refusing a forgotten
	// peer: the default of bounce.quarantine (one request timeout), the
	// time the agent trusts a late write to have landed by.
	DefaultFenceHold = 30 * time.Second
	// DefaultMaxForgotten caps the names the fence holds at once.
	DefaultMaxForgotten = 1 << 16
)

// Defaults of the receiver's resource caps (Config.MaxConnsPerPeer,
// MaxIncomingConns, MaxBodyBytes, MaxBodyBytesPerPeer). They hold in every
// security mode.
const (
	// DefaultMaxConnsPerPeer is the most connections a valid dialer opens
	// (MaxConnections).
	DefaultMaxConnsPerPeer     = MaxConnections
	DefaultMaxIncomingConns    = 512
	DefaultMaxBodyBytes        = 64 << 20
	DefaultMaxBodyBytesPerPeer = 8 << 20
)

// MaxConnections bounds Config.Connections.
const MaxConnections = 64

// Config configures an Engine. Zero values take the defaults above.
type Config struct {
	// Name identifies the engine to its peers; 1..MaxNameLen bytes of UTF-8.
	Name string
	// Listen is the TCP address to listen on (default 127.0.0.1:0). The
	// address actually bound is what Metadata advertises.
	Listen string
	// Advertise overrides the address put in Metadata. It is required when
	// Listen is a wildcard address (0.0.0.0, [::]) that peers cannot dial.
	Advertise string
	// Connections is the number of TCP connections per peer (default 4).
	// Large posts are striped over them; notifications use connection 0.
	Connections int
	// DialTimeout bounds dialing a peer and receiving a peer's HELLO
	// (default 5s).
	DialTimeout time.Duration
	// WriteTimeout bounds writing one frame (at most MaxFramePayload bytes
	// of payload) to a socket (default 30s).
	WriteTimeout time.Duration
	// IdleTimeout is how long a connection with work outstanding may make no
	// progress before it is declared dead; also the TCP keepalive idle time
	// and the bound on each read inside a received frame (default 15s).
	IdleTimeout time.Duration
	// NotifyQueue is the number of outgoing notifications queued per peer
	// before Notify returns ErrQueueFull (default 256).
	NotifyQueue int
	// RecvQueue is the number of received notifications buffered for
	// RecvNotification before the receiving connection stops reading
	// (default 1024).
	RecvQueue int
	// StripeBytes is the smallest part a post is split into when it is
	// striped over several connections (default 1 MiB).
	StripeBytes int
	// OnComplete, when set, is called once per write op right after it
	// becomes terminal, on the goroutine that finished it. It must not
	// block; it lets a reactor wait for completions instead of polling.
	OnComplete func()
	// Logger receives connection events; nil discards them.
	Logger *slog.Logger
	// Peers, when enabled (security.mode authenticate), makes every
	// connection start with a mutual Noise handshake with the agents' keys:
	// the engine dials only peers whose key it holds and accepts only
	// admitted keys, and a HELLO must name the agent its key belongs to.
	// Nil keeps the unauthenticated protocol (security.mode off).
	Peers *security.Peers
	// Encrypt seals every frame after the handshake (engine.encryption on);
	// either side asking for it turns it on for the connection.
	Encrypt bool
	// FrameTimeout bounds a handshake and receiving one frame once its
	// first byte arrived (default 15s): a peer that trickles bytes is cut
	// off.
	FrameTimeout time.Duration
	// MaxPendingConns caps the incoming connections still in their
	// handshake or HELLO (default 64); past it the oldest is closed.
	MaxPendingConns int
	// FenceTimeout bounds how long giving up an outgoing connection
	// (ForgetPeer, Close, a failed or stalled connection) waits for the peer
	// to apply what it already received and close its side (default 2s).
	// Writes whose bytes went out fail quiescent when the peer closes in
	// time, and wrap transfer.ErrNotQuiescent when it does not.
	FenceTimeout time.Duration
	// FenceHold is how long a peer ForgetPeer dropped stays refused unless
	// LoadPeer loads it again (default DefaultFenceHold). A late write the
	// forgotten peer still sends after that is what the agent's quarantine
	// (bounce.quarantine) assumes cannot happen either, so the node sets
	// it to the quarantine; past it the name may be admitted again (a
	// learned peer that comes back is served).
	FenceHold time.Duration
	// MaxForgotten caps the forgotten names held (default
	// DefaultMaxForgotten). Past it the oldest is dropped before its hold
	// ended, counted in Stats.FenceEvictions and logged: only a forget
	// rate above MaxForgotten per FenceHold does that.
	MaxForgotten int
	// Device, when set, makes the engine carry that kind of device memory
	// on the direct path by staging every descriptor through page-locked
	// host buffers (StagedMemoryKinds): one copy per descriptor into a
	// staging buffer before its bytes go out, one out of a staging buffer
	// after they arrived. Nil: host memory only.
	Device DeviceMemory
	// StageBuffers is the number of staging buffers in each direction
	// (default 2 × Connections): at most that many frames with device
	// memory are staged at once, out and in.
	StageBuffers int
	// StageBytes is the size of one staging buffer (default
	// DefaultStageBytes), and so the most payload of a frame with device
	// sources.
	StageBytes int
	// MaxConnsPerPeer caps the incoming connections one peer may hold
	// open after its HELLO (default DefaultMaxConnsPerPeer), and
	// MaxIncomingConns those of all peers together (default
	// DefaultMaxIncomingConns): a HELLO past either is refused. They hold
	// in every security mode; with security.mode off names are not
	// proven, so the total is what bounds a peer claiming many names.
	MaxConnsPerPeer, MaxIncomingConns int
	// MaxBodyBytes caps the memory of incoming frame bodies over 64 KiB
	// being received (default DefaultMaxBodyBytes), MaxBodyBytesPerPeer one
	// peer's part of it (default DefaultMaxBodyBytesPerPeer; connections
	// still in their HELLO share one part). A body that does not fit
	// waits, within its frame's deadline, for another to be handled.
	MaxBodyBytes, MaxBodyBytesPerPeer int
	// Hold, when set, runs before each part of a write goes out on its
	// connection, with a channel closed once that connection is given up
	// (ForgetPeer, Close, a broken connection); it must return by then.
	// The part goes out only after Hold returned on a live connection. It
	// is a test hook to stall writes on purpose (Engine.StallWrites, the
	// transfer.WriteStaller the conformance suite uses, does the same from
	// outside the configuration); nil in production.
	Hold func(abort <-chan struct{})
}

// withDefaults returns c with zero fields replaced by defaults.
func (c Config) withDefaults() Config {
	c.Listen = cmp.Or(c.Listen, DefaultListen)
	c.Connections = cmp.Or(c.Connections, DefaultConnections)
	c.DialTimeout = cmp.Or(c.DialTimeout, DefaultDialTimeout)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, DefaultIdleTimeout)
	c.NotifyQueue = cmp.Or(c.NotifyQueue, DefaultNotifyQueue)
	c.RecvQueue = cmp.Or(c.RecvQueue, DefaultRecvQueue)
	c.StripeBytes = cmp.Or(c.StripeBytes, DefaultStripeBytes)
	c.FrameTimeout = cmp.Or(c.FrameTimeout, DefaultFrameTimeout)
	c.MaxPendingConns = cmp.Or(c.MaxPendingConns, DefaultMaxPendingConns)
	c.FenceTimeout = cmp.Or(c.FenceTimeout, DefaultFenceTimeout)
	c.FenceHold = cmp.Or(c.FenceHold, DefaultFenceHold)
	c.MaxForgotten = cmp.Or(c.MaxForgotten, DefaultMaxForgotten)
	c.StageBuffers = cmp.Or(c.StageBuffers, 2*c.Connections)
	c.StageBytes = cmp.Or(c.StageBytes, DefaultStageBytes)
	c.MaxConnsPerPeer = cmp.Or(c.MaxConnsPerPeer, DefaultMaxConnsPerPeer)
	c.MaxIncomingConns = cmp.Or(c.MaxIncomingConns, DefaultMaxIncomingConns)
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, DefaultMaxBodyBytes)
	c.MaxBodyBytesPerPeer = cmp.Or(c.MaxBodyBytesPerPeer, DefaultMaxBodyBytesPerPeer)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first invalid field. Zero values are valid (they take
// defaults); negative sizes and durations are not.
func (c Config) Validate() error {
	if err := transfer.CheckName(c.Name); err != nil {
		return fmt.Errorf("tcp: config: Name: %w", err)
	}
	if c.Connections < 0 || c.Connections > MaxConnections {
		return fmt.Errorf("tcp: config: Connections %d not in 0..%d", c.Connections, MaxConnections)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"DialTimeout", c.DialTimeout}, {"WriteTimeout", c.WriteTimeout}, {"IdleTimeout", c.IdleTimeout}, {"FrameTimeout", c.FrameTimeout}, {"FenceTimeout", c.FenceTimeout}, {"FenceHold", c.FenceHold}} {
		if d.v < 0 {
			return fmt.Errorf("tcp: config: %s %v is negative", d.name, d.v)
		}
	}
	if c.MaxForgotten < 0 {
		return fmt.Errorf("tcp: config: MaxForgotten %d is negative", c.MaxForgotten)
	}
	for _, v := range []struct {
		name string
		v    int
	}{{"MaxConnsPerPeer", c.MaxConnsPerPeer}, {"MaxIncomingConns", c.MaxIncomingConns}, {"MaxBodyBytes", c.MaxBodyBytes}, {"MaxBodyBytesPerPeer", c.MaxBodyBytesPerPeer}} {
		if v.v < 0 {
			return fmt.Errorf("tcp: config: %s %d is negative", v.name, v.v)
		}
	}
	if c.MaxPendingConns < 0 {
		return fmt.Errorf("tcp: config: MaxPendingConns %d is negative", c.MaxPendingConns)
	}
	if c.Encrypt && !c.Peers.Enabled() {
		return fmt.Errorf("tcp: config: Encrypt needs authentication (Peers, security.mode authenticate): %w", transfer.ErrUnsupported)
	}
	if c.NotifyQueue < 0 {
		return fmt.Errorf("tcp: config: NotifyQueue %d is negative", c.NotifyQueue)
	}
	if c.RecvQueue < 0 {
		return fmt.Errorf("tcp: config: RecvQueue %d is negative", c.RecvQueue)
	}
	if c.StripeBytes < 0 || c.StripeBytes > MaxFramePayload {
		return fmt.Errorf("tcp: config: StripeBytes %d not in 0..%d", c.StripeBytes, MaxFramePayload)
	}
	if c.StageBuffers < 0 || c.StageBuffers > MaxStageBuffers {
		return fmt.Errorf("tcp: config: StageBuffers %d not in 0..%d", c.StageBuffers, MaxStageBuffers)
	}
	if c.StageBytes < 0 || c.StageBytes > MaxFramePayload {
		return fmt.Errorf("tcp: config: StageBytes %d not in 0..%d", c.StageBytes, MaxFramePayload)
	}
	if c.Device != nil && c.Device.Kind() == transfer.Host {
		return fmt.Errorf("tcp: config: Device stages host memory: it must be a device memory kind: %w", transfer.ErrUnsupported)
	}
	if c.Advertise != "" {
		if err := validAddr(c.Advertise); err != nil {
			return fmt.Errorf("tcp: config: Advertise: %w: %w", err, transfer.ErrBadEndpoint)
		}
	}
	return nil
}

// validAddr checks that a is host:port with a non-empty host and a port in
// 1..65535.
func validAddr(a string) error {
	if len(a) > MaxAddrLen {
		return fmt.Errorf("address of %d bytes exceeds %d", len(a), MaxAddrLen)
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("address %q: %v", a, err)
	}
	if host == "" {
		return fmt.Errorf("address %q has no host", a)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return fmt.Errorf("address %q: port must be 1..65535", a)
	}
	return nil
}
