package plugins

import (
	"time"

	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	"github.com/bouncekv/bounce/transfer"
)

// The optional engine capabilities the protocol carries beyond the
// callbacks, as transfer declares them.
type (
	notifyLimiter = transfer.NotifyLimiter
	costDeclarer  = transfer.RouteCoster
)

// caps are an engine's optional capabilities as its plugin declared them
// when the host opened it. They are static: an engine answers
// FencesForgottenPeers, MaxNotifySize and RouteCosts the same for its
// whole life.
type caps struct {
	notifier, fencer, fences bool
	guarded, peerLoss        bool
	connector, staller       bool
	authenticating, fencesW  bool // transfer.Authenticating, transfer.WriteFencer
	maxNotify                int
	postPerDesc, perWrite    time.Duration
	bandwidth                float64
	listenAddr               string // transfer.Listener's Addr at open
}

// fencing is the transfer.Fencer a host-side engine declares for its
// plugin's engine.
type fencing struct{ fences bool }

// FencesForgottenPeers answers what the plugin's engine answered.
func (f fencing) FencesForgottenPeers() bool { return f.fences }

func (c caps) fencing() fencing { return fencing{c.fences} }

// describe is the Open reply for engine e: its name and every optional
// capability it declares.
func describe(e transfer.Engine) *pb.OpenReply {
	_, notifier := e.(transfer.Notifier)
	pc := &pb.Capabilities{}
	if f, ok := e.(transfer.Fencer); ok {
		pc.Fencer, pc.Fences = true, f.FencesForgottenPeers()
	}
	if l, ok := e.(notifyLimiter); ok && notifier {
		pc.MaxNotifySize = int64(max(l.MaxNotifySize(), 0))
	}
	if d, ok := e.(costDeclarer); ok {
		post, write, bw := d.RouteCosts()
		pc.RouteCosts, pc.PostPerDescNs, pc.PerWriteNs, pc.Bandwidth = true, int64(post), int64(write), bw
	}
	_, pc.WriteGuarded = e.(transfer.WriteGuarded)
	_, pc.PeerLoss = e.(transfer.PeerLossReporter)
	_, pc.Connector = e.(transfer.Connector)
	_, pc.WriteStaller = e.(transfer.WriteStaller)
	_, pc.Authenticating = e.(transfer.Authenticating)
	_, pc.WriteFencer = e.(transfer.WriteFencer)
	if l, ok := e.(transfer.Listener); ok {
		pc.ListenAddr = l.Addr()
	}
	return &pb.OpenReply{Name: []byte(e.Name()), Notifier: notifier, Caps: pc}
}

// capsFrom reads the capabilities of an Open reply.
func capsFrom(rep *pb.OpenReply) caps {
	pc := rep.GetCaps()
	c := caps{notifier: rep.GetNotifier(), fencer: pc.GetFencer(), fences: pc.GetFences(), maxNotify: int(max(pc.GetMaxNotifySize(), 0)),
		guarded: pc.GetWriteGuarded(), peerLoss: pc.GetPeerLoss(), connector: pc.GetConnector(), staller: pc.GetWriteStaller(),
		listenAddr: pc.GetListenAddr(), authenticating: pc.GetAuthenticating(), fencesW: pc.GetWriteFencer()}
	if pc.GetRouteCosts() {
		c.postPerDesc, c.perWrite, c.bandwidth = time.Duration(pc.GetPostPerDescNs()), time.Duration(pc.GetPerWriteNs()), pc.GetBandwidth()
	}
	return c
}

// hostEngine is what every host-side engine of a plugin (remoteEngine,
// supervisedEngine) has: the engine, its declared capabilities, and the
// optional capabilities' methods under unexported names. declare exposes
// the exported ones for exactly the capabilities the plugin declared.
// RouteCosts, Connect, WakeRecvNotification, StallWrites, SetAuthenticator
// and FenceWrites are always there: each is neutral when the plugin's engine
// lacks it (no costs; no early dial; the host's own wait ends; a stall
// refused with ErrUnsupported; the engine's peers are named as they claim,
// which is logged; no fence, as for an engine without one).
// transfer.Listener is not declared on the host: its address serves the
// restart (supervisedEngine).
type hostEngine interface {
	transfer.Engine
	transfer.ContextPoster
	costDeclarer
	// Connect forwards to the plugin's engine when it declared
	// transfer.Connector and does nothing otherwise (the first write
	// dials, as Connector allows).
	transfer.Connector
	// WakeRecvNotification ends the host's wait in RecvNotification, for
	// any plugin (it cancels the call).
	transfer.NotificationWaker
	// StallWrites stalls the plugin's engine's writes when it declared
	// transfer.WriteStaller (a test-only capability) and fails wrapping
	// ErrUnsupported otherwise.
	transfer.WriteStaller
	// SetAuthenticator lends the agent's authenticator to the plugin's
	// engine when it declared transfer.Authenticating (over Callbacks);
	// otherwise it warns that the engine's peer names are only claimed.
	transfer.Authenticating
	// FenceWrites forwards to the plugin's engine when it declared
	// transfer.WriteFencer and returns at once otherwise.
	transfer.WriteFencer
	Supervised
	capabilities() caps
	notify(peer string, payload []byte) error
	recvNotification(timeout time.Duration) (transfer.Message, error)
	setWriteGuard(g transfer.WriteGuard)
	setPeerLost(fn func(peer string))
}

