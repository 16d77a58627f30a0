package tcp

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// peer is a loaded (or learned) remote engine and its outgoing connections.
type peer struct {
	e      *Engine
	name   string
	addr   string
	inc    uint64 // its incarnation (metadata.inc; 0: unknown)
	slots  []*slot
	notifs chan []byte // outgoing notifications, sent on slot 0
	rr     atomic.Uint64
	gone   atomic.Bool
	// learned: created from a HELLO, never loaded with LoadPeer (under
	// Engine.mu). A learned peer is dropped when its last connection ends.
	learned bool
	// unreachable says why a learned peer is not dialed: its HELLO
	// advertised an address on another host than the one its connection
	// came from (nil: dial addr).
	unreachable error

	mu     sync.RWMutex
	ranges []transfer.Desc // sorted, non-overlapping
}

func newPeer(e *Engine, m metadata) *peer {
	p := &peer{e: e, name: m.name, addr: m.addr, inc: m.inc, ranges: m.ranges, notifs: make(chan []byte, e.cfg.NotifyQueue)}
	p.slots = make([]*slot, e.cfg.Connections)
	for i := range p.slots {
		p.slots[i] = &slot{p: p, idx: i, kick: make(chan struct{}, 1)}
	}
	return p
}

func (p *peer) setRanges(r []transfer.Desc) {
	p.mu.Lock()
	p.ranges = r
	p.mu.Unlock()
}

// checkRemote checks every op's remote range (side(op): a write's
// destination, a read's source; named by what) against the peer's
// advertised ranges.
func checkRemote[Op any](p *peer, ops []Op, side func(Op) transfer.Desc, what string) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	var last transfer.Desc
	for i, op := range ops {
		d := side(op)
		if d.Len == 0 || last.Len > 0 && last.Contains(d.Addr, d.Len) {
			continue
		}
		r, err := mem.FindRange(p.ranges, d.Addr, d.Len)
		if err != nil {
			return fmt.Errorf("op %d %s on peer %q: %w", i, what, p.name, err)
		}
		last = r
	}
	return nil
}

// enqueue spreads parts round-robin over the slots and makes sure each slot
// has a session to send them. Parts that cannot be sent fail at once.
func (p *peer) enqueue(parts []*part) {
	if len(parts) == 0 {
		return
	}
	n := uint64(len(p.slots))
	start := p.rr.Add(uint64(len(parts))) - uint64(len(parts))
	if len(parts) == 1 {
		p.slots[start%n].push(parts)
		return
	}
	groups := make([][]*part, n)
	for i, pt := range parts {
		k := (start + uint64(i)) % n
		groups[k] = append(groups[k], pt)
	}
	for i, g := range groups {
		if len(g) > 0 {
			p.slots[i].push(g)
		}
	}
}

// shutdown marks the peer gone and stops its sessions with cause, waiting
// until each has failed its parts.
func (p *peer) shutdown(cause error) {
	for _, w := range p.stop(cause) {
		<-w
	}
}

// stop marks the peer gone and stops its sessions with cause; it returns
// the channels closed once each has failed its parts (its fence included),
// so several peers can be stopped first and waited for together.
func (p *peer) stop(cause error) []chan struct{} {
	p.gone.Store(true)
	var wait []chan struct{}
	for _, s := range p.slots {
		s.mu.Lock()
		if s.sess != nil {
			s.sess.stopLocked(cause)
			wait = append(wait, s.sess.finished)
		}
		s.mu.Unlock()
	}
	return wait
}

// part is one WRITE frame: a slice of a post for one connection.
type part struct {
	id    uint64
	op    *writeOp
	bufs  [][]byte // [0] is header + segment table, then source slices
	bytes uint64
	nseg  int
	dev   []devSeg // device sources, staged into bufs just before the write
	// read marks a READ part: bufs holds its frame alone, dsts the local
	// memory its READ_DATA lands in (written by the session's reader).
	read bool
	dsts [][]byte

	// guarded by the sending slot's mu
	written  bool
	replied  bool
	replyErr error
}

