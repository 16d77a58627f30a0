package tcp

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/transfer"
)

// inConn is a connection a peer dialed to this engine.
type inConn struct {
	conn net.Conn
	name atomic.Pointer[string] // the peer's name, once its HELLO was admitted
	inc  uint64                 // the peer's incarnation (its HELLO's), set before name
	cut  atomic.Bool            // set by ForgetPeer: land nothing more
	// pending is set once the connection left the pending count (admitted,
	// or ended before).
	pending  atomic.Bool
	evicted  atomic.Bool // closed to make room for newer pending connections
	accepted time.Time
	closed   chan struct{}
	once     sync.Once
	served   chan struct{} // closed once serve returned: no more bytes land

	// landing holds what the write guard allowed the frame being landed
	// (empty between frames): FenceWrites cuts the connection when it
	// overlaps memory whose authorization ended. Authorizing and recording
	// happen under landMu, so a fence either sees the frame or the frame
	// sees the revoked guard.
	landMu  sync.Mutex
	landing []transfer.Desc

	// reading holds what the read guard allowed the READ being answered
	// (empty between READs) and sent is closed once its response was
	// written: FenceReads waits for it, or cuts the connection.
	readMu  sync.Mutex
	reading []transfer.Desc
	sent    chan struct{}
}

// readServed clears the READ's authorization record: its response is out.
func (ic *inConn) readServed() {
	ic.readMu.Lock()
	ic.reading = ic.reading[:0]
	if ic.sent != nil {
		close(ic.sent)
		ic.sent = nil
	}
	ic.readMu.Unlock()
}

// readingIn returns the channel closed once the READ being answered is
// sent, when it was authorized for memory overlapping d; nil otherwise.
func (ic *inConn) readingIn(d transfer.Desc) chan struct{} {
	ic.readMu.Lock()
	defer ic.readMu.Unlock()
	for _, a := range ic.reading {
		if a.Addr < d.End() && d.Addr < a.End() {
			return ic.sent
		}
	}
	return nil
}

// landed clears the frame's authorization record: its payload is in.
func (ic *inConn) landed() {
	ic.landMu.Lock()
	ic.landing = ic.landing[:0]
	ic.landMu.Unlock()
}

// landingIn reports whether the frame being landed was authorized for
// memory overlapping d.
func (ic *inConn) landingIn(d transfer.Desc) bool {
	ic.landMu.Lock()
	defer ic.landMu.Unlock()
	for _, a := range ic.landing {
		if a.Addr < d.End() && d.Addr < a.End() {
			return true
		}
	}
	return false
}

func (ic *inConn) close() {
	ic.once.Do(func() {
		close(ic.closed)
		ic.conn.Close()
	})
}

// abort is close with a reset: queued bytes the peer sent are dropped.
func (ic *inConn) abort() {
	ic.once.Do(func() {
		close(ic.closed)
		abort(ic.conn)
	})
}

