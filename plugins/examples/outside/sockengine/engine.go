package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// config is the engine's configuration, from the host's options.
type config struct {
	name        string
	listen      string        // host:port to accept on
	segment     int           // largest frame payload
	dialTimeout time.Duration // bound on connecting to a peer
	fence       time.Duration // bound on proving a forgotten peer quiet
}

// engine is a transfer.Engine over its own TCP connections: one outgoing
// connection per peer (an outConn) carries write frames, and the peer acks
// each op once its bytes landed, so Done means visible at the target.
// Every source is checked against reg and every destination against the
// ranges the peer advertised before a byte moves; the target checks the
// destination against its own reg again before it lands a frame.
type engine struct {
	cfg config
	ln  net.Listener
	reg mem.Registry

	// land is held for reading while a received frame is checked and
	// copied into memory, and for writing by DeregisterMemory and
	// ForgetPeer: once they return, nothing lands in what they removed.
	land    sync.RWMutex
	refused map[string]bool // forgotten peers, until loaded again; under land

	mu     sync.Mutex
	closed bool
	peers  map[string]metadata
	out    map[string]*outConn
	in     map[net.Conn]string // accepted connections and the peer they serve
	wg     sync.WaitGroup
}

func newEngine(c config) (*engine, error) {
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return nil, fmt.Errorf("sockengine: listen %q: %w", c.listen, err)
	}
	e := &engine{cfg: c, ln: ln, refused: map[string]bool{}, peers: map[string]metadata{}, out: map[string]*outConn{}, in: map[net.Conn]string{}}
	e.wg.Add(1)
	go e.accept()
	return e, nil
}

var (
	_ transfer.Engine = (*engine)(nil)
	_ transfer.Fencer = (*engine)(nil)
)

// Name returns the engine's name.
func (e *engine) Name() string { return e.cfg.name }

// FencesForgottenPeers is true: ForgetPeer refuses the peer's frames
// under the landing lock and closes its connections (transfer.Fencer).
func (e *engine) FencesForgottenPeers() bool { return true }

// RegisterMemory registers host memory d for sources and destinations.
func (e *engine) RegisterMemory(d transfer.Desc) error {
	if d.Kind != transfer.Host {
		return fmt.Errorf("sockengine: register %v: host memory only: %w", d, transfer.ErrUnsupported)
	}
	if err := e.reg.Add(d); err != nil {
		return fmt.Errorf("sockengine: register %v: %w", d, err)
	}
	return nil
}

// DeregisterMemory removes d; a write in flight from it is ErrInUse.
func (e *engine) DeregisterMemory(d transfer.Desc) error {
	e.land.Lock()
	defer e.land.Unlock()
	if err := e.reg.Remove(d); err != nil {
		return fmt.Errorf("sockengine: deregister %v: %w", d, err)
	}
	return nil
}

// Metadata describes the listen address and the registered memory.
func (e *engine) Metadata() ([]byte, error) {
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("sockengine: metadata: %w", transfer.ErrClosed)
	}
	return metadata{name: e.cfg.name, addr: e.ln.Addr().String(), ranges: e.reg.Ranges()}.encode(), nil
}

// LoadPeer loads (or refreshes) a peer and admits its writes again.
func (e *engine) LoadPeer(md []byte) (string, error) {
	m, err := decodeMetadata(md)
	if err != nil {
		return "", err
	}
	e.land.Lock()
	delete(e.refused, m.name)
	e.land.Unlock()
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return "", fmt.Errorf("sockengine: load peer: %w", transfer.ErrClosed)
	}
	var moved *outConn
	if old, ok := e.peers[m.name]; ok && old.addr != m.addr {
		moved = e.out[m.name]
		delete(e.out, m.name)
	}
	e.peers[m.name] = m
	e.mu.Unlock()
	if moved != nil {
		moved.shutdown(fmt.Errorf("sockengine: peer %q moved to %s: %w", m.name, m.addr, transfer.ErrPeerLost))
	}
	return m.name, nil
}

