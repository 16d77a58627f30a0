package transfer

import (
	"context"
	"fmt"
	"time"
)

// Status is the state of an asynchronous operation.
type Status uint8

const (
	// Pending means the operation may still be running.
	Pending Status = iota
	// Done means the operation completed successfully. For writes this means
	// the bytes are visible at the target.
	Done
	// Failed means the operation ended in error.
	Failed
)

// String returns "pending", "done" or "failed".
func (s Status) String() string {
	switch s {
	case Pending:
		return "pending"
	case Done:
		return "done"
	case Failed:
		return "failed"
	default:
		return fmt.Sprintf("status(%d)", uint8(s))
	}
}

// Terminal reports whether s is Done or Failed.
func (s Status) Terminal() bool { return s == Done || s == Failed }

// Op is an asynchronous operation started by an engine or a stage.
//
// Poll never blocks. It returns Pending until the operation is terminal, then
// Done or Failed (with the cause) on every later call. A terminal Poll is a
// promise of quiescence: the implementation no longer reads or writes any
// memory the operation named. An implementation that cannot prove that (a
// give-up after a timeout, say) returns Failed with an error wrapping
// ErrNotQuiescent, and the caller must not reuse that memory.
//
// Release frees the operation's resources. It is called exactly once, after
// Poll reported a terminal status; on a pending operation it returns an error
// wrapping ErrInUse and changes nothing. Poll and Release may be called from
// any goroutine, but not concurrently on the same Op.
type Op interface {
	Poll() (Status, error)
	Release() error
}

// AbandonOutcome is the answer to a bounded request to stop an operation.
type AbandonOutcome uint8

const (
	// Recoverable: the operation was stopped and proved quiescent; its
	// memory may be released.
	Recoverable AbandonOutcome = iota
	// DeviceFault: the operation cannot be stopped because the device or
	// transport is faulted; the memory must never be released, the engine
	// must be restarted.
	DeviceFault
	// NotQuiescent: no proof of quiescence was obtained within the bound;
	// the caller keeps waiting and must not release the memory.
	NotQuiescent
)

// String names the outcome.
func (o AbandonOutcome) String() string {
	switch o {
	case Recoverable:
		return "recoverable"
	case DeviceFault:
		return "device-fault"
	case NotQuiescent:
		return "not-quiescent"
	default:
		return fmt.Sprintf("abandon(%d)", uint8(o))
	}
}

// WriteOp is one local-to-remote copy of Src.Len bytes from local memory Src
// to the peer's memory Dst. Src.Len must equal Dst.Len.
type WriteOp struct {
	Src Desc
	Dst Desc
}

// Message is one control message or notification received from a peer.
// From is the network host (an IP address) it came from when the channel
// knows it (zmq over TCP), "" otherwise: a receiver dials a peer whose
// descriptor it never loaded only on that host.
type Message struct {
	Peer    string
	Payload []byte
	From    string
}

// Engine moves bytes from local registered memory to a peer's registered
// memory with one-sided write semantics.
//
// Every method is safe for concurrent use. Names are unique among peers.
// Metadata is an opaque blob a peer passes to LoadPeer; it describes how to
// reach this engine and the memory registered so far, so a peer reloads it
// after more memory is registered (loading the same peer again refreshes it).
//
// PostWrite posts one or many writes as a single operation. Every source must
// lie in memory registered with this engine and every destination in memory
// the peer registered; anything else is rejected with ErrNotRegistered or
// ErrOutOfBounds before a byte moves. PostWrite is asynchronous: it returns
// once the writes are checked and handed to the transport, without waiting
// for bytes to move (a stalled link leaves the operation Pending, not the
// call blocked); progress is observed through the Op. The operation is Done
// only when every byte is visible at the target. ForgetPeer fails the peer's in-flight
// operations (ErrPeerLost) and a peer that dies does the same within a bound.
// ForgetPeer also works on the target side: once it returns, no write the
// peer posted lands in local memory any more (the pipeline relies on this
// before it re-grants a forgotten peer's regions); an engine that cannot
// promise it documents so.
// DeregisterMemory of memory an in-flight operation uses returns ErrInUse.
type Engine interface {
	Name() string
	RegisterMemory(d Desc) error
	DeregisterMemory(d Desc) error
	Metadata() ([]byte, error)
	LoadPeer(metadata []byte) (peer string, err error)
	ForgetPeer(peer string) error
	PostWrite(peer string, ops []WriteOp) (Op, error)
	Close() error
}

