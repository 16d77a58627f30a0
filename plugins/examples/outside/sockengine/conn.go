package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// outConn is one outgoing connection to a peer and its two goroutines:
// run dials, then writes the queued ops' frames in order; readAcks settles
// ops as the peer acks them. Once the connection fails it is dead: every op
// it held fails, and the engine starts a new outConn for the next post.
type outConn struct {
	cfg  config
	addr string
	wg   *sync.WaitGroup

	wake    chan struct{} // something was queued, or the conn died
	readers sync.WaitGroup

	mu       sync.Mutex
	conn     net.Conn
	dead     bool
	why      error             // what every op still held fails with
	queue    []*writeOp        // not yet written
	current  *writeOp          // being written: it still reads its sources
	deferred map[*writeOp]bool // settled while current; finished after the write
	sent     map[uint64]*writeOp
	nextID   uint64
	results  map[*writeOp]result
}

type result struct {
	st  transfer.Status
	err error
}

func newOutConn(cfg config, addr string, wg *sync.WaitGroup) *outConn {
	oc := &outConn{cfg: cfg, addr: addr, wg: wg, wake: make(chan struct{}, 1), sent: map[uint64]*writeOp{}, results: map[*writeOp]result{}}
	wg.Add(1)
	go oc.run()
	return oc
}

func (oc *outConn) isDead() bool {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	return oc.dead
}

// enqueue queues w; it never blocks.
func (oc *outConn) enqueue(w *writeOp) {
	oc.mu.Lock()
	if oc.dead {
		why := oc.why
		oc.mu.Unlock()
		w.finish(transfer.Failed, why)
		return
	}
	oc.queue = append(oc.queue, w)
	oc.mu.Unlock()
	oc.signal()
}

func (oc *outConn) signal() {
	select {
	case oc.wake <- struct{}{}:
	default:
	}
}

func (oc *outConn) run() {
	defer oc.wg.Done()
	conn, err := net.DialTimeout("tcp", oc.addr, oc.cfg.dialTimeout)
	if err != nil {
		oc.stop(fmt.Errorf("sockengine: dial %s: %v: %w", oc.addr, err, transfer.ErrPeerLost))
		return
	}
	oc.mu.Lock()
	if oc.dead { // aborted while dialing
		oc.mu.Unlock()
		conn.Close()
		return
	}
	oc.conn = conn
	oc.readers.Add(1) // before quiesce can see conn and wait for readers
	oc.mu.Unlock()
	go oc.readAcks(conn)
	defer oc.readers.Wait()
	w := bufio.NewWriterSize(conn, 64<<10)
	if _, err := w.Write(appendString(nil, oc.cfg.name)); err != nil {
		oc.shutdown(fmt.Errorf("sockengine: hello to %s: %v: %w", oc.addr, err, transfer.ErrPeerLost))
		return
	}
	for range oc.wake {
		for {
			oc.mu.Lock()
			if oc.dead || len(oc.queue) == 0 {
				dead := oc.dead
				oc.mu.Unlock()
				if dead {
					return
				}
				break
			}
			op := oc.queue[0]
			oc.queue = oc.queue[1:]
			oc.nextID++
			id := oc.nextID
			oc.current, oc.sent[id] = op, op
			oc.mu.Unlock()
			err := writeFrames(w, id, op.segs)
			if err == nil {
				err = w.Flush()
			}
			oc.mu.Lock()
			oc.current = nil
			res, settled := oc.results[op]
			delete(oc.results, op)
			oc.mu.Unlock()
			if settled {
				op.finish(res.st, res.err)
			}
			if err != nil {
				oc.shutdown(fmt.Errorf("sockengine: write to %s: %v: %w", oc.addr, err, transfer.ErrPeerLost))
				return
			}
		}
	}
}

func writeFrames(w *bufio.Writer, id uint64, segs []segment) error {
	var h [frameHeader]byte
	for i, s := range segs {
		binary.BigEndian.PutUint64(h[0:], id)
		binary.BigEndian.PutUint64(h[8:], s.dst)
		binary.BigEndian.PutUint32(h[16:], uint32(s.n))
		h[20] = 0
		if i == len(segs)-1 {
			h[20] = 1
		}
		if _, err := w.Write(h[:]); err != nil {
			return err
		}
		if _, err := w.Write(mem.Unsafe(s.src, s.n)); err != nil {
			return err
		}
	}
	return nil
}

