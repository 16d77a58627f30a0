package plugins

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// Restart is the crash policy of a supervised plugin: when its process
// dies, what it was doing fails (every op it owned resolves Failed with an
// error naming the plugin and its exit status), calls fail fast while it
// is down, and it is started again after Backoff, doubling up to
// MaxBackoff, at most MaxRestarts times over its life. New calls use the
// new process once it is up.
type Restart struct {
	// MaxRestarts bounds the restarts (0: never restart).
	MaxRestarts int
	// Backoff is the wait before the first restart (default 100ms).
	Backoff time.Duration
	// MaxBackoff caps the doubling waits (default 30s).
	MaxBackoff time.Duration
}

func (r Restart) withDefaults() Restart {
	if r.Backoff <= 0 {
		r.Backoff = 100 * time.Millisecond
	}
	if r.MaxBackoff <= 0 {
		r.MaxBackoff = 30 * time.Second
	}
	return r
}

// watchEvery is how often a supervisor checks that its process still runs.
const watchEvery = 20 * time.Millisecond

// supervisor keeps one plugin instance of type T running under a Restart
// policy. Its goroutine (run) watches the process and restarts it.
type supervisor[T any] struct {
	spec   Spec
	kind   string
	policy Restart
	log    *slog.Logger
	// open starts a process and opens the instance on it; replay is done
	// inside it (a restarted engine re-registers memory, say).
	open  func() (T, *Client, error)
	close func(T) error
	// ready, if set, runs once a restarted instance is published (what
	// changed while it started is applied to it then).
	ready func(T)

	mu       sync.Mutex
	cur      T
	hasCur   bool // cur is open (up, or down but not yet closed)
	client   *Client
	up       bool
	down     error // why calls fail while !up
	restarts int
	closed   bool

	stop chan struct{}
	done chan struct{}
}

// supervise opens the first instance (its failure is returned, nothing is
// retried) and starts watching it.
func supervise[T any](spec Spec, kind string, policy Restart, open func() (T, *Client, error), closeT func(T) error, ready func(T)) (*supervisor[T], error) {
	if spec.Name == "" {
		spec.Name = filepath.Base(spec.Path) // as LoadSpec names it
	}
	cur, c, err := open()
	if err != nil {
		return nil, err
	}
	log := spec.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &supervisor[T]{spec: spec, kind: kind, policy: policy.withDefaults(), log: log, open: open, close: closeT,
		ready: ready, cur: cur, hasCur: true, client: c, up: true, stop: make(chan struct{}), done: make(chan struct{})}
	go s.run()
	return s, nil
}

// get returns the running instance, or an error wrapping ErrPeerLost
// (ErrClosed after Close) that says why there is none.
func (s *supervisor[T]) get() (T, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var zero T
	switch {
	case s.closed:
		return zero, fmt.Errorf("plugin %s: %w", s.spec.Name, transfer.ErrClosed)
	case !s.up:
		return zero, s.down
	case s.client.Exited():
		s.markDown()
		return zero, s.down
	}
	return s.cur, nil
}

// markDown records that the process died; run restarts it. Caller holds mu.
func (s *supervisor[T]) markDown() {
	if !s.up {
		return
	}
	s.up = false
	st := s.client.ExitStatus()
	if st == "" {
		st = "ended"
	}
	next := "it is not restarted (max_restarts exhausted)"
	if s.restarts < s.policy.MaxRestarts {
		next = fmt.Sprintf("restarting (restart %d of %d)", s.restarts+1, s.policy.MaxRestarts)
	}
	s.down = fmt.Errorf("plugin %s (%s) is down: process exited (%s); %s: %w", s.spec.Name, s.kind, st, next, transfer.ErrPeerLost)
	s.log.Error("plugin process died", "plugin", s.spec.Name, "kind", s.kind, "status", st, "restarts", s.restarts, "max_restarts", s.policy.MaxRestarts)
}