// Notifier is the optional notification capability of an Engine: small
// messages to a peer on the engine's own connections, delivered in order per
// peer. Notify never blocks; a full queue is ErrQueueFull. RecvNotification
// waits at most timeout and returns ErrTimeout when nothing arrived and
// ErrClosed once the engine is closed.
type Notifier interface {
	Notify(peer string, payload []byte) error
	RecvNotification(timeout time.Duration) (Message, error)
}

// Fencer is the optional capability of an Engine whose target-side
// ForgetPeer is a proven fence: once ForgetPeer(peer) returns, every path by
// which that peer could write local memory (established connections,
// connections still being set up, writes queued or in progress) is cut, and
// the peer stays refused until it is loaded again. FencesForgottenPeers
// reports whether this engine instance keeps that promise. The pipeline
// re-grants a forgotten peer's regions at once only when it does; otherwise
// it quarantines them first, because a slow peer may still land a write.
type Fencer interface {
	FencesForgottenPeers() bool
}

// ContextPoster is the optional capability of an Engine that takes the
// context of a post along with it: its trace span, so that work the engine
// does elsewhere (an engine plugin's process) joins the transfer's trace.
// PostWriteContext is PostWrite in every other respect; ctx does not bound
// the write.
type ContextPoster interface {
	PostWriteContext(ctx context.Context, peer string, ops []WriteOp) (Op, error)
}

// ContextWriter is the optional capability of a Writer that takes the
// context of a write along with it, as ContextPoster does for engines.
type ContextWriter interface {
	WriteContext(ctx context.Context, peer string, src, dst Desc) (Op, error)
}

// PeerLossReporter is the optional capability of an Engine (or a
// ControlChannel) that notices a peer is gone before any write to it
// fails: every connection the peer opened to this engine closed or reset
// (a process killed with kill -9, a host gone), or the control channel's
// connection to the peer dropped. The agent reclaims the receiver-side flows of that peer at
// once instead of waiting for their expiry.
type PeerLossReporter interface {
	// SetPeerLost registers fn, called with the peer's name each time the
	// peer lost its last connection. fn must not block.
	SetPeerLost(fn func(peer string))
}

// Connector is the optional capability of an Engine that can open its
// connection to a loaded peer ahead of the first write, so that the peer
// notices this process die (PeerLossReporter) even before that write.
// The agent calls it when it starts a request to the peer, not when it
// loads the peer: by then the peer has admitted this agent (a connection
// dialed before that is refused and looks like an attack to the peer).
type Connector interface {
	// Connect starts opening a connection to peer unless one is open or
	// opening. It does not block; a failure fails nothing (the first write
	// dials again).
	Connect(peer string)
}

// WriteGuard authorizes one incoming write: it returns nil and the range
// allowed contains dst when peer may write dst, and an error wrapping
// ErrForbidden otherwise. allowed is a range the caller may treat as
// authorized for further writes of the same peer within the same frame or
// operation (the granted region, the registered buffer), so the guard is
// asked once per range rather than once per segment.
type WriteGuard func(peer string, dst Desc) (allowed Desc, err error)

// WriteGuarded is the optional capability of an Engine that asks a
// WriteGuard before it lands a byte a peer sends. The agent installs one
// that admits writes only into a region currently granted to a flow of
// the writing peer, or into memory registered for that peer (docs/SECURITY.md).
// An engine refuses a write the guard forbids before any byte of it lands,
// answers it with an error the sender sees (ErrForbidden) and counts it.
type WriteGuarded interface {
	SetWriteGuard(g WriteGuard)
}