// ForgetPeer forgets peer both ways. Its writes here are refused until it
// is loaded again and its connections closed; this engine's writes to it
// fail with ErrPeerLost once the peer proved it will land none of them.
func (e *engine) ForgetPeer(peer string) error {
	e.land.Lock()
	e.refused[peer] = true
	e.mu.Lock()
	for c, p := range e.in {
		if p == peer {
			c.Close()
		}
	}
	e.land.Unlock()
	oc := e.out[peer]
	delete(e.out, peer)
	_, known := e.peers[peer]
	delete(e.peers, peer)
	e.mu.Unlock()
	if oc != nil {
		oc.quiesce(fmt.Errorf("sockengine: peer %q forgotten: %w", peer, transfer.ErrPeerLost))
	}
	if !known {
		return fmt.Errorf("sockengine: forget %q: %w", peer, transfer.ErrUnknownPeer)
	}
	return nil
}

// PostWrite checks every write, splits it into frames and queues them on
// the peer's connection, started on first use. It never waits for bytes.
func (e *engine) PostWrite(peer string, ops []transfer.WriteOp) (transfer.Op, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, fmt.Errorf("sockengine: post: %w", transfer.ErrClosed)
	}
	p, ok := e.peers[peer]
	if !ok {
		return nil, fmt.Errorf("sockengine: post to %q: %w", peer, transfer.ErrUnknownPeer)
	}
	w := &writeOp{}
	var starts []uint64
	for i, op := range ops {
		src, err := mem.CheckWrite(&e.reg, op)
		if err != nil {
			return nil, fmt.Errorf("sockengine: write %d to %q: %w", i, peer, err)
		}
		if op.Src.Len == 0 {
			continue
		}
		if _, err := mem.FindRange(p.ranges, op.Dst.Addr, op.Dst.Len); err != nil {
			return nil, fmt.Errorf("sockengine: write %d to %q: destination %v: %w", i, peer, op.Dst, err)
		}
		starts = append(starts, src.Addr)
		for off := uint64(0); off < op.Src.Len; off += uint64(e.cfg.segment) {
			n := min(op.Src.Len-off, uint64(e.cfg.segment))
			w.segs = append(w.segs, segment{src: op.Src.Addr + off, dst: op.Dst.Addr + off, n: n})
		}
	}
	if len(w.segs) == 0 {
		w.finish(transfer.Done, nil)
		return w, nil
	}
	if err := e.reg.Pin(starts); err != nil {
		return nil, fmt.Errorf("sockengine: post to %q: %w", peer, err)
	}
	w.unpin = func() { e.reg.Unpin(starts) }
	oc := e.out[peer]
	if oc == nil || oc.isDead() {
		oc = newOutConn(e.cfg, p.addr, &e.wg)
		e.out[peer] = oc
	}
	oc.enqueue(w)
	return w, nil
}

// Close closes the listener and every connection, failing what is in
// flight with ErrClosed, and waits for the engine's goroutines.
func (e *engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	outs := e.out
	e.out = map[string]*outConn{}
	for c := range e.in {
		c.Close()
	}
	e.mu.Unlock()
	e.ln.Close()
	for _, oc := range outs {
		oc.abort(fmt.Errorf("sockengine: engine closed: %w", transfer.ErrClosed))
	}
	e.wg.Wait()
	return nil
}

func (e *engine) accept() {
	defer e.wg.Done()
	for {
		c, err := e.ln.Accept()
		if err != nil {
			return // closed
		}
		e.wg.Add(1)
		go e.serve(c)
	}
}

