package security

import "time"

// Bucket is a token bucket: Rate tokens per second, at most Burst saved.
// It is pure logic: the caller passes the time.
type Bucket struct {
	Rate  float64
	Burst float64

	tokens float64
	last   time.Time
	primed bool
}

// Allow takes one token at now and reports whether there was one. A Rate of
// 0 or less means unlimited.
func (b *Bucket) Allow(now time.Time) bool {
	if b.Rate <= 0 {
		return true
	}
	if !b.primed {
		b.tokens, b.last, b.primed = b.Burst, now, true
	}
	if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.tokens = min(b.Burst, b.tokens+dt*b.Rate)
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Defaults of the control channel's caps (security.
// max_control_conns_per_host, security.max_control_conns,
// security.max_message_size): the one source the config defaults and the
// ZeroMQ channel's zero-value defaults both refer to.
const (
	// DefaultMaxControlConnsPerHost is how many incoming control
	// connections one sending host may hold.
	DefaultMaxControlConnsPerHost = 64
	// DefaultMaxControlConns is how many all hosts together may hold.
	DefaultMaxControlConns = 1024
	// DefaultMaxMessageSize is the largest control message accepted, in
	// bytes (ZMQ_MAXMSGSIZE): a peer sending more is disconnected.
	DefaultMaxMessageSize = 4 << 20
)

// HostConns counts live connections by the host they come from and says
// whether one may complete its handshake: a host may hold PerHost
// admitted connections, and all hosts together Total. It is pure logic:
// the caller reports each connection's opening and closing under an id
// unique among live ones (a file descriptor), and asks at each handshake
// with the host alone, not knowing which of the host's open connections
// asks (a ZAP request names only the address).
//
// It therefore cannot tell, when a connection closes, whether that one was
// admitted; it keeps an estimate per host that never counts fewer than the
// admitted connections still open: raised by each admission, lowered only
// as far as the host's open connections. A connection is admitted when
// its host holds at most PerHost open connections (itself included) or
// the estimate is below PerHost, and when all hosts' open connections,
// each host counted up to PerHost, are at most Total or the estimates
// with it are. Either condition alone guarantees that the admitted
// connections still open never exceed the caps, however handshakes and
// closes interleave; together, the first PerHost of a host's burst are
// admitted and the rest refused, and with no connection but admitted ones
// open, exactly those within the caps are. The estimate runs high only
// while a host holds connections that were refused or never judged,
// which end (refused) or time out (the handshake): meanwhile that host
// may be refused a connection early. The zero value holds nothing and
// admits nothing (caps of 0).
type HostConns struct {
	// PerHost and Total are the caps.
	PerHost, Total int

	host    map[int]string        // live connection -> its host
	hosts   map[string]*hostCount // hosts with live connections
	charged int                   // sum over hosts of min(open, PerHost)
	held    int                   // sum over hosts of held
}

// hostCount is one host's live connections and its estimate of those
// admitted (at least the admitted ones still open, at most open).
type hostCount struct{ open, held int }

// Open records a live connection from host. An id still live (its close
// was never reported) is closed first, so a lost close does not leak.
func (c *HostConns) Open(id int, host string) {
	if c.host == nil {
		c.host, c.hosts = map[int]string{}, map[string]*hostCount{}
	}
	c.Close(id)
	c.host[id] = host
	h := c.hosts[host]
	if h == nil {
		h = &hostCount{}
		c.hosts[host] = h
	}
	h.open++
	if h.open <= c.PerHost {
		c.charged++
	}
}

// Close forgets the connection id; an unknown id is ignored.
func (c *HostConns) Close(id int) {
	host, ok := c.host[id]
	if !ok {
		return
	}
	delete(c.host, id)
	h := c.hosts[host]
	if h.open <= c.PerHost {
		c.charged--
	}
	h.open--
	if h.held > h.open {
		h.held--
		c.held--
	}
	if h.open == 0 {
		delete(c.hosts, host)
	}
}

// Admit reports whether a connection from host, open and counted, may
// complete its handshake, and if so counts it admitted. A host without an
// open connection is refused: the connection asking is not known.
func (c *HostConns) Admit(host string) bool {
	h := c.hosts[host]
	if h == nil {
		return false
	}
	held := min(h.held+1, h.open)
	perHost := h.open <= c.PerHost || h.held < c.PerHost
	total := c.charged <= c.Total || c.held-h.held+held <= c.Total
	if !perHost || !total {
		return false
	}
	c.held += held - h.held
	h.held = held
	return true
}

// Live returns the live connections in all.
func (c *HostConns) Live() int { return len(c.host) }

// Of returns the live connections of host.
func (c *HostConns) Of(host string) int {
	if h := c.hosts[host]; h != nil {
		return h.open
	}
	return 0
}

// Hosts returns how many hosts hold live connections.
func (c *HostConns) Hosts() int { return len(c.hosts) }