// run watches the process; when it dies, it closes what is left of the
// instance (its ops have failed by then) and restarts under the policy.
func (s *supervisor[T]) run() {
	defer close(s.done)
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	backoff := s.policy.Backoff
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		if s.up && s.client.Exited() {
			s.markDown()
		}
		dead := !s.up
		old, had := s.cur, s.hasCur
		if dead {
			var zero T
			s.cur, s.hasCur = zero, false
		}
		s.mu.Unlock()
		if !dead {
			continue
		}
		if had && s.close != nil {
			_ = s.close(old) // ends the Client; ops of the dead process resolve Failed
		}
		for {
			s.mu.Lock()
			exhausted := s.restarts >= s.policy.MaxRestarts
			s.mu.Unlock()
			if exhausted {
				<-s.stop
				return
			}
			select {
			case <-s.stop:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, s.policy.MaxBackoff)
			cur, c, err := s.open()
			s.mu.Lock()
			s.restarts++
			if s.closed {
				s.mu.Unlock()
				if err == nil && s.close != nil {
					_ = s.close(cur)
				}
				return
			}
			if err != nil {
				s.down = fmt.Errorf("plugin %s (%s) is down: restart %d of %d failed: %v: %w", s.spec.Name, s.kind, s.restarts, s.policy.MaxRestarts, err, transfer.ErrPeerLost)
				s.log.Error("plugin restart failed", "plugin", s.spec.Name, "kind", s.kind, "restart", s.restarts, "err", err)
				s.mu.Unlock()
				continue
			}
			s.cur, s.hasCur, s.client, s.up, s.down = cur, true, c, true, nil
			s.log.Info("plugin restarted", "plugin", s.spec.Name, "kind", s.kind, "restart", s.restarts, "pid", c.Pid())
			s.mu.Unlock()
			if s.ready != nil {
				s.ready(cur)
			}
			backoff = s.policy.Backoff
			break
		}
	}
}

// Close stops supervising and closes the instance. It is idempotent.
func (s *supervisor[T]) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	close(s.stop)
	<-s.done // run touches cur no more
	s.mu.Lock()
	cur, had := s.cur, s.hasCur
	var zero T
	s.cur, s.hasCur = zero, false
	s.mu.Unlock()
	if had && s.close != nil {
		return s.close(cur)
	}
	return nil
}

// Restarts returns how many times the plugin was restarted.
func (s *supervisor[T]) Restarts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restarts
}

// Current returns the Client of the running process, or nil while down.
func (s *supervisor[T]) Current() *Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.up {
		return nil
	}
	return s.client
}

// Supervised is what the Open functions return besides the component:
// the handle tests and operators use to see the process.
type Supervised interface {
	// Current returns the Client of the running process, nil while down.
	Current() *Client
	// Restarts returns how many times the plugin was restarted.
	Restarts() int
}

// OpenGatherer starts the gather plugin spec describes and opens its stage
// for agent name, under policy (see Restart).
func OpenGatherer(spec Spec, policy Restart, name string, opts map[string]string, reg *mem.Registry) (transfer.Gatherer, error) {
	sv, err := supervise(spec, KindGather, policy, func() (transfer.Gatherer, *Client, error) {
		c, err := LoadSpec(spec, KindGather)
		if err != nil {
			return nil, nil, err
		}
		g, err := c.Gatherer(name, opts, reg)
		return g, c, err
	}, func(g transfer.Gatherer) error { return g.Close() }, nil)
	if err != nil {
		return nil, err
	}
	return &supervisedGatherer{sv}, nil
}

type supervisedGatherer struct{ *supervisor[transfer.Gatherer] }

// Gather runs on the current process, or fails fast while it is down.
func (g *supervisedGatherer) Gather(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	cur, err := g.get()
	if err != nil {
		return nil, fmt.Errorf("gather: %w", err)
	}
	return cur.Gather(region, runs)
}

// OpenScatterer starts the scatter plugin spec describes, like
// OpenGatherer.
func OpenScatterer(spec Spec, policy Restart, name string, opts map[string]string, reg *mem.Registry) (transfer.Scatterer, error) {
	sv, err := supervise(spec, KindScatter, policy, func() (transfer.Scatterer, *Client, error) {
		c, err := LoadSpec(spec, KindScatter)
		if err != nil {
			return nil, nil, err
		}
		s, err := c.Scatterer(name, opts, reg)
		return s, c, err
	}, func(s transfer.Scatterer) error { return s.Close() }, nil)
	if err != nil {
		return nil, err
	}
	return &supervisedScatterer{sv}, nil
}

type supervisedScatterer struct {
	*supervisor[transfer.Scatterer]
}

// Scatter runs on the current process, or fails fast while it is down.
func (s *supervisedScatterer) Scatter(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	cur, err := s.get()
	if err != nil {
		return nil, fmt.Errorf("scatter: %w", err)
	}
	return cur.Scatter(region, runs)
}