func newPart(id uint64, segHint int) *part {
	hdr := make([]byte, headerSize+4, headerSize+4+16*segHint)
	return &part{id: id, bufs: append(make([][]byte, 0, segHint+1), hdr)}
}

func (pt *part) add(dst uint64, src []byte) {
	pt.bufs[0] = appendSegment(pt.bufs[0], dst, uint64(len(src)))
	pt.bufs = append(pt.bufs, src)
	pt.bytes += uint64(len(src))
	pt.nseg++
}

// addDev adds a segment whose source is device memory at src: its bufs
// entry is filled from a staging buffer when the part is written.
func (pt *part) addDev(dst, src, n uint64) {
	pt.bufs[0] = appendSegment(pt.bufs[0], dst, n)
	pt.bufs = append(pt.bufs, nil)
	pt.dev = append(pt.dev, devSeg{idx: len(pt.bufs) - 1, src: src, n: n})
	pt.bytes += n
	pt.nseg++
}

// addRead adds a segment reading the peer's memory at src into dst.
func (pt *part) addRead(src uint64, dst []byte) {
	pt.bufs[0] = appendSegment(pt.bufs[0], src, uint64(len(dst)))
	pt.dsts = append(pt.dsts, dst)
	pt.bytes += uint64(len(dst))
	pt.nseg++
}

// seal fills in the frame header once all segments are added.
func (pt *part) seal() {
	h := pt.bufs[0]
	typ := frameWrite
	if pt.read {
		typ = frameRead
	}
	putHeader(h, frameHeader{typ: typ, bodyLen: uint32(len(h) - headerSize), id: pt.id})
	binary.LittleEndian.PutUint32(h[headerSize:], uint32(pt.nseg))
}

// slot is one of a peer's N outgoing connections. A session goroutine owns
// the TCP connection while it lives; a new one is started when work arrives
// and none is running.
type slot struct {
	p    *peer
	idx  int
	kick chan struct{} // wakes the session's writer

	mu    sync.Mutex
	queue []*part
	sess  *session
}

// push queues parts and starts or wakes the session.
func (s *slot) push(parts []*part) {
	s.mu.Lock()
	s.queue = append(s.queue, parts...)
	err := s.ensureLocked()
	var failed []*part
	if err != nil {
		failed, s.queue = s.queue, nil
	}
	s.mu.Unlock()
	for _, pt := range failed {
		pt.op.partDone(err)
	}
}

// ensureLocked starts a session unless one is running, or wakes it.
func (s *slot) ensureLocked() error {
	if s.sess != nil {
		select {
		case s.kick <- struct{}{}:
		default:
		}
		return nil
	}
	if s.p.e.isClosed() {
		return fmt.Errorf("tcp: engine %q: %w", s.p.e.cfg.Name, transfer.ErrClosed)
	}
	if s.p.gone.Load() {
		return fmt.Errorf("tcp: peer %q: %w", s.p.name, transfer.ErrPeerLost)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ss := &session{s: s, ctx: ctx, cancel: cancel, inflight: make(map[uint64]*part), finished: make(chan struct{})}
	if !s.p.e.spawn(ss.run) {
		cancel()
		return fmt.Errorf("tcp: engine %q: %w", s.p.e.cfg.Name, transfer.ErrClosed)
	}
	s.sess = ss
	return nil
}

// session is the life of one outgoing TCP connection: dial, HELLO, then a
// writer loop (this goroutine) and a reader goroutine for ACK/NACK frames.
type session struct {
	s        *slot
	ctx      context.Context
	cancel   context.CancelFunc
	finished chan struct{} // closed after every part was resolved

	// guarded by s.mu
	stopped      bool
	cause        error
	conn         net.Conn
	inflight     map[uint64]*part // taken from the queue, not yet resolved
	writing      bool
	lastProgress time.Time
	broke        bool      // ended by its connection failing, not by a stop
	fenceBy      time.Time // set by stopLocked: the reader waits this long for the peer's close
	peerClosed   bool      // the reader saw the peer close: nothing more lands
}

// stopLocked ends the session with cause (the first cause wins). The
// caller holds s.s.mu.
func (ss *session) stopLocked(cause error) {
	if ss.stopped {
		return
	}
	ss.stopped, ss.cause = true, cause
	ss.cancel()
	if ss.conn != nil {
		ss.fenceLocked()
	}
}

// fenceLocked starts the proof that the peer writes nothing more of this
// connection's parts into its memory. A reset would not give it: the
// peer's kernel keeps what it already received and the peer's reader
// copies it into memory after the reset. So the connection is half-closed
// instead (a write in progress stops, FIN follows what was sent), and the
// reader goes on taking ACKs until the peer, having applied everything it
// received, closes its side; only that EOF proves quiescence. The wait is
// bounded by FenceTimeout; past it the parts fail non-quiescent (run).
func (ss *session) fenceLocked() {
	ss.fenceBy = time.Now().Add(ss.s.p.e.cfg.FenceTimeout)
	if tc, ok := ss.conn.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	} else {
		abort(ss.conn)
	}
	_ = ss.conn.SetReadDeadline(ss.fenceBy)
}

