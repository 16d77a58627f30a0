package zmq

import (
	"fmt"
	"sync"
	"syscall"

	zmq4 "github.com/pebbe/zmq4"
)

// monitorEvents are the socket-monitor events a DEALER reports: its
// connection to the peer completed the ZMTP handshake, the peer refused
// the handshake (its ZAP handler did not admit the key: FAILED_AUTH; or
// CURVE failed: FAILED_PROTOCOL), it dropped, a dial failed and is to be
// retried (CONNECT_RETRIED: nothing listens at the endpoint, or the
// connection dropped), or the monitor stopped (the DEALER closed).
const monitorEvents = zmq4.EVENT_HANDSHAKE_SUCCEEDED | zmq4.EVENT_HANDSHAKE_FAILED_AUTH | zmq4.EVENT_HANDSHAKE_FAILED_PROTOCOL |
	zmq4.EVENT_DISCONNECTED | zmq4.EVENT_CONNECT_RETRIED | zmq4.EVENT_MONITOR_STOPPED

// monitorWake is the inproc address of the pair that wakes the monitor's
// goroutine (per context, like wakeEndpoint).
const monitorWake = "inproc://bounce-zmq-monitor-wake"

// monitor watches every DEALER's connection through the ZeroMQ socket
// monitor and reports a peer lost the moment a connection that had
// completed its handshake drops (the peer process died: its kernel closed
// the socket; or the heartbeats timed out), instead of at the next
// heartbeat timeout or never, and when a DEALER that never completed a
// handshake fails a dial: its endpoint, which the peer had bound (it came
// in the peer's descriptor or WANT), has nothing listening any more, so a
// peer that died before this agent's first connection to it was up is
// reported too. Either is reported once, until a handshake completes. Its goroutine owns the monitor PAIR sockets
// once handed over and its own poller; watch hands them over through
// adds and the wake pair.
type monitor struct {
	lost    func(w watch)                        // called on the goroutine; must not block
	up      func(w watch)                        // at each completed handshake; likewise
	refused func(w watch, auth bool, status int) // at a refused handshake; likewise

	mu     sync.Mutex
	adds   []watch
	wake   *zmq4.Socket // PAIR; written under mu
	closed bool

	wakeRecv *zmq4.Socket // PAIR; read by the goroutine only
	done     chan struct{}
}

// watch is one DEALER's monitor: the PAIR connected to its monitor
// endpoint and the dealer it reports for.
type watch struct {
	peer string
	id   uint64 // the dealer's id: a replaced or removed dealer is not reported
	pair *zmq4.Socket
}

// newMonitor starts the monitor's goroutine in zctx: lost is called when
// a connection that completed its handshake drops, up when one completes
// its handshake, refused when the peer refuses it (auth: a CURVE/ZAP
// refusal, else a protocol failure; status the ZAP status).
func newMonitor(zctx *zmq4.Context, lost, up func(watch), refused func(watch, bool, int)) (*monitor, error) {
	recv, send, err := openPair(zctx, monitorWake)
	if err != nil {
		return nil, fmt.Errorf("zmq: monitor wake %w", err)
	}
	m := &monitor{lost: lost, up: up, refused: refused, wake: send, wakeRecv: recv, done: make(chan struct{})}
	go m.run()
	return m, nil
}