// OpenWriter starts the writer plugin spec describes and lends it engine,
// under policy. The returned writer has a Close method.
func OpenWriter(spec Spec, policy Restart, name string, opts map[string]string, engine transfer.Engine) (interface {
	transfer.Writer
	Close() error
}, error) {
	sv, err := supervise(spec, KindWriter, policy, func() (*RemoteWriter, *Client, error) {
		c, err := LoadSpec(spec, KindWriter)
		if err != nil {
			return nil, nil, err
		}
		w, err := c.Writer(name, opts, engine)
		return w, c, err
	}, func(w *RemoteWriter) error { return w.Close() }, nil)
	if err != nil {
		return nil, err
	}
	return &supervisedWriter{sv}, nil
}

type supervisedWriter struct{ *supervisor[*RemoteWriter] }

// Write runs on the current process, or fails fast while it is down.
func (w *supervisedWriter) Write(peer string, src, dst transfer.Desc) (transfer.Op, error) {
	cur, err := w.get()
	if err != nil {
		return nil, fmt.Errorf("write: %w", err)
	}
	return cur.Write(peer, src, dst)
}

// WriteContext is Write carrying ctx's trace context to the plugin
// (transfer.ContextWriter).
func (w *supervisedWriter) WriteContext(ctx context.Context, peer string, src, dst transfer.Desc) (transfer.Op, error) {
	cur, err := w.get()
	if err != nil {
		return nil, fmt.Errorf("write: %w", err)
	}
	return cur.WriteContext(ctx, peer, src, dst)
}

// OpenEngine starts the engine plugin spec describes and opens its engine
// for agent name, under policy. A restarted engine gets the memory
// registrations and the peers of the one that died replayed before it
// serves, and the address the first process listened on: when the engine
// declares transfer.Listener and opts fix no port ("listen" absent or port
// 0), a restarted process is opened with listen=<that host>:<the port the
// first bound>, so its metadata names the same address and peers that
// loaded it reach the new process without reloading.
func OpenEngine(spec Spec, policy Restart, name string, opts map[string]string) (transfer.Engine, error) {
	se := &supervisedEngine{regs: map[transfer.Desc]int{}, peers: map[string][]byte{}}
	sv, err := supervise(spec, KindEngine, policy, func() (transfer.Engine, *Client, error) {
		c, err := LoadSpec(spec, KindEngine)
		if err != nil {
			return nil, nil, err
		}
		o := opts
		if l := se.keepListen(); l != "" {
			o = maps.Clone(opts)
			if o == nil {
				o = map[string]string{}
			}
			o["listen"] = l
		}
		e, err := c.Engine(name, o)
		if err != nil {
			return nil, nil, err
		}
		if err := se.replay(e); err != nil {
			e.Close()
			return nil, nil, err
		}
		return e, c, nil
	}, func(e transfer.Engine) error { return e.Close() }, se.reinstall)
	if err != nil {
		return nil, err
	}
	se.sv = sv
	first, _ := sv.get()
	se.name = first.Name()
	if d, ok := first.(interface{ capabilities() caps }); ok {
		se.caps = d.capabilities()
	}
	se.mu.Lock()
	se.listen = restartListen(opts["listen"], se.caps.listenAddr)
	se.mu.Unlock()
	return declare(se), nil
}

// restartListen is the listen option of a restarted engine whose first
// process was opened with listen and reported addr (transfer.Listener):
// listen's host (addr's when listen is empty) with addr's port. It is ""
// (the options stay as they are) when listen fixes a port already or addr
// is not host:port.
func restartListen(listen, addr string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" || port == "0" {
		return ""
	}
	host, _, _ := net.SplitHostPort(addr)
	if listen != "" {
		h, p, err := net.SplitHostPort(listen)
		if err != nil || p != "0" && p != "" {
			return ""
		}
		host = h
	}
	return net.JoinHostPort(host, port)
}

// keepListen returns the listen option a restarted process gets ("" for
// the first process, or when the options keep the address already).
func (e *supervisedEngine) keepListen() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.listen
}