// abort closes c with a reset rather than a FIN: both kernels drop what is
// still queued in their send queues. It does not stop the receiver from
// applying what its kernel already received (see fenceLocked).
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// breakOff ends the session because its connection failed (read or write
// error, EOF), as opposed to a stop from this side; run reports the peer
// lost then if no other connection to it is left.
func (ss *session) breakOff(cause error) {
	ss.s.mu.Lock()
	if !ss.stopped {
		ss.broke = true
	}
	ss.stopLocked(cause)
	ss.s.mu.Unlock()
}

func (ss *session) stop(cause error) {
	ss.s.mu.Lock()
	ss.stopLocked(cause)
	ss.s.mu.Unlock()
}

func (ss *session) lost(err error) error {
	return fmt.Errorf("tcp: peer %q connection %d: %w (%w)", ss.s.p.name, ss.s.idx, transfer.ErrPeerLost, err)
}

func (ss *session) run() {
	err := ss.loop()
	s := ss.s
	s.mu.Lock()
	// A connection that was up and ended by itself (reset, EOF: the peer
	// process died) rather than by a stop from this side.
	broke := ss.broke && ss.conn != nil
	if err != nil {
		ss.stopLocked(ss.lost(err))
	} else {
		ss.stopLocked(ss.lost(errors.New("session ended")))
	}
	cause := ss.cause
	// A part that went (or was going) out on a connection the peer was not
	// seen to close may still land: it fails non-quiescent.
	sentCause := cause
	if ss.conn != nil && !ss.peerClosed {
		sentCause = fmt.Errorf("%w (%w: the peer was not seen to close the connection within %v)",
			cause, transfer.ErrNotQuiescent, s.p.e.cfg.FenceTimeout)
	}
	failed := make([]*part, 0, len(ss.inflight)+len(s.queue))
	errs := make([]error, 0, cap(failed))
	for _, pt := range ss.inflight {
		failed = append(failed, pt)
		switch {
		case pt.replied && pt.replyErr != nil:
			errs = append(errs, pt.replyErr)
		case pt.read:
			// A read lands only through this session's reader, which has
			// returned: it touches nothing any more, whatever the peer does.
			errs = append(errs, cause)
		default:
			errs = append(errs, sentCause)
		}
	}
	for _, pt := range s.queue {
		failed = append(failed, pt)
		errs = append(errs, cause)
	}
	ss.inflight, s.queue, s.sess = nil, nil, nil
	s.mu.Unlock()
	for i, pt := range failed {
		pt.op.partDone(errs[i])
	}
	close(ss.finished)
	if len(failed) > 0 {
		s.p.e.log.Debug("tcp connection ended", "peer", s.p.name, "conn", s.idx, "failed_parts", len(failed), "cause", cause)
	}
	if broke && !s.p.gone.Load() && !s.p.connected() {
		s.p.e.peerLost(s.p.name)
	}
}