// readAcks settles ops as the peer acks them, until the connection ends;
// then it settles every op still sent: the peer closed its side (or it is
// gone), so it lands nothing more of them.
func (oc *outConn) readAcks(conn net.Conn) {
	defer oc.readers.Done()
	err := oc.acks(conn)
	oc.mu.Lock()
	oc.dead = true
	if oc.why == nil {
		oc.why = fmt.Errorf("sockengine: connection to %s lost: %v: %w", oc.addr, err, transfer.ErrPeerLost)
	}
	why := oc.why
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// The peer did not close its side within the fence timeout.
		why = fmt.Errorf("%w (and %s did not prove within %v that it lands none of it: %w)", why, oc.addr, oc.cfg.fence, transfer.ErrNotQuiescent)
	}
	ops := oc.queue
	oc.queue = nil
	for id, op := range oc.sent {
		ops = append(ops, op)
		delete(oc.sent, id)
	}
	oc.mu.Unlock()
	conn.Close()
	for _, op := range ops {
		oc.settle(op, transfer.Failed, why)
	}
	oc.signal()
}

// acks reads acks and settles their ops until the connection fails.
func (oc *outConn) acks(conn net.Conn) error {
	r := bufio.NewReader(conn)
	var h [ackHeader]byte
	for {
		if _, err := io.ReadFull(r, h[:]); err != nil {
			return err
		}
		id, code := binary.BigEndian.Uint64(h[0:]), h[8]
		msg := make([]byte, binary.BigEndian.Uint16(h[9:]))
		if _, err := io.ReadFull(r, msg); err != nil {
			return err
		}
		oc.mu.Lock()
		op := oc.sent[id]
		delete(oc.sent, id)
		oc.mu.Unlock()
		if op == nil {
			return fmt.Errorf("ack of unknown op %d", id)
		}
		if code == codeOK {
			oc.settle(op, transfer.Done, nil)
		} else {
			oc.settle(op, transfer.Failed, ackError(code, string(msg)))
		}
	}
}

// settle finishes op now, or once run stopped reading its sources.
func (oc *outConn) settle(op *writeOp, st transfer.Status, err error) {
	oc.mu.Lock()
	if oc.current == op {
		oc.results[op] = result{st, err}
		oc.mu.Unlock()
		return
	}
	oc.mu.Unlock()
	op.finish(st, err)
}

// stop marks the connection dead with cause why (the first cause wins)
// and fails the ops never written: nothing of them can land. It returns
// the connection, nil while dialing, and whether this call stopped it.
func (oc *outConn) stop(why error) (net.Conn, bool) {
	oc.mu.Lock()
	if oc.why == nil {
		oc.why = why
	}
	why = oc.why
	first := !oc.dead
	oc.dead = true
	queued := oc.queue
	oc.queue = nil
	conn := oc.conn
	oc.mu.Unlock()
	for _, op := range queued {
		op.finish(transfer.Failed, why)
	}
	oc.signal()
	return conn, first
}

// shutdown stops the connection without losing sight of the bytes sent:
// it half-closes it, so the peer reads every frame sent and then closes
// its side, and readAcks settles the ops sent once it has — or, failing
// that, when the fence timeout passes, wrapping ErrNotQuiescent too.
func (oc *outConn) shutdown(why error) {
	conn, first := oc.stop(why)
	if conn == nil || !first {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	conn.SetReadDeadline(time.Now().Add(oc.cfg.fence))
}

// quiesce is shutdown, waiting until every op sent is settled.
func (oc *outConn) quiesce(why error) {
	oc.shutdown(why)
	oc.readers.Wait()
}

// abort closes the connection at once (the engine is closing): what was
// sent fails with why.
func (oc *outConn) abort(why error) {
	if conn, _ := oc.stop(why); conn != nil {
		conn.Close()
	}
}