// supervisedEngine is an engine plugin under a Restart policy. It records
// what a restarted process must be told again.
type supervisedEngine struct {
	sv   *supervisor[transfer.Engine]
	name string
	caps caps // the first process's; a restart runs the same binary

	mu    sync.Mutex
	regs  map[transfer.Desc]int  // registration counts
	peers map[string][]byte      // peer -> the metadata it was loaded from
	guard transfer.WriteGuard    // installed in every process
	lost  func(peer string)      // installed in every process
	auth  transfer.Authenticator // lent to every process
	// listen is the listen option of a restarted process: the first
	// process's address (see restartListen).
	listen string
}

func (e *supervisedEngine) replay(eng transfer.Engine) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	// The guard first: the restarted engine listens already, and memory
	// registered before its guard would be writable unchecked.
	e.installLocked(eng)
	for d, n := range e.regs {
		for i := 0; i < n; i++ {
			if err := eng.RegisterMemory(d); err != nil {
				return fmt.Errorf("replay register %v: %w", d, err)
			}
		}
	}
	for p, md := range e.peers {
		if _, err := eng.LoadPeer(md); err != nil {
			return fmt.Errorf("replay load peer %q: %w", p, err)
		}
	}
	return nil
}

// reinstall applies the guard and the peer-loss callback to a restarted
// engine once it is published: one set while it was starting (after its
// replay) reaches it too.
func (e *supervisedEngine) reinstall(eng transfer.Engine) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.installLocked(eng)
}

// installLocked installs the guard and the callback set so far in eng.
// The caller holds e.mu.
func (e *supervisedEngine) installLocked(eng transfer.Engine) {
	if a, ok := eng.(transfer.Authenticating); ok && e.auth != nil {
		a.SetAuthenticator(e.auth)
	}
	if g, ok := eng.(transfer.WriteGuarded); ok && e.guard != nil {
		g.SetWriteGuard(e.guard)
	}
	if r, ok := eng.(transfer.PeerLossReporter); ok && e.lost != nil {
		r.SetPeerLost(e.lost)
	}
}

// capabilities returns what the first process's engine declared.
func (e *supervisedEngine) capabilities() caps { return e.caps }

// Name returns the engine's name (the same after a restart).
func (e *supervisedEngine) Name() string { return e.name }

// RegisterMemory registers d and remembers it for a restart.
func (e *supervisedEngine) RegisterMemory(d transfer.Desc) error {
	cur, err := e.sv.get()
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := cur.RegisterMemory(d); err != nil {
		return err
	}
	e.regs[d]++
	return nil
}

// DeregisterMemory deregisters d. While the process is down it only
// forgets d: the dead process no longer touches it.
func (e *supervisedEngine) DeregisterMemory(d transfer.Desc) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	cur, err := e.sv.get()
	if err == nil {
		if err := cur.DeregisterMemory(d); err != nil {
			return err
		}
	} else if errors.Is(err, transfer.ErrClosed) {
		return err
	}
	if e.regs[d] == 0 {
		if err != nil {
			return fmt.Errorf("deregister %v: %w", d, transfer.ErrNotRegistered)
		}
		return nil
	}
	if e.regs[d]--; e.regs[d] == 0 {
		delete(e.regs, d)
	}
	return nil
}

// Metadata returns the current process's metadata.
func (e *supervisedEngine) Metadata() ([]byte, error) {
	cur, err := e.sv.get()
	if err != nil {
		return nil, err
	}
	return cur.Metadata()
}