// serve lands the frames one peer sends on connection c and acks each op.
func (e *engine) serve(c net.Conn) {
	defer e.wg.Done()
	defer c.Close()
	r := bufio.NewReaderSize(c, 64<<10)
	var nb [2]byte
	if _, err := io.ReadFull(r, nb[:]); err != nil {
		return
	}
	n := binary.BigEndian.Uint16(nb[:])
	if n == 0 || n > maxName {
		return
	}
	name := make([]byte, n)
	if _, err := io.ReadFull(r, name); err != nil {
		return
	}
	peer := string(name)
	e.land.RLock()
	e.mu.Lock()
	admitted := !e.closed && !e.refused[peer]
	if admitted {
		e.in[c] = peer
	}
	e.mu.Unlock()
	e.land.RUnlock()
	if !admitted {
		return
	}
	defer func() {
		e.mu.Lock()
		delete(e.in, c)
		e.mu.Unlock()
	}()
	w := bufio.NewWriter(c)
	buf := make([]byte, e.cfg.segment)
	failed := map[uint64]bool{}
	var h [frameHeader]byte
	for {
		if _, err := io.ReadFull(r, h[:]); err != nil {
			return
		}
		id, dst := binary.BigEndian.Uint64(h[0:]), binary.BigEndian.Uint64(h[8:])
		size, last := binary.BigEndian.Uint32(h[16:]), h[20] != 0
		if int(size) > len(buf) {
			return // not a frame this engine sends
		}
		if _, err := io.ReadFull(r, buf[:size]); err != nil {
			return // a frame cut short lands nothing
		}
		if !failed[id] {
			if err := e.landFrame(peer, dst, buf[:size]); err != nil {
				if errors.Is(err, transfer.ErrPeerLost) {
					return // forgotten: close the connection
				}
				failed[id] = true
				if writeAck(w, id, err) != nil {
					return
				}
			}
		}
		if last {
			if failed[id] {
				delete(failed, id)
			} else if writeAck(w, id, nil) != nil {
				return
			}
		}
		if r.Buffered() == 0 && w.Flush() != nil {
			return
		}
	}
}

// landFrame copies payload to dst, if dst is registered here and peer is
// not forgotten.
func (e *engine) landFrame(peer string, dst uint64, payload []byte) error {
	e.land.RLock()
	defer e.land.RUnlock()
	if e.refused[peer] {
		return fmt.Errorf("sockengine: %q is forgotten: %w", peer, transfer.ErrPeerLost)
	}
	b, err := e.reg.Slice(dst, uint64(len(payload)))
	if err != nil {
		return fmt.Errorf("destination %#x+%d: %w", dst, len(payload), err)
	}
	copy(b, payload)
	return nil
}

func writeAck(w *bufio.Writer, id uint64, err error) error {
	var msg string
	if err != nil {
		msg = err.Error()
	}
	b := binary.BigEndian.AppendUint64(make([]byte, 0, ackHeader+len(msg)), id)
	b = append(b, codeOf(err))
	b = appendString(b, msg[:min(len(msg), 1<<15)])
	_, werr := w.Write(b)
	return werr
}

// segment is one frame of a write: n bytes from src to the peer's dst.
type segment struct{ src, dst, n uint64 }

// writeOp is one PostWrite: its frames and its outcome.
type writeOp struct {
	segs  []segment
	unpin func()

	mu       sync.Mutex
	st       transfer.Status
	err      error
	released bool
}

// finish makes the op terminal once; its sources are no longer read.
func (w *writeOp) finish(st transfer.Status, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.st.Terminal() {
		return
	}
	w.st, w.err = st, err
	if w.unpin != nil {
		w.unpin()
	}
}

// Poll returns the op's status without blocking.
func (w *writeOp) Poll() (transfer.Status, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.st, w.err
}

// Release frees a terminal op; a pending one is ErrInUse.
func (w *writeOp) Release() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case !w.st.Terminal():
		return fmt.Errorf("sockengine: release of a pending write: %w", transfer.ErrInUse)
	case w.released:
		return errors.New("sockengine: write released twice")
	}
	w.released = true
	return nil
}