// connected reports whether any of the peer's outgoing connections has a
// session.
func (p *peer) connected() bool {
	for _, s := range p.slots {
		s.mu.Lock()
		live := s.sess != nil
		s.mu.Unlock()
		if live {
			return true
		}
	}
	return false
}

// loop runs the connection; it returns when the connection is done. On
// return no goroutine of this session touches source memory any more.
func (ss *session) loop() (err error) {
	e := ss.s.p.e
	if err := ss.s.p.unreachable; err != nil {
		return err
	}
	d := net.Dialer{Timeout: e.cfg.DialTimeout, KeepAliveConfig: keepAlive(e.cfg)}
	conn, err := d.DialContext(ss.ctx, "tcp", ss.s.p.addr)
	if err != nil {
		return fmt.Errorf("dial %s: %w", ss.s.p.addr, err)
	}
	ss.s.mu.Lock()
	if ss.stopped {
		ss.s.mu.Unlock()
		conn.Close()
		return nil
	}
	ss.conn = conn
	ss.lastProgress = time.Now()
	ss.s.mu.Unlock()
	defer conn.Close()

	var wc net.Conn = conn // what frames go through
	if a := e.authenticator(); a != nil {
		sc, err := e.dialHandshake(a, conn, ss.s.p.name)
		if err != nil {
			return err
		}
		sc.unsealReplies(false)
		wc = sc
	}
	if err := writeFrame(wc, e.cfg.WriteTimeout, frameHello, 0, e.metadata()); err != nil {
		return fmt.Errorf("send hello: %w", err)
	}
	if sc, ok := wc.(*secureConn); ok {
		sc.helloWritten()
	}
	conn = wc
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		err := ss.readLoop(conn)
		ss.breakOff(ss.lost(err)) // a no-op when this side stopped first
		if !peerClosed(err) {
			// Ended by itself (a stall, a bad frame) or by the fence's
			// deadline: wait (bounded by the fence) for the close.
			err = ss.awaitClose()
		}
		ss.s.mu.Lock()
		ss.peerClosed = peerClosed(err)
		ss.s.mu.Unlock()
	}()
	defer func() {
		if err != nil {
			ss.breakOff(ss.lost(err)) // name the cause and fence
		}
		<-readerDone // bounded: every path here has fenced, or the reader ended
		conn.Close()
	}()

	var notifs chan []byte
	if ss.s.idx == 0 {
		notifs = ss.s.p.notifs
	}
	for {
		if err := ss.drain(conn, notifs); err != nil {
			return err
		}
		select {
		case <-ss.ctx.Done():
			return nil
		case <-readerDone:
			return nil
		case msg := <-notifs:
			if err := ss.sendNotif(conn, msg); err != nil {
				return err
			}
		case <-ss.s.kick:
		}
	}
}

// drain writes every queued part, interleaving pending notifications.
func (ss *session) drain(conn net.Conn, notifs chan []byte) error {
	s := ss.s
	for {
		select {
		case msg := <-notifs:
			if err := ss.sendNotif(conn, msg); err != nil {
				return err
			}
			continue
		default:
		}
		s.mu.Lock()
		if ss.stopped || len(s.queue) == 0 {
			s.mu.Unlock()
			return nil
		}
		pt := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		ss.inflight[pt.id] = pt
		ss.writing = true
		s.mu.Unlock()

		var staging []byte
		if len(pt.dev) > 0 {
			st := s.p.e.stage
			var err error
			if staging, err = st.get(st.out, ss.ctx.Done()); err == nil {
				err = st.stageOut(pt, staging)
			}
			if err != nil {
				// Nothing of this part went out: it fails alone (its
				// device sources were only read, by copies that ended).
				if staging != nil {
					st.put(st.out, staging)
				}
				s.mu.Lock()
				ss.writing = false
				delete(ss.inflight, pt.id)
				pt.bufs = nil
				s.mu.Unlock()
				pt.op.partDone(fmt.Errorf("tcp: stage part %d: %w", pt.id, err))
				continue
			}
		}
		if h := s.p.e.cfg.Hold; h != nil || s.p.e.stalls.block.Load() != nil {
			if h != nil {
				h(ss.ctx.Done())
			}
			s.p.e.stalls.wait(ss.ctx.Done())
			if ss.ctx.Err() != nil {
				// Given up while held: nothing of this part went out.
				if staging != nil {
					s.p.e.stage.put(s.p.e.stage.out, staging)
				}
				return fmt.Errorf("write part %d: connection given up before the part went out", pt.id)
			}
		}
		conn.SetWriteDeadline(time.Now().Add(s.p.e.cfg.WriteTimeout))
		err := writeBufs(conn, pt.bufs)
		if staging != nil {
			s.p.e.stage.put(s.p.e.stage.out, staging) // the write returned: nothing reads it
		}

		s.mu.Lock()
		ss.writing = false
		ss.lastProgress = time.Now()
		pt.bufs = nil
		var resolve bool
		if err == nil {
			pt.written = true
			if pt.replied {
				delete(ss.inflight, pt.id)
				resolve = true
			}
		}
		s.mu.Unlock()
		if resolve {
			pt.op.partDone(pt.replyErr)
		}
		if err != nil {
			return fmt.Errorf("write part %d: %w", pt.id, err)
		}
	}
}