// LoadPeer loads a peer and remembers it for a restart.
func (e *supervisedEngine) LoadPeer(md []byte) (string, error) {
	cur, err := e.sv.get()
	if err != nil {
		return "", err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	p, err := cur.LoadPeer(md)
	if err != nil {
		return "", err
	}
	e.peers[p] = append([]byte(nil), md...)
	return p, nil
}

// ForgetPeer forgets peer here and for restarts.
func (e *supervisedEngine) ForgetPeer(peer string) error {
	e.mu.Lock()
	delete(e.peers, peer)
	e.mu.Unlock()
	cur, err := e.sv.get()
	if err != nil {
		if errors.Is(err, transfer.ErrPeerLost) {
			return nil // the dead process forgot everything
		}
		return err
	}
	return cur.ForgetPeer(peer)
}

// PostWrite posts on the current process, or fails fast while it is down.
func (e *supervisedEngine) PostWrite(peer string, ops []transfer.WriteOp) (transfer.Op, error) {
	cur, err := e.sv.get()
	if err != nil {
		return nil, err
	}
	return cur.PostWrite(peer, ops)
}

// PostWriteContext is PostWrite carrying ctx's trace context to the
// plugin (transfer.ContextPoster).
func (e *supervisedEngine) PostWriteContext(ctx context.Context, peer string, ops []transfer.WriteOp) (transfer.Op, error) {
	cur, err := e.sv.get()
	if err != nil {
		return nil, err
	}
	if cp, ok := cur.(transfer.ContextPoster); ok {
		return cp.PostWriteContext(ctx, peer, ops)
	}
	return cur.PostWrite(peer, ops)
}

// Close stops supervising and closes the engine.
func (e *supervisedEngine) Close() error { return e.sv.Close() }

// Connect forwards to the current process (transfer.Connector); while it
// is down it does nothing.
func (e *supervisedEngine) Connect(peer string) {
	if cur, err := e.sv.get(); err == nil {
		if c, ok := cur.(transfer.Connector); ok {
			c.Connect(peer)
		}
	}
}

// WakeRecvNotification ends a RecvNotification in progress on the current
// process (transfer.NotificationWaker).
func (e *supervisedEngine) WakeRecvNotification() {
	if cur, err := e.sv.get(); err == nil {
		if w, ok := cur.(transfer.NotificationWaker); ok {
			w.WakeRecvNotification()
		}
	}
}

// StallWrites stalls the current process's writes (transfer.WriteStaller,
// test-only); while it is down it fails. A stall ends with the process
// that holds it: a restarted process is not stalled.
func (e *supervisedEngine) StallWrites() (release func(), err error) {
	cur, err := e.sv.get()
	if err != nil {
		return nil, fmt.Errorf("stall writes: %w", err)
	}
	st, ok := cur.(transfer.WriteStaller)
	if !ok {
		return nil, fmt.Errorf("plugin %s: stall writes: %w", e.sv.spec.Name, transfer.ErrUnsupported)
	}
	return st.StallWrites()
}

// Current returns the Client of the running process, nil while down.
func (e *supervisedEngine) Current() *Client { return e.sv.Current() }

// Restarts returns how many times the plugin was restarted.
func (e *supervisedEngine) Restarts() int { return e.sv.Restarts() }

// RouteCosts returns the costs the plugin's engine declared (zero: none).
func (e *supervisedEngine) RouteCosts() (postPerDesc, perWrite time.Duration, bandwidth float64) {
	return e.caps.postPerDesc, e.caps.perWrite, e.caps.bandwidth
}

// notify sends through the current process.
func (e *supervisedEngine) notify(peer string, payload []byte) error {
	cur, err := e.sv.get()
	if err != nil {
		return err
	}
	nt, ok := cur.(transfer.Notifier)
	if !ok {
		return fmt.Errorf("plugin %s: restarted engine has no notifications: %w", e.sv.spec.Name, transfer.ErrUnsupported)
	}
	return nt.Notify(peer, payload)
}

// recvNotification waits on the current process; while it is down it
// fails fast.
func (e *supervisedEngine) recvNotification(timeout time.Duration) (transfer.Message, error) {
	cur, err := e.sv.get()
	if err != nil {
		return transfer.Message{}, err
	}
	nt, ok := cur.(transfer.Notifier)
	if !ok {
		return transfer.Message{}, fmt.Errorf("plugin %s: restarted engine has no notifications: %w", e.sv.spec.Name, transfer.ErrUnsupported)
	}
	return nt.RecvNotification(timeout)
}

// setWriteGuard installs g in the current process and in every restarted
// one (before it serves).
func (e *supervisedEngine) setWriteGuard(g transfer.WriteGuard) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.guard = g
	if cur, err := e.sv.get(); err == nil {
		if wg, ok := cur.(transfer.WriteGuarded); ok {
			wg.SetWriteGuard(g)
		}
	}
}

// SetAuthenticator lends a to the current process's engine and to every
// restarted one (before its guard).
func (e *supervisedEngine) SetAuthenticator(a transfer.Authenticator) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.auth = a
	if cur, err := e.sv.get(); err == nil {
		if au, ok := cur.(transfer.Authenticating); ok {
			au.SetAuthenticator(a)
		}
	}
}