// notifies is transfer.Notifier (with its MaxNotifySize) of a hostEngine.
type notifies struct{ e hostEngine }

// Notify sends a notification through the plugin's engine.
func (n notifies) Notify(peer string, payload []byte) error { return n.e.notify(peer, payload) }

// RecvNotification waits at most timeout for one from the plugin's engine.
func (n notifies) RecvNotification(timeout time.Duration) (transfer.Message, error) {
	return n.e.recvNotification(timeout)
}

// MaxNotifySize returns the notification limit the plugin's engine
// declared; 0 means it declared none.
func (n notifies) MaxNotifySize() int { return n.e.capabilities().maxNotify }

// guards is transfer.WriteGuarded of a hostEngine.
type guards struct{ e hostEngine }

// SetWriteGuard installs g in the plugin's engine, which asks it over the
// callback stream before a byte a peer sends lands; an unanswered check
// refuses the write.
func (g guards) SetWriteGuard(w transfer.WriteGuard) { g.e.setWriteGuard(w) }

// reportsLoss is transfer.PeerLossReporter of a hostEngine.
type reportsLoss struct{ e hostEngine }

// SetPeerLost registers fn, called (on the host) with each peer the
// plugin's engine reports lost.
func (r reportsLoss) SetPeerLost(fn func(peer string)) { r.e.setPeerLost(fn) }

// The host-side engine types, one per set of optional capabilities:
// N notifier, F fencer, G write guarded, L peer-loss reporter.
type (
	engN struct {
		hostEngine
		notifies
	}
	engF struct {
		hostEngine
		fencing
	}
	engG struct {
		hostEngine
		guards
	}
	engL struct {
		hostEngine
		reportsLoss
	}
	engNF struct {
		hostEngine
		notifies
		fencing
	}
	engNG struct {
		hostEngine
		notifies
		guards
	}
	engNL struct {
		hostEngine
		notifies
		reportsLoss
	}
	engFG struct {
		hostEngine
		fencing
		guards
	}
	engFL struct {
		hostEngine
		fencing
		reportsLoss
	}
	engGL struct {
		hostEngine
		guards
		reportsLoss
	}
	engNFG struct {
		hostEngine
		notifies
		fencing
		guards
	}
	engNFL struct {
		hostEngine
		notifies
		fencing
		reportsLoss
	}
	engNGL struct {
		hostEngine
		notifies
		guards
		reportsLoss
	}
	engFGL struct {
		hostEngine
		fencing
		guards
		reportsLoss
	}
	engNFGL struct {
		hostEngine
		notifies
		fencing
		guards
		reportsLoss
	}
)

// declare returns e as the engine type that implements exactly the
// optional capabilities its plugin's engine declared.
func declare(e hostEngine) transfer.Engine {
	c := e.capabilities()
	n, f, g, l := notifies{e}, c.fencing(), guards{e}, reportsLoss{e}
	switch [4]bool{c.notifier, c.fencer, c.guarded, c.peerLoss} {
	case [4]bool{true, false, false, false}:
		return engN{e, n}
	case [4]bool{false, true, false, false}:
		return engF{e, f}
	case [4]bool{false, false, true, false}:
		return engG{e, g}
	case [4]bool{false, false, false, true}:
		return engL{e, l}
	case [4]bool{true, true, false, false}:
		return engNF{e, n, f}
	case [4]bool{true, false, true, false}:
		return engNG{e, n, g}
	case [4]bool{true, false, false, true}:
		return engNL{e, n, l}
	case [4]bool{false, true, true, false}:
		return engFG{e, f, g}
	case [4]bool{false, true, false, true}:
		return engFL{e, f, l}
	case [4]bool{false, false, true, true}:
		return engGL{e, g, l}
	case [4]bool{true, true, true, false}:
		return engNFG{e, n, f, g}
	case [4]bool{true, true, false, true}:
		return engNFL{e, n, f, l}
	case [4]bool{true, false, true, true}:
		return engNGL{e, n, g, l}
	case [4]bool{false, true, true, true}:
		return engFGL{e, f, g, l}
	case [4]bool{true, true, true, true}:
		return engNFGL{e, n, f, g, l}
	}
	return e
}

var (
	_ hostEngine                = (*remoteEngine)(nil)
	_ hostEngine                = (*supervisedEngine)(nil)
	_ transfer.Notifier         = engNFGL{}
	_ notifyLimiter             = engNFGL{}
	_ transfer.Fencer           = engNFGL{}
	_ transfer.WriteGuarded     = engNFGL{}
	_ transfer.PeerLossReporter = engNFGL{}
)
