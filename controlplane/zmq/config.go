package zmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/bouncekv/bounce/security"
)

// Defaults applied by New to zero-valued Config fields.
const (
	// DefaultSendHWM is the per-peer send high-water mark, in messages.
	DefaultSendHWM = 1000
	// DefaultRecvQueue is the receive high-water mark, in messages per
	// connected peer.
	DefaultRecvQueue = 1000
	// DefaultHandshakeTimeout bounds a connection's ZMTP/CURVE handshake.
	DefaultHandshakeTimeout = 5 * time.Second
	// maxNameLen is the longest routing identity libzmq accepts.
	maxNameLen = 255
)

// Config configures a Channel.
type Config struct {
	// Name is this channel's routing identity. Every DEALER the channel
	// opens announces it, so peers see it as Message.Peer. It must be 1..255
	// bytes and must not start with a zero byte (libzmq reserves those for
	// anonymous peers).
	Name string
	// Interface is the network interface whose address the ROUTER binds
	// when BindAddress is empty: its first IPv4 address, else its first
	// IPv6 address that is not link-local.
	Interface string
	// BindAddress is an explicit IP literal (IPv4, or IPv6 with or without
	// brackets) to bind; it takes precedence over Interface. Loopback
	// addresses are accepted here and only here.
	BindAddress string
	// SendHWM is the per-peer send queue bound in messages; a Send beyond it
	// is dropped with ErrQueueFull. 0 means DefaultSendHWM.
	SendHWM int
	// RecvQueue is the ROUTER's receive high-water mark: how many messages
	// from one peer wait for Recv before libzmq stops reading that peer's
	// connection, so backpressure reaches the sender's SendHWM.
	// 0 means DefaultRecvQueue.
	RecvQueue int
	// Logger receives warnings about dropped and malformed messages; nil
	// discards them.
	Logger *slog.Logger
	// Peers, when enabled (security.mode authenticate), turns CURVE on: the
	// ROUTER is a CURVE server with this agent's key, every DEALER a CURVE
	// client pinned to its peer's key, and a ZAP handler admits only keys
	// of admitted peers and names each message's sender from its key. Nil
	// means plain ZMTP (security.mode off).
	Peers *security.Peers
	// MaxMessageSize is ZMQ_MAXMSGSIZE in bytes; 0 means
	// security.DefaultMaxMessageSize.
	MaxMessageSize int64
	// HandshakeTimeout is ZMQ_HANDSHAKE_IVL; 0 means
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// MaxConnsPerHost and MaxConns cap the ROUTER's incoming connections
	// from one host and from all hosts together (each host counted up to
	// MaxConnsPerHost), in every security mode: a connection past either
	// is refused at its handshake (ZAP status 500) and closed, counted in
	// Stats.OverCap. 0 means security.DefaultMaxControlConnsPerHost and
	// security.DefaultMaxControlConns.
	MaxConnsPerHost, MaxConns int
}

// orDefault sets *v to def when it is zero; a negative value is an error
// naming key.
func orDefault[T int | int64 | time.Duration](key string, v *T, def T) error {
	switch {
	case *v < 0:
		return fmt.Errorf("zmq: config %s %v: must not be negative", key, *v)
	case *v == 0:
		*v = def
	}
	return nil
}