// FenceWrites fences the current process's engine. A process that is down
// lands nothing; a restarted one holds no frame of the old one's.
func (e *supervisedEngine) FenceWrites(d transfer.Desc) {
	if cur, err := e.sv.get(); err == nil {
		if f, ok := cur.(transfer.WriteFencer); ok {
			f.FenceWrites(d)
		}
	}
}

// setPeerLost installs fn in the current process and in every restarted
// one.
func (e *supervisedEngine) setPeerLost(fn func(peer string)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lost = fn
	if cur, err := e.sv.get(); err == nil {
		if r, ok := cur.(transfer.PeerLossReporter); ok {
			r.SetPeerLost(fn)
		}
	}
}

// OpenControl starts the control channel plugin spec describes, under
// policy. A restarted channel gets its peers added again; its endpoint may
// differ, so peers must reload this agent's descriptor to reach it.
func OpenControl(spec Spec, policy Restart, name string, opts map[string]string) (transfer.ControlChannel, error) {
	sc := &supervisedControl{peers: map[string]string{}}
	sv, err := supervise(spec, KindControl, policy, func() (transfer.ControlChannel, *Client, error) {
		c, err := LoadSpec(spec, KindControl)
		if err != nil {
			return nil, nil, err
		}
		ch, err := c.Control(name, opts)
		if err != nil {
			return nil, nil, err
		}
		sc.mu.Lock()
		defer sc.mu.Unlock()
		for p, ep := range sc.peers {
			if err := ch.AddPeer(p, ep); err != nil {
				ch.Close()
				return nil, nil, fmt.Errorf("replay add peer %q: %w", p, err)
			}
		}
		return ch, c, nil
	}, func(ch transfer.ControlChannel) error { return ch.Close() }, nil)
	if err != nil {
		return nil, err
	}
	sc.sv = sv
	first, _ := sv.get()
	sc.kind = first.Kind()
	return sc, nil
}

// supervisedControl is a control channel plugin under a Restart policy.
type supervisedControl struct {
	sv   *supervisor[transfer.ControlChannel]
	kind string

	mu    sync.Mutex
	peers map[string]string
}

// Kind returns the channel's kind.
func (c *supervisedControl) Kind() string { return c.kind }

// LocalEndpoint returns the current process's endpoint ("" while down).
func (c *supervisedControl) LocalEndpoint() string {
	cur, err := c.sv.get()
	if err != nil {
		return ""
	}
	return cur.LocalEndpoint()
}

// AddPeer adds a peer and remembers it for a restart.
func (c *supervisedControl) AddPeer(peer, endpoint string) error {
	cur, err := c.sv.get()
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := cur.AddPeer(peer, endpoint); err != nil {
		return err
	}
	c.peers[peer] = endpoint
	return nil
}

// RemovePeer removes a peer here and for restarts.
func (c *supervisedControl) RemovePeer(peer string) error {
	c.mu.Lock()
	delete(c.peers, peer)
	c.mu.Unlock()
	cur, err := c.sv.get()
	if err != nil {
		return err
	}
	return cur.RemovePeer(peer)
}

// Send queues on the current process, or fails fast while it is down.
func (c *supervisedControl) Send(peer string, payload []byte) error {
	cur, err := c.sv.get()
	if err != nil {
		return err
	}
	return cur.Send(peer, payload)
}

// Recv waits on the current process. While it is down it waits out
// timeout (so a receive loop does not spin) and reports ErrTimeout.
func (c *supervisedControl) Recv(timeout time.Duration) (transfer.Message, error) {
	cur, err := c.sv.get()
	if err != nil {
		if errors.Is(err, transfer.ErrClosed) {
			return transfer.Message{}, err
		}
		time.Sleep(timeout)
		return transfer.Message{}, fmt.Errorf("%v: %w", err, transfer.ErrTimeout)
	}
	return cur.Recv(timeout)
}

// Close stops supervising and closes the channel.
func (c *supervisedControl) Close() error { return c.sv.Close() }

// WakeRecv ends a Recv in progress on the current process
// (transfer.RecvWaker).
func (c *supervisedControl) WakeRecv() {
	if cur, err := c.sv.get(); err == nil {
		if w, ok := cur.(transfer.RecvWaker); ok {
			w.WakeRecv()
		}
	}
}

var (
	_ transfer.ContextPoster = (*supervisedEngine)(nil)
	_ transfer.ContextWriter = (*supervisedWriter)(nil)
	_ costDeclarer           = (*supervisedEngine)(nil)
)