// watch starts monitoring sock, a DEALER not yet connected, for the
// dealer id of peer. The PAIR connects before the monitor binds (inproc
// allows it), so no event of the connection is missed.
func (m *monitor) watch(zctx *zmq4.Context, sock *zmq4.Socket, peer string, id uint64) error {
	addr := fmt.Sprintf("inproc://bounce-zmq-monitor-%d", id)
	pair, err := zctx.NewSocket(zmq4.PAIR)
	if err != nil {
		return fmt.Errorf("monitor pair: %w", err)
	}
	if err := pair.SetLinger(0); err != nil {
		_ = pair.Close()
		return fmt.Errorf("monitor pair: set linger: %w", err)
	}
	if err := pair.Connect(addr); err != nil {
		_ = pair.Close()
		return fmt.Errorf("monitor pair: connect: %w", err)
	}
	if err := sock.Monitor(addr, monitorEvents); err != nil {
		_ = pair.Close()
		return fmt.Errorf("monitor: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		_ = pair.Close()
		return nil
	}
	m.adds = append(m.adds, watch{peer: peer, id: id, pair: pair})
	_, _ = m.wake.SendBytes([]byte{1}, zmq4.DONTWAIT) // a full pipe already wakes it
	return nil
}

// run polls the monitor PAIRs until stop.
func (m *monitor) run() {
	defer close(m.done)
	type state struct {
		watch
		up   bool // the handshake completed since the last drop
		lost bool // reported lost since the last handshake
	}
	watches := map[*zmq4.Socket]*state{}
	poller := zmq4.NewPoller()
	poller.Add(m.wakeRecv, zmq4.POLLIN)
	remove := func(s *state) {
		_ = poller.RemoveBySocket(s.pair)
		_ = s.pair.Close()
		delete(watches, s.pair)
	}
	defer func() {
		for _, s := range watches {
			_ = s.pair.Close()
		}
		_ = m.wakeRecv.Close()
	}()
	for {
		polled, err := poller.Poll(-1)
		if err != nil {
			if zmq4.AsErrno(err) == zmq4.Errno(syscall.EINTR) {
				continue
			}
			return // ETERM: the context is going away
		}
		for _, p := range polled {
			if p.Socket == m.wakeRecv {
				for {
					if _, err := m.wakeRecv.RecvBytes(zmq4.DONTWAIT); err != nil {
						break
					}
				}
				m.mu.Lock()
				adds, closed := m.adds, m.closed
				m.adds = nil
				m.mu.Unlock()
				for _, w := range adds {
					watches[w.pair] = &state{watch: w}
					poller.Add(w.pair, zmq4.POLLIN)
				}
				if closed {
					return
				}
				continue
			}
			s := watches[p.Socket]
			if s == nil {
				continue
			}
			for {
				ev, _, value, err := s.pair.RecvEvent(zmq4.DONTWAIT)
				if err != nil {
					break
				}
				switch {
				case ev&zmq4.EVENT_HANDSHAKE_SUCCEEDED != 0:
					s.up, s.lost = true, false
					m.up(s.watch)
				case ev&zmq4.EVENT_HANDSHAKE_FAILED_AUTH != 0:
					m.refused(s.watch, true, value)
				case ev&zmq4.EVENT_HANDSHAKE_FAILED_PROTOCOL != 0:
					m.refused(s.watch, false, value)
				case ev&zmq4.EVENT_DISCONNECTED != 0:
					if s.up {
						s.up, s.lost = false, true
						m.lost(s.watch)
					}
				case ev&zmq4.EVENT_CONNECT_RETRIED != 0:
					// A dial failed (or a drop, reported above, is to be
					// redialed): a first connection that never came up.
					if !s.up && !s.lost {
						s.lost = true
						m.lost(s.watch)
					}
				case ev&zmq4.EVENT_MONITOR_STOPPED != 0:
					remove(s)
				}
				if watches[p.Socket] == nil {
					break
				}
			}
		}
	}
}

// stop ends the goroutine and closes every PAIR; the caller closes the
// DEALERs first and terminates the context after.
func (m *monitor) stop() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		<-m.done
		return
	}
	m.closed = true
	_, _ = m.wake.SendBytes([]byte{1}, zmq4.DONTWAIT)
	m.mu.Unlock()
	<-m.done
	m.mu.Lock()
	for _, w := range m.adds {
		_ = w.pair.Close()
	}
	m.adds = nil
	_ = m.wake.Close()
	m.mu.Unlock()
}