func (ss *session) sendNotif(conn net.Conn, msg []byte) error {
	ss.s.mu.Lock()
	ss.writing = true
	ss.s.mu.Unlock()
	err := writeFrame(conn, ss.s.p.e.cfg.WriteTimeout, frameNotif, 0, msg)
	ss.s.mu.Lock()
	ss.writing = false
	ss.lastProgress = time.Now()
	ss.s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("send notification: %w", err)
	}
	return nil
}

// writeFrame writes a header and body with one writev under a deadline.
func writeFrame(conn net.Conn, timeout time.Duration, typ byte, id uint64, body []byte) error {
	var h [headerSize]byte
	putHeader(h[:], frameHeader{typ: typ, bodyLen: uint32(len(body)), id: id})
	conn.SetWriteDeadline(time.Now().Add(timeout))
	return writeBufs(conn, [][]byte{h[:], body})
}

// peerClosed reports whether a read error means the peer closed the
// connection (EOF, a reset): its reader has returned, so it lands nothing
// more of what this side sent.
func peerClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// awaitClose discards what the peer still sends until it closes the
// connection or the fence's deadline passes.
func (ss *session) awaitClose() error {
	_, err := io.Copy(io.Discard, ss.conn)
	if err == nil {
		err = io.EOF // io.Copy reports a clean EOF as nil
	}
	return err
}

// readLoop reads ACK and NACK frames until the connection fails. While work
// is outstanding and nothing is being written, a silence of IdleTimeout
// declares the peer dead. Once the session is stopped it reads on, taking
// ACKs, until the peer closes or the fence's deadline passes.
func (ss *session) readLoop(conn net.Conn) error {
	idle := ss.s.p.e.cfg.IdleTimeout
	br := bufio.NewReaderSize(conn, 4096)
	var hdr [headerSize]byte
	body := make([]byte, 0, 64)
	for {
		ss.setReadDeadline(conn, idle)
		n, err := io.ReadFull(br, hdr[:])
		if err != nil {
			var ne net.Error
			if n == 0 && errors.As(err, &ne) && ne.Timeout() && !ss.stalled(idle) {
				continue
			}
			return err
		}
		h, err := parseHeader(hdr[:])
		if err != nil {
			return err
		}
		body = body[:0]
		if h.bodyLen > 0 {
			body = append(body, make([]byte, h.bodyLen)...)
			if _, err := io.ReadFull(br, body); err != nil {
				return err
			}
		}
		switch h.typ {
		case frameAck:
			err = ss.reply(h.id, nil)
		case frameReadData:
			discarded, err := ss.landRead(br, conn, h.id, idle)
			if err != nil {
				return err
			}
			err = ss.reply(h.id, discarded)
		case frameNack:
			code, text, perr := parseNack(body)
			if perr != nil {
				return perr
			}
			rerr := fmt.Errorf("tcp: peer %q rejected the request: %s: %w", ss.s.p.name, text, nackSentinel(code))
			if h.id == 0 {
				return rerr
			}
			err = ss.reply(h.id, rerr)
		default:
			err = fmt.Errorf("unexpected frame type %d from receiver: %w", h.typ, errProtocol)
		}
		if err != nil {
			return err
		}
	}
}