// ControlChannel carries the bounce control messages (WANT, GRANT, DATA, ACK)
// between agents. It is safe for concurrent use.
//
// Kind names the implementation ("zmq", "nixlnotif", ...); peers must use the
// same kind. LocalEndpoint is what a peer passes to AddPeer to reach this
// channel. AddPeer validates the endpoint before connecting and returns an
// error wrapping ErrBadEndpoint when it is unusable; adding a known peer
// again replaces its endpoint. Send never blocks and keeps no reference to
// payload once it returns (the caller reuses it): a full queue drops the
// message and returns ErrQueueFull, an unknown peer ErrUnknownPeer. Messages
// to one peer arrive in order. Recv waits at most timeout and reports the
// sending peer's name; it returns ErrTimeout when nothing arrived and
// ErrClosed after Close. Close is idempotent.
type ControlChannel interface {
	Kind() string
	LocalEndpoint() string
	AddPeer(peer, endpoint string) error
	RemovePeer(peer string) error
	Send(peer string, payload []byte) error
	Recv(timeout time.Duration) (Message, error)
	Close() error
}

// Gatherer copies scattered source memory into one contiguous region: for
// each run, each copy moves Len bytes from Addr(+i*AddrStride) to
// region.Addr+RegionOff(+i*RegionStride). Every run is checked against the
// region and the source memory before any byte moves. Gather returns
// ErrBusy when its bounded pool of copy contexts is exhausted; the caller
// retries later. Gather itself never blocks on the copy.
type Gatherer interface {
	Gather(region Desc, runs []Run) (Op, error)
	Close() error
}

// Scatterer is the inverse of Gatherer: each run copies from the region to
// its destination addresses, with the same checks and the same ErrBusy rule.
type Scatterer interface {
	Scatter(region Desc, runs []Run) (Op, error)
	Close() error
}

// Writer moves one contiguous local region into a region the peer granted:
// the bulk write of the bounce pipeline. It is Done only when the bytes are
// visible at the target.
type Writer interface {
	Write(peer string, src, dst Desc) (Op, error)
}

// MemoryKinder is the optional capability of an Engine, Gatherer or
// Scatterer that touches more than host memory: MemoryKinds lists the
// memory kinds it reads and writes. An implementation without it handles
// Host memory only.
type MemoryKinder interface {
	MemoryKinds() []MemKind
}

// Handles reports whether x (an Engine, Gatherer or Scatterer) reads and
// writes memory of kind k: the kinds it declares through MemoryKinder, or
// Host alone.
func Handles(x any, k MemKind) bool {
	mk, ok := x.(MemoryKinder)
	if !ok {
		return k == Host
	}
	for _, have := range mk.MemoryKinds() {
		if have == k {
			return true
		}
	}
	return false
}

// StagedKinder is the optional capability of an Engine that carries some
// memory kinds on the direct path only by staging every descriptor through
// host buffers of its own (a device-to-host copy per descriptor before the
// bytes go out, a host-to-device copy per descriptor after they arrive, as
// UCX's cuda-copy + tcp protocols do): StagedMemoryKinds lists them. Such
// memory is no arena for the bounce route (the engine does not Handle it),
// and route auto takes bounce for it; the direct route carries it.
type StagedKinder interface {
	StagedMemoryKinds() []MemKind
}

// Stages reports whether engine x carries memory of kind k only by
// staging it per descriptor (StagedKinder), not natively (Handles).
func Stages(x any, k MemKind) bool {
	sk, ok := x.(StagedKinder)
	if !ok || Handles(x, k) {
		return false
	}
	for _, have := range sk.StagedMemoryKinds() {
		if have == k {
			return true
		}
	}
	return false
}

// CheckKinds returns an error wrapping ErrUnsupported naming the first
// descriptor of ds whose memory kind x cannot touch; what names x in the
// message.
func CheckKinds(x any, what string, ds []Desc) error {
	var ok [256]bool // by MemKind, resolved once: this runs per descriptor
	if mk, has := x.(MemoryKinder); has {
		for _, k := range mk.MemoryKinds() {
			ok[k] = true
		}
	} else {
		ok[Host] = true
	}
	for i, d := range ds {
		if !ok[d.Kind] {
			return fmt.Errorf("%s cannot touch %s memory (descriptor %d %v): %w", what, d.Kind, i, d, ErrUnsupported)
		}
	}
	return nil
}