// withDefaults validates cfg and fills zero fields with defaults.
func (cfg Config) withDefaults() (Config, error) {
	if err := checkName(cfg.Name); err != nil {
		return cfg, fmt.Errorf("zmq: config name: %w", err)
	}
	for _, err := range []error{
		orDefault("send_hwm", &cfg.SendHWM, DefaultSendHWM),
		orDefault("recv_queue", &cfg.RecvQueue, DefaultRecvQueue),
		orDefault("max_message_size", &cfg.MaxMessageSize, security.DefaultMaxMessageSize),
		orDefault("handshake_timeout", &cfg.HandshakeTimeout, DefaultHandshakeTimeout),
		orDefault("max_conns_per_host", &cfg.MaxConnsPerHost, security.DefaultMaxControlConnsPerHost),
		orDefault("max_conns", &cfg.MaxConns, security.DefaultMaxControlConns),
	} {
		if err != nil {
			return cfg, err
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg, nil
}

// checkName reports why s cannot be a routing identity (ours or a peer's).
func checkName(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case len(s) > maxNameLen:
		return fmt.Errorf("%d bytes, longer than %d", len(s), maxNameLen)
	case s[0] == 0:
		return errors.New("starts with a zero byte (reserved by libzmq)")
	}
	return nil
}

// netProbe is the host lookups bind-address resolution needs; tests swap
// them for fakes so resolution is checked without touching the network.
type netProbe struct {
	// interfaceAddrs lists the addresses of the named interface.
	interfaceAddrs func(name string) ([]net.Addr, error)
	// egress returns the local address the routing table picks to reach
	// addr over network ("udp4"/"udp6").
	egress func(network, addr string) (net.IP, error)
	// hostname returns the host's name.
	hostname func() (string, error)
	// lookupIP resolves a host name.
	lookupIP func(host string) ([]net.IP, error)
}

// lookupTimeout bounds the DNS lookups done while resolving the bind
// address and validating peer endpoints.
const lookupTimeout = 2 * time.Second

// Well-known public addresses used only as routing-table keys: a UDP
// "connect" selects the egress interface and sends no packet.
const (
	publicV4 = "8.8.8.8:53"                // Google public DNS
	publicV6 = "[2001:4860:4860::8888]:53" // Google public DNS over IPv6
)

// hostProbe is the netProbe backed by the real host.
func hostProbe() netProbe {
	return netProbe{
		interfaceAddrs: func(name string) ([]net.Addr, error) {
			ifc, err := net.InterfaceByName(name)
			if err != nil {
				return nil, err
			}
			return ifc.Addrs()
		},
		egress: func(network, addr string) (net.IP, error) {
			// Connecting a UDP socket only consults the routing table;
			// nothing is sent.
			conn, err := net.Dial(network, addr)
			if err != nil {
				return nil, err
			}
			defer conn.Close()
			ua, ok := conn.LocalAddr().(*net.UDPAddr)
			if !ok {
				return nil, fmt.Errorf("unexpected local address %v", conn.LocalAddr())
			}
			return ua.IP, nil
		},
		hostname: os.Hostname,
		lookupIP: func(host string) ([]net.IP, error) {
			ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
			defer cancel()
			return net.DefaultResolver.LookupIP(ctx, "ip", host)
		},
	}
}

// resolveBind picks the IP the ROUTER binds: BindAddress, else the
// Interface's address, else an auto-detected routable address. It never
// falls back to loopback on its own.
func resolveBind(cfg Config, p netProbe) (net.IP, error) {
	if cfg.BindAddress != "" {
		return parseBindAddress(cfg.BindAddress)
	}
	if cfg.Interface != "" {
		return interfaceIP(cfg.Interface, p)
	}
	if ip := detectRoutable(p); ip != nil {
		return ip, nil
	}
	return nil, errors.New("zmq: no routable local address found (egress route and hostname gave none); set bind_address or interface")
}

// parseBindAddress validates an explicit bind address.
func parseBindAddress(s string) (net.IP, error) {
	lit := s
	if strings.HasPrefix(lit, "[") && strings.HasSuffix(lit, "]") {
		lit = lit[1 : len(lit)-1]
	}
	ip := net.ParseIP(lit)
	switch {
	case ip == nil:
		return nil, fmt.Errorf("zmq: bind_address %q: not an IP literal", s)
	case ip.IsUnspecified():
		return nil, fmt.Errorf("zmq: bind_address %q: unspecified address cannot be advertised to peers", s)
	case ip.IsMulticast():
		return nil, fmt.Errorf("zmq: bind_address %q: multicast address", s)
	}
	return normIP(ip), nil
}

// interfaceIP returns the first usable address of the named interface.
func interfaceIP(name string, p netProbe) (net.IP, error) {
	addrs, err := p.interfaceAddrs(name)
	if err != nil {
		return nil, fmt.Errorf("zmq: interface %q: %w", name, err)
	}
	var v6 net.IP
	for _, a := range addrs {
		ip := addrIP(a)
		if ip == nil || ip.IsUnspecified() || ip.IsMulticast() {
			continue
		}
		if ip.To4() != nil {
			return ip.To4(), nil
		}
		if v6 == nil && !ip.IsLinkLocalUnicast() {
			v6 = ip
		}
	}
	if v6 != nil {
		return v6, nil
	}
	return nil, fmt.Errorf("zmq: interface %q has no usable IPv4 or non-link-local IPv6 address", name)
}

// detectRoutable tries the egress route to public addresses, then the
// hostname's addresses, and returns the first routable one or nil.
func detectRoutable(p netProbe) net.IP {
	for _, probe := range [...]struct{ network, addr string }{{"udp4", publicV4}, {"udp6", publicV6}} {
		if ip, err := p.egress(probe.network, probe.addr); err == nil && routable(ip) {
			return normIP(ip)
		}
	}
	host, err := p.hostname()
	if err != nil || host == "" {
		return nil
	}
	ips, err := p.lookupIP(host)
	if err != nil {
		return nil
	}
	var v6 net.IP
	for _, ip := range ips {
		if !routable(ip) {
			continue
		}
		if ip.To4() != nil {
			return ip.To4()
		}
		if v6 == nil {
			v6 = ip
		}
	}
	return v6
}

// routable reports whether ip can be advertised to other hosts.
func routable(ip net.IP) bool {
	return ip != nil && !ip.IsLoopback() && !ip.IsUnspecified() && !ip.IsMulticast() &&
		!ip.IsLinkLocalUnicast()
}

func addrIP(a net.Addr) net.IP {
	switch v := a.(type) {
	case *net.IPNet:
		return v.IP
	case *net.IPAddr:
		return v.IP
	}
	return nil
}

// normIP returns the 4-byte form of IPv4 addresses.
func normIP(ip net.IP) net.IP {
	if v4 := ip.To4(); v4 != nil {
		return v4
	}
	return ip
}

// bindEndpoint formats the ROUTER bind endpoint for ip on an ephemeral port
// and reports whether ZMQ_IPV6 is needed.
func bindEndpoint(ip net.IP) (string, bool) {
	if ip.To4() != nil {
		return "tcp://" + ip.String() + ":*", false
	}
	return "tcp://[" + ip.String() + "]:*", true
}