// landRead reads the payload of READ_DATA id into its part's local
// destinations, piece by piece (1 MiB). Whether the session was stopped
// (given up: ForgetPeer, Close, a failure) is checked before each piece: a
// stopped session reads the pieces left into scratch, discarding them, so
// once a stop began at most the piece then being read still lands, and
// discarded (the stop's cause) fails the part: its destination does not
// hold the bytes. What makes a failed read safe is not this check but the
// order: the part is failed only after this reader returned (session.run),
// so nothing of it lands once its operation is terminal. Every read of the
// payload must progress within idle.
func (ss *session) landRead(br *bufio.Reader, conn net.Conn, id uint64, idle time.Duration) (discarded, err error) {
	ss.s.mu.Lock()
	pt := ss.inflight[id]
	ss.s.mu.Unlock()
	if pt == nil || !pt.read || pt.replied {
		return nil, fmt.Errorf("read data for unknown part %d: %w", id, errProtocol)
	}
	const piece = 1 << 20
	var scratch []byte
	for _, d := range pt.dsts {
		for len(d) > 0 {
			n := min(len(d), piece)
			if h := ss.s.p.e.landHold; h != nil {
				h(ss.ctx.Done())
			}
			ss.s.mu.Lock()
			if ss.stopped && discarded == nil {
				discarded = fmt.Errorf("tcp: read data of part %d discarded: the connection was given up before all of it arrived: %w", id, ss.cause)
			}
			if !ss.stopped {
				_ = conn.SetReadDeadline(time.Now().Add(idle))
			}
			ss.lastProgress = time.Now()
			ss.s.mu.Unlock()
			dst := d[:n]
			if discarded != nil {
				if scratch == nil {
					scratch = make([]byte, piece)
				}
				dst = scratch[:n]
			}
			if _, err := io.ReadFull(br, dst); err != nil {
				return nil, fmt.Errorf("read data of part %d: %w", id, err)
			}
			d = d[n:]
		}
	}
	return discarded, nil
}

// setReadDeadline gives the next read IdleTimeout, or what is left of the
// fence's wait once the session is stopped. It holds the slot's lock so a
// fence that starts meanwhile is not overwritten.
func (ss *session) setReadDeadline(conn net.Conn, idle time.Duration) {
	ss.s.mu.Lock()
	dl := time.Now().Add(idle)
	if ss.stopped {
		dl = ss.fenceBy
	}
	_ = conn.SetReadDeadline(dl)
	ss.s.mu.Unlock()
}

// stalled reports whether work is outstanding with no progress for idle;
// a stopped session has stalled once its fence's deadline passed.
func (ss *session) stalled(idle time.Duration) bool {
	ss.s.mu.Lock()
	defer ss.s.mu.Unlock()
	if ss.stopped {
		return true
	}
	if ss.writing || len(ss.inflight) == 0 {
		return false
	}
	return time.Since(ss.lastProgress) >= idle
}

// reply resolves part id, or records the reply until its write returns.
func (ss *session) reply(id uint64, rerr error) error {
	s := ss.s
	s.mu.Lock()
	ss.lastProgress = time.Now()
	pt := ss.inflight[id]
	if pt == nil || pt.replied {
		s.mu.Unlock()
		return fmt.Errorf("reply for unknown part %d: %w", id, errProtocol)
	}
	pt.replied, pt.replyErr = true, rerr
	done := pt.written
	if done {
		delete(ss.inflight, id)
	}
	s.mu.Unlock()
	if done {
		pt.op.partDone(rerr)
	}
	return nil
}

func keepAlive(cfg Config) net.KeepAliveConfig {
	iv := max(cfg.IdleTimeout/5, time.Second)
	return net.KeepAliveConfig{Enable: true, Idle: cfg.IdleTimeout, Interval: iv, Count: 5}
}