func (e *Engine) acceptLoop() {
	defer e.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := e.ln.Accept()
		if err != nil {
			if e.isClosed() || errors.Is(err, net.ErrClosed) {
				return
			}
			e.log.Warn("tcp accept failed", "err", err)
			select {
			case <-e.done:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		ic := &inConn{conn: c, closed: make(chan struct{}), served: make(chan struct{}), accepted: time.Now()}
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			c.Close()
			return
		}
		e.incoming[ic] = struct{}{}
		if e.pending.Add(1) > int64(e.cfg.MaxPendingConns) {
			// Connections not yet through their handshake and HELLO are
			// capped; the oldest goes, so a flood of idle connections
			// cannot lock out a peer whose handshake takes a millisecond.
			if v := e.oldestPendingLocked(ic); v != nil {
				v.evicted.Store(true)
				v.abort()
				n := e.stats.refusedConns.Add(1)
				if n&(n-1) == 0 {
					e.log.Warn("tcp: incoming connection dropped: too many in setup", "max_pending_conns", e.cfg.MaxPendingConns, "refused_total", n)
				}
			}
		}
		e.wg.Add(1)
		e.mu.Unlock()
		go func() {
			defer e.wg.Done()
			err := e.serve(ic)
			if ic.pending.CompareAndSwap(false, true) {
				e.pending.Add(-1) // ended before it was admitted
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !ic.evicted.Load() {
				e.stats.slowConns.Add(1)
			}
			ic.close()
			close(ic.served)
			e.mu.Lock()
			delete(e.incoming, ic)
			e.mu.Unlock()
			e.connEnded(ic)
			if err != nil && !e.isClosed() {
				e.log.Debug("tcp incoming connection ended", "remote", c.RemoteAddr(), "err", err)
			}
		}()
	}
}

// connEnded reports the peer of an incoming connection that just ended as
// lost when it was the peer's last one (and not cut by ForgetPeer, nor the
// engine closing): every write the peer sent on it has landed or never
// will, and a process killed with kill -9 shows here within a round trip.
// An outgoing connection that breaks by itself, the peer's last, is
// reported too (session.run).
func (e *Engine) connEnded(ic *inConn) {
	name := ic.name.Load()
	if name == nil || ic.cut.Load() {
		return
	}
	e.mu.Lock()
	last := true
	for o := range e.incoming {
		if n := o.name.Load(); n != nil && *n == *name {
			last = false
			break
		}
	}
	if last {
		// The incarnation that just ended, for the fence a ForgetPeer
		// after this loss report sets (bounded: an unknown one fences all).
		if len(e.lostInc) >= e.cfg.MaxForgotten {
			for k := range e.lostInc {
				delete(e.lostInc, k)
				break
			}
		}
		e.lostInc[*name] = ic.inc
	}
	if p := e.peers[*name]; last && p != nil && p.learned && !p.connected() {
		// Nobody loaded it and nothing goes to it: its entry would
		// otherwise outlive it (one per sender process that ever
		// connected). A HELLO learns it again.
		delete(e.peers, *name)
	}
	e.mu.Unlock()
	if last {
		e.peerLost(*name)
	}
}

// peerLost calls the SetPeerLost callback unless the engine is closed.
func (e *Engine) peerLost(name string) {
	e.mu.Lock()
	fn := e.onLost
	if e.closed {
		fn = nil
	}
	e.mu.Unlock()
	if fn != nil {
		fn(name)
	}
}

// oldestPendingLocked returns the longest-waiting connection not yet
// admitted, other than except, or nil. The caller holds e.mu.
func (e *Engine) oldestPendingLocked(except *inConn) *inConn {
	var v *inConn
	for ic := range e.incoming {
		if ic == except || ic.name.Load() != nil || ic.pending.Load() || ic.evicted.Load() {
			continue
		}
		if v == nil || ic.accepted.Before(v.accepted) {
			v = ic
		}
	}
	return v
}

// inReader reads frames from an incoming connection. Inside a frame every
// read must make progress within IdleTimeout, and the whole frame must
// arrive within FrameTimeout of its first byte (no slowloris).
type inReader struct {
	conn     net.Conn
	raw      syscall.RawConn // nil when the connection is not a socket
	idle     time.Duration
	frame    time.Duration
	frameEnd time.Time // deadline of the frame being read; zero between frames
	lastSet  time.Time
	scratch  []byte
}

// progress extends the read deadline, never past the frame's; it is cheap
// when called often.
func (r *inReader) progress() {
	now := time.Now()
	if now.Sub(r.lastSet) > r.idle/4 {
		d := now.Add(r.idle)
		if !r.frameEnd.IsZero() && d.After(r.frameEnd) {
			d = r.frameEnd
		}
		r.conn.SetReadDeadline(d)
		r.lastSet = now
	}
}

// frameStarted starts the frame deadline: the first byte arrived.
func (r *inReader) frameStarted() {
	r.frameEnd = time.Now().Add(r.frame)
	r.lastSet = time.Time{}
	r.progress()
}

func (r *inReader) noDeadline() {
	r.conn.SetReadDeadline(time.Time{})
	r.lastSet = time.Time{}
	r.frameEnd = time.Time{}
}

func (r *inReader) full(b []byte) error {
	for len(b) > 0 {
		r.progress()
		n, err := r.conn.Read(b)
		b = b[n:]
		if err != nil {
			if len(b) > 0 {
				if errors.Is(err, io.EOF) {
					return io.ErrUnexpectedEOF
				}
				return err
			}
		}
	}
	return nil
}

// fullv fills bufs in order, with readv straight into them when possible.
func (r *inReader) fullv(bufs [][]byte) error {
	if r.raw == nil {
		for _, b := range bufs {
			if err := r.full(b); err != nil {
				return err
			}
		}
		return nil
	}
	const maxIov = 1024
	for len(bufs) > 0 {
		r.progress()
		batch := bufs[:min(len(bufs), maxIov)]
		var n int
		var rerr error
		err := r.raw.Read(func(fd uintptr) bool {
			for {
				n, rerr = unix.Readv(int(fd), batch)
				if rerr != unix.EINTR {
					return rerr != unix.EAGAIN
				}
			}
		})
		if err != nil {
			return err
		}
		if rerr != nil {
			return rerr
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		for n > 0 {
			if k := len(bufs[0]); n >= k {
				n -= k
				bufs = bufs[1:]
			} else {
				bufs[0] = bufs[0][n:]
				n = 0
			}
		}
	}
	return nil
}

// discard consumes n payload bytes of a rejected frame.
func (r *inReader) discard(n uint64) error {
	if r.scratch == nil {
		r.scratch = make([]byte, 64<<10)
	}
	for n > 0 {
		k := min(n, uint64(len(r.scratch)))
		if err := r.full(r.scratch[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// serve runs one incoming connection: HELLO first, then WRITE and NOTIF
// frames. A malformed frame closes the connection; a well-formed WRITE
// naming memory this engine did not register is consumed, answered with a
// NACK, and nothing of it is written.
func (e *Engine) serve(ic *inConn) error {
	conn := ic.conn
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetKeepAliveConfig(keepAlive(e.cfg))
	}
	r := &inReader{conn: conn, idle: e.cfg.IdleTimeout, frame: e.cfg.FrameTimeout}
	// The handshake and the HELLO share one deadline.
	conn.SetReadDeadline(time.Now().Add(min(e.cfg.DialTimeout, e.cfg.FrameTimeout)))
	authName := ""
	if a := e.authenticator(); a != nil {
		sc, name, err := e.acceptHandshake(a, conn)
		if err != nil {
			n := e.stats.unauthenticated.Add(1)
			if n&(n-1) == 0 {
				e.log.Warn("tcp: incoming connection refused: authentication failed", "remote", conn.RemoteAddr(), "err", err, "unauthenticated_total", n)
			}
			return err
		}
		sc.unsealReplies(true)
		conn, authName = sc, name
		r.conn = conn
	} else if sc, ok := conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			r.raw = raw
		}
	}
	var hdr [headerSize]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		return fmt.Errorf("read hello: %w", err)
	}
	h, err := parseHeader(hdr[:])
	if err != nil {
		return err
	}
	if h.typ != frameHello {
		return fmt.Errorf("first frame has type %d, want hello: %w", h.typ, errProtocol)
	}
	m, err := e.readHello(conn, ic, h.bodyLen)
	if err != nil {
		return err
	}
	var body []byte
	if authName != "" && m.name != authName {
		e.stats.unauthenticated.Add(1)
		err := fmt.Errorf("tcp: hello names %q but the connection's key belongs to %q: %w", m.name, authName, security.ErrNotAdmitted)
		e.log.Warn("tcp: incoming connection refused", "remote", conn.RemoteAddr(), "err", err)
		e.reply(conn, encodeNack(0, nackOther, err.Error()))
		return err
	}
	if err := e.admit(ic, m); err != nil {
		if errors.Is(err, transfer.ErrPeerLost) || errors.Is(err, transfer.ErrQueueFull) {
			e.reply(conn, encodeNack(0, nackOther, err.Error()))
		}
		return err
	}
	log := e.log.With("peer", m.name, "remote", conn.RemoteAddr())
	log.Debug("tcp peer connected")

	var segs []segment
	var bufs [][]byte // destination slices of the frame being landed, reused
	// Bodies up to smallBody are read into small, reused; a larger one is
	// charged to the body budget until its frame was handled.
	var small []byte
	var charged int64
	defer func() {
		if charged > 0 {
			e.bodies.give(m.name, charged)
		}
	}()
	for {
		r.noDeadline()
		if _, err := io.ReadFull(conn, hdr[:1]); err != nil {
			return err
		}
		r.frameStarted()
		if err := r.full(hdr[1:]); err != nil {
			return err
		}
		h, err := parseHeader(hdr[:])
		if err != nil {
			return err
		}
		if h.bodyLen > smallBody {
			if err := e.bodies.take(m.name, int64(h.bodyLen), r.frameEnd, ic.closed, e.done); err != nil {
				return fmt.Errorf("tcp: frame body of %d bytes from %q: %w", h.bodyLen, m.name, err)
			}
			charged = int64(h.bodyLen)
			body = make([]byte, h.bodyLen)
		} else {
			if cap(small) < int(h.bodyLen) {
				small = make([]byte, h.bodyLen)
			}
			body = small[:h.bodyLen]
		}
		if err := r.full(body); err != nil {
			return err
		}
		if ic.cut.Load() {
			return fmt.Errorf("peer %q forgotten: %w", m.name, transfer.ErrPeerLost)
		}
		switch h.typ {
		case frameWrite:
			var total uint64
			segs, total, err = parseWriteBody(body, segs)
			if err != nil {
				return err
			}
			if err := e.land(r, ic, conn, m.name, h.id, segs, total, &bufs, log); err != nil {
				return err
			}
		case frameRead:
			segs, _, err = parseWriteBody(body, segs)
			if err != nil {
				return err
			}
			if err := e.serveRead(ic, conn, m.name, h.id, segs, log); err != nil {
				return err
			}
		case frameNotif:
			msg := transfer.Message{Peer: m.name, Payload: append([]byte(nil), body...)}
			select {
			case e.recvq <- msg:
			case <-e.done:
				return transfer.ErrClosed
			case <-ic.closed:
				return net.ErrClosed
			}
		default:
			return fmt.Errorf("unexpected frame type %d from sender: %w", h.typ, errProtocol)
		}
		if charged > 0 {
			e.bodies.give(m.name, charged)
			charged, body = 0, nil
		}
	}
}

// readHello reads and decodes the HELLO's body of n bytes. A body over
// smallBody (a HELLO listing many registered ranges) is charged to the body
// budget while it is read and decoded (peer "": not named yet).
func (e *Engine) readHello(conn net.Conn, ic *inConn, n uint32) (metadata, error) {
	if n > smallBody {
		if err := e.bodies.take("", int64(n), time.Now().Add(min(e.cfg.DialTimeout, e.cfg.FrameTimeout)), ic.closed, e.done); err != nil {
			return metadata{}, fmt.Errorf("read hello: body of %d bytes: %w", n, err)
		}
		defer e.bodies.give("", int64(n))
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(conn, body); err != nil {
		return metadata{}, fmt.Errorf("read hello: %w", err)
	}
	if sc, ok := conn.(*secureConn); ok {
		if err := sc.helloRead(); err != nil {
			return metadata{}, err
		}
	}
	m, err := decodeMetadata(body)
	if err != nil {
		e.reply(conn, encodeNack(0, nackBadMetadata, err.Error()))
		return metadata{}, err
	}
	return m, nil
}

// admit names ic after the HELLO m, unless m names a forgotten peer; a peer
// that was never loaded is learned. Naming and the forgotten check happen
// under one lock with ForgetPeer's scan, so a connection is either named
// before a forget (and cut by it) or refused after it.
func (e *Engine) admit(ic *inConn, m metadata) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("tcp: hello from %q: %w", m.name, transfer.ErrClosed)
	}
	if e.forgotten.refuses(m.name, m.inc, e.now()) {
		return fmt.Errorf("tcp: hello from %q refused: the peer was forgotten (ForgetPeer) and not loaded again: %w", m.name, transfer.ErrPeerLost)
	}
	conns := 0
	for other := range e.incoming {
		if n := other.name.Load(); n != nil && *n == m.name {
			conns++
		}
	}
	all := 0
	for other := range e.incoming {
		if other.name.Load() != nil {
			all++
		}
	}
	if conns >= e.cfg.MaxConnsPerPeer || all >= e.cfg.MaxIncomingConns {
		n := e.stats.refusedConns.Add(1)
		if n&(n-1) == 0 {
			e.log.Warn("tcp: incoming connection refused: connection cap", "peer", m.name, "peer_conns", conns, "max_conns_per_peer", e.cfg.MaxConnsPerPeer, "conns", all, "max_incoming_conns", e.cfg.MaxIncomingConns, "refused_total", n)
		}
		return fmt.Errorf("tcp: hello from %q refused: it holds %d connections (limit %d), all peers %d (limit %d): %w", m.name, conns, e.cfg.MaxConnsPerPeer, all, e.cfg.MaxIncomingConns, transfer.ErrQueueFull)
	}
	ic.inc = m.inc
	ic.name.Store(&m.name)
	if ic.pending.CompareAndSwap(false, true) {
		e.pending.Add(-1)
	}
	if e.peers[m.name] == nil {
		p := newPeer(e, m)
		p.learned = true
		if err := addrOnHost(m.addr, ic.conn.RemoteAddr(), ic.conn.LocalAddr()); err != nil {
			p.unreachable = fmt.Errorf("tcp: peer %q was not loaded and %w: %w", m.name, err, transfer.ErrBadEndpoint)
			n := e.stats.foreignAddrs.Add(1)
			if n&(n-1) == 0 {
				e.log.Warn("tcp: a peer's HELLO advertises an address on another host than its connection's: it is not dialed there", "peer", m.name, "advertised", m.addr, "remote", ic.conn.RemoteAddr(), "foreign_addrs_total", n)
			}
		}
		e.peers[m.name] = p
	}
	return nil
}

// addrOnHost checks that the address a HELLO advertises is on the host
// the connection came from: a peer the engine never loaded is dialed (to
// write or notify back) only there, so a HELLO cannot make the engine
// connect to a third host. A loaded peer is dialed at its loaded address.
// A connection from this host itself (its remote address is its local
// one) may advertise a loopback address too.
func addrOnHost(addr string, remote, local net.Addr) error {
	ta, ok := remote.(*net.TCPAddr)
	if !ok {
		return nil
	}
	la, _ := local.(*net.TCPAddr)
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("its HELLO advertises %q: %v", addr, err)
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.Equal(ta.IP) && !(ip.IsLoopback() && !ta.IP.IsLoopback() && la != nil && la.IP.Equal(ta.IP)) {
		return fmt.Errorf("its HELLO advertises %s, not on the host its connection came from (%s): load its metadata to reach it there", addr, ta.IP)
	}
	return nil
}

// land validates every segment against this engine's registry, then reads
// the payload straight into the destination memory and acknowledges it.
func (e *Engine) land(r *inReader, ic *inConn, conn net.Conn, peer string, id uint64, segs []segment, total uint64, scratch *[][]byte, log interface{ Warn(string, ...any) }) error {
	ic.landMu.Lock()
	allowed, aerr := e.authorize(peer, segs, ic.landing[:0])
	ic.landing = allowed
	ic.landMu.Unlock()
	// Cleared once the payload is in, before the ACK goes: a sender that
	// saw the ACK and moved on (DATA) is never cut by the fence its DATA
	// raises. On an error return the connection ends (served).
	if aerr != nil {
		ic.landed()
		n := e.stats.forbiddenWrites.Add(1)
		if n&(n-1) == 0 {
			log.Warn("tcp refused incoming write: not authorized", "part", id, "err", aerr, "forbidden_total", n)
		}
		if err := r.discard(total); err != nil {
			return err
		}
		return e.reply(conn, encodeNack(id, nackForbidden, aerr.Error()))
	}
	bufs, pins, staged, verr := e.resolveDsts(segs, (*scratch)[:0])
	*scratch = bufs
	if verr != nil {
		ic.landed()
		log.Warn("tcp rejected incoming write", "part", id, "err", verr)
		if err := r.discard(total); err != nil {
			return err
		}
		return e.reply(conn, encodeNack(id, nackCode(verr), verr.Error()))
	}
	if staged {
		in := make([]inSeg, len(segs))
		for i, sg := range segs {
			in[i] = inSeg{dev: bufs[i] == nil, addr: sg.addr, n: sg.n, host: bufs[i]}
		}
		copyErr, err := e.stage.landStaged(r, peer, in, ic.closed, e.done)
		e.reg.Unpin(pins)
		if err != nil {
			return fmt.Errorf("read payload of part %d: %w", id, err)
		}
		ic.landed()
		if copyErr != nil {
			log.Warn("tcp could not land incoming write in device memory", "part", id, "err", copyErr)
			return e.reply(conn, encodeNack(id, nackCode(copyErr), copyErr.Error()))
		}
		var ack [headerSize]byte
		putHeader(ack[:], frameHeader{typ: frameAck, id: id})
		return e.reply(conn, ack[:])
	}
	err := r.fullv(bufs)
	e.reg.Unpin(pins)
	if err != nil {
		return fmt.Errorf("read payload of part %d: %w", id, err)
	}
	ic.landed()
	var ack [headerSize]byte
	putHeader(ack[:], frameHeader{typ: frameAck, id: id})
	return e.reply(conn, ack[:])
}

// authorize asks the write guard (if one is installed) about every
// segment, once per range the guard allows, and appends the ranges it
// allowed to allowed.
func (e *Engine) authorize(peer string, segs []segment, allowed []transfer.Desc) ([]transfer.Desc, error) {
	g := e.guard.Load()
	if g == nil {
		return allowed, nil
	}
	return askGuard(*g, peer, segs, allowed, "incoming segment", "from")
}

// askGuard asks guard g (the write or the read guard) about every segment
// peer sends or reads, once per range it allows, and appends the ranges it
// allowed to allowed. A refusal names the segment ("tcp: <what> i [addr+n]
// <by> peer") and wraps ErrForbidden.
func askGuard(g func(peer string, d transfer.Desc) (transfer.Desc, error), peer string, segs []segment, allowed []transfer.Desc, what, by string) ([]transfer.Desc, error) {
	var last transfer.Desc
	for i, s := range segs {
		if last.Len > 0 && last.Contains(s.addr, s.n) {
			continue
		}
		a, err := g(peer, transfer.Desc{Addr: s.addr, Len: s.n, Kind: transfer.Host})
		if err == nil && !a.Contains(s.addr, s.n) {
			err = fmt.Errorf("guard allowed %v, not the segment", a)
		}
		if err != nil {
			return allowed, fmt.Errorf("tcp: %s %d [%#x+%d] %s %q: %w", what, i, s.addr, s.n, by, peer, forbidden(err))
		}
		last = a
		allowed = append(allowed, a)
	}
	return allowed, nil
}

// FenceWrites returns once no frame authorized for memory overlapping d is
// landing any more: the agent calls it when d's authorization ended (a
// grant returned by DATA, cancelled, expired or reclaimed) and before d is
// granted again. A frame still landing there (its payload trickling in) is
// cut: its connection is reset without reporting the peer lost, and
// FenceWrites waits for the connection's reader to return, so not one byte
// of it lands after. A frame whose payload is complete is never cut (its
// record is cleared before its ACK goes), so a sender that sends DATA after
// the ACK, as the pipeline does, loses nothing.
func (e *Engine) FenceWrites(d transfer.Desc) {
	var cut []*inConn // allocated only when a frame is cut
	e.mu.Lock()
	for ic := range e.incoming {
		if ic.landingIn(d) {
			cut = append(cut, ic)
		}
	}
	e.mu.Unlock()
	for _, ic := range cut {
		ic.cut.Store(true)
		ic.abort()
		n := e.stats.fencedWrites.Add(1)
		if n&(n-1) == 0 {
			name := "?"
			if p := ic.name.Load(); p != nil {
				name = *p
			}
			e.log.Warn("tcp: incoming write cut: its authorization ended while its payload was still arriving", "peer", name, "range", d, "fenced_writes_total", n)
		}
	}
	for _, ic := range cut {
		select {
		case <-ic.served:
		case <-e.done:
		}
	}
}

// resolveDsts maps segments to registered memory, appended to bufs (the
// connection's reused slice), and pins it. A segment in registered device
// memory (Config.Device) gets a nil entry and staged is true: it lands
// through a staging buffer.
func (e *Engine) resolveDsts(segs []segment, bufs [][]byte) (_ [][]byte, pins []uint64, staged bool, _ error) {
	e.memMu.RLock()
	defer e.memMu.RUnlock()
	var last transfer.Desc
	for i, s := range segs {
		if last.Len == 0 || !last.Contains(s.addr, s.n) {
			d, err := e.reg.FindAny(s.addr, s.n)
			if err == nil && !e.carries(d.Kind) {
				err = fmt.Errorf("[%#x+%d] lies in %v, which this engine cannot write: %w", s.addr, s.n, d, transfer.ErrUnsupported)
			}
			if err != nil {
				return bufs, nil, false, fmt.Errorf("tcp: incoming segment %d: %w", i, err)
			}
			last = d
			if !slices.Contains(pins, d.Addr) {
				pins = append(pins, d.Addr)
			}
		}
		if last.Kind != transfer.Host {
			bufs = append(bufs, nil)
			staged = true
			continue
		}
		bufs = append(bufs, mem.Unsafe(s.addr, s.n))
	}
	if err := e.reg.Pin(pins); err != nil {
		return bufs, nil, false, fmt.Errorf("tcp: incoming write: %w", err)
	}
	return bufs, pins, staged, nil
}

func (e *Engine) reply(conn net.Conn, frame []byte) error {
	conn.SetWriteDeadline(time.Now().Add(e.cfg.WriteTimeout))
	_, err := conn.Write(frame)
	return err
}
