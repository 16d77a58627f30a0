package tcp

import (
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// Reads (transfer.Reader, transfer.ReadGuarded). The reader sends a READ
// frame on one of its connections to the peer, naming the peer's memory;
// the peer's connection server asks its ReadGuard about every segment
// (the reader named by its authenticated name, as for writes), pins the
// memory and answers READ_DATA with the bytes written straight from it,
// or a NACK (ErrForbidden: the guard refused; nothing is sent). The
// reader's session lands the bytes straight into the registered
// destination. A READ is a part like a WRITE: the same connections,
// striping, deadlines, body budget and failure rules (ForgetPeer, Close,
// a broken connection fail it; it is resolved only once the session's
// reader stopped touching its destination).

// readFenceGrace is how long FenceReads lets a response still being sent
// finish before it cuts the connection: the agent revokes a read grant when
// the reader's ACK arrived, by which time the reader holds every byte and
// the response's write is returning.
const readFenceGrace = 100 * time.Millisecond

// SetReadGuard installs g; every incoming read is checked against it
// before a byte is sent (transfer.ReadGuarded). Nil removes it, and with
// none installed no read is served.
func (e *Engine) SetReadGuard(g transfer.ReadGuard) {
	if g == nil {
		e.rguard.Store(nil)
		return
	}
	e.rguard.Store(&g)
}

// PostRead checks every destination against this engine's registered
// memory and every source against the ranges the peer advertised, then
// sends the reads as one operation, striped over the peer's connections
// when large (transfer.Reader). Host memory only. Zero-length reads are
// allowed and move nothing.
func (e *Engine) PostRead(peerName string, ops []transfer.ReadOp) (transfer.Op, error) {
	p, err := e.peer(peerName)
	if err != nil {
		return nil, fmt.Errorf("tcp: post read from %q: %w", peerName, err)
	}
	var total uint64
	for i, op := range ops {
		if op.Src.Len != op.Dst.Len {
			return nil, fmt.Errorf("tcp: post read from %q: op %d: source length %d != destination length %d: %w", peerName, i, op.Src.Len, op.Dst.Len, transfer.ErrOutOfBounds)
		}
		if op.Src.Len == 0 {
			continue
		}
		if op.Src.Kind != transfer.Host || op.Dst.Kind != transfer.Host {
			return nil, fmt.Errorf("tcp: post read from %q: op %d: %v -> %v: reads move host memory only: %w", peerName, i, op.Src, op.Dst, transfer.ErrUnsupported)
		}
		total += op.Src.Len
	}
	if err := checkRemote(p, ops, readSrc, "source"); err != nil {
		return nil, fmt.Errorf("tcp: post read from %q: %w", peerName, err)
	}
	pins, err := pinLocal(e, ops, readDst, "destination")
	if err != nil {
		return nil, fmt.Errorf("tcp: post read from %q: %w", peerName, err)
	}
	parts := e.splitReads(ops, total, p)
	o := newWriteOp(e, peerName, len(parts), pins)
	o.what = "read from"
	for _, pt := range parts {
		pt.op = o
	}
	p.enqueue(parts)
	return o, nil
}

func readSrc(op transfer.ReadOp) transfer.Desc { return op.Src }
func readDst(op transfer.ReadOp) transfer.Desc { return op.Dst }

// splitReads cuts reads into READ parts of at most the stripe budget and
// MaxSegments, as split does writes.
func (e *Engine) splitReads(ops []transfer.ReadOp, total uint64, p *peer) []*part {
	n := uint64(len(p.slots))
	budget := (total + n - 1) / max(n, 1)
	budget = max(budget, uint64(e.cfg.StripeBytes))
	budget = min(budget, MaxFramePayload)
	var parts []*part
	var cur *part
	for _, op := range ops {
		dst := mem.Unsafe(op.Dst.Addr, op.Dst.Len)
		off := uint64(0)
		for off < op.Src.Len {
			if cur == nil || cur.bytes == budget || cur.nseg == MaxSegments {
				if cur != nil {
					cur.seal()
				}
				cur = newPart(e.nextID.Add(1), 4)
				cur.read = true
				parts = append(parts, cur)
			}
			k := min(op.Src.Len-off, budget-cur.bytes)
			cur.addRead(op.Src.Addr+off, dst[off:off+k])
			off += k
		}
	}
	if cur != nil {
		cur.seal()
	}
	return parts
}

// serveRead answers READ id of peer: every segment allowed by the read
// guard and lying in registered host memory, or a NACK and nothing sent.
// The ranges the guard allowed are recorded on ic while the response is
// sent, so FenceReads finds it.
func (e *Engine) serveRead(ic *inConn, conn net.Conn, peer string, id uint64, segs []segment, log interface{ Warn(string, ...any) }) error {
	ic.readMu.Lock()
	allowed, aerr := e.authorizeRead(peer, segs, ic.reading[:0])
	ic.reading = allowed
	if aerr == nil {
		ic.sent = make(chan struct{})
	}
	ic.readMu.Unlock()
	if aerr != nil {
		n := e.stats.forbiddenReads.Add(1)
		if n&(n-1) == 0 {
			log.Warn("tcp refused incoming read: not authorized", "part", id, "err", aerr, "forbidden_reads_total", n)
		}
		return e.reply(conn, encodeNack(id, nackForbidden, aerr.Error()))
	}
	defer ic.readServed()
	bufs, pins, verr := e.resolveSrcs(segs)
	if verr != nil {
		log.Warn("tcp rejected incoming read", "part", id, "err", verr)
		return e.reply(conn, encodeNack(id, nackCode(verr), verr.Error()))
	}
	defer e.reg.Unpin(pins)
	var h [headerSize]byte
	putHeader(h[:], frameHeader{typ: frameReadData, id: id})
	conn.SetWriteDeadline(time.Now().Add(e.cfg.WriteTimeout))
	if err := writeBufs(conn, append([][]byte{h[:]}, bufs...)); err != nil {
		return fmt.Errorf("send read data of part %d: %w", id, err)
	}
	return nil
}

// authorizeRead asks the read guard about every segment, once per range
// it allows; without a guard nothing is allowed.
func (e *Engine) authorizeRead(peer string, segs []segment, allowed []transfer.Desc) ([]transfer.Desc, error) {
	g := e.rguard.Load()
	if g == nil {
		return allowed, fmt.Errorf("tcp: read from %q: no read guard is installed, so this engine serves no reads: %w", peer, transfer.ErrForbidden)
	}
	return askGuard(*g, peer, segs, allowed, "read segment", "by")
}

// resolveSrcs maps read segments to registered host memory and pins it.
func (e *Engine) resolveSrcs(segs []segment) ([][]byte, []uint64, error) {
	e.memMu.RLock()
	defer e.memMu.RUnlock()
	bufs := make([][]byte, 0, len(segs))
	var pins []uint64
	var last transfer.Desc
	for i, s := range segs {
		if last.Len == 0 || !last.Contains(s.addr, s.n) {
			d, err := e.reg.FindAny(s.addr, s.n)
			if err == nil && d.Kind != transfer.Host {
				err = fmt.Errorf("[%#x+%d] lies in %v: reads serve host memory only: %w", s.addr, s.n, d, transfer.ErrUnsupported)
			}
			if err != nil {
				return nil, nil, fmt.Errorf("tcp: read segment %d: %w", i, err)
			}
			last = d
			if !slices.Contains(pins, d.Addr) {
				pins = append(pins, d.Addr)
			}
		}
		bufs = append(bufs, mem.Unsafe(s.addr, s.n))
	}
	if err := e.reg.Pin(pins); err != nil {
		return nil, nil, fmt.Errorf("tcp: incoming read: %w", err)
	}
	return bufs, pins, nil
}

// FenceReads returns once no read response reading memory overlapping d
// is being sent (transfer.ReadGuarded): one still going after
// readFenceGrace is cut (its connection reset, without reporting the peer
// lost) and its server waited for, so nothing of d is sent after.
func (e *Engine) FenceReads(d transfer.Desc) {
	type serving struct {
		ic   *inConn
		sent chan struct{}
	}
	var busy []serving
	e.mu.Lock()
	for ic := range e.incoming {
		if ch := ic.readingIn(d); ch != nil {
			busy = append(busy, serving{ic, ch})
		}
	}
	e.mu.Unlock()
	if len(busy) == 0 {
		return
	}
	grace := time.NewTimer(min(readFenceGrace, e.cfg.WriteTimeout))
	defer grace.Stop()
	for _, s := range busy {
		select {
		case <-s.sent:
			continue
		case <-grace.C:
		case <-e.done:
			return
		}
		// Past the grace: cut this one and every other still sending.
		for _, s := range busy {
			select {
			case <-s.sent:
				continue
			default:
			}
			s.ic.cut.Store(true)
			s.ic.abort()
			n := e.stats.fencedReads.Add(1)
			if n&(n-1) == 0 {
				e.log.Warn("tcp: read response cut: its grant ended while it was still being sent", "range", d, "fenced_reads_total", n)
			}
			select {
			case <-s.ic.served:
			case <-e.done:
			}
		}
		return
	}
}
