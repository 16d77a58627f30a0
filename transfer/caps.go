package transfer

import "time"

// The optional capabilities below are declared by the methods alone: an
// implementation has one when its value has the method, and the agent finds
// it with a type assertion. (Notifier, Fencer, ContextPoster,
// ContextWriter, PeerLossReporter, Connector, WriteGuarded, MemoryKinder
// and StagedKinder are the others; NotifyLimiter, RouteCoster, the wakers,
// Listener, WriteFencer, Authenticating, Reader and ReadGuarded are below;
// WriteStaller is for tests only.) A wrapper that embeds the interface
// Engine hides them: embed the concrete type, or forward the methods.

// NotifyLimiter is the optional capability of a Notifier whose
// notifications are bounded: MaxNotifySize is the largest payload Notify
// accepts, in bytes; 0 states no limit. The pipeline fits what it sends as
// a notification (a DONE's reason) to it.
type NotifyLimiter interface {
	MaxNotifySize() int
}

// RouteCoster is the optional capability of an Engine that states its
// costs for route auto's cost model: the cost of posting one descriptor of
// a direct write, the fixed cost of one write, and its bulk bandwidth in
// bytes per second. Costs that are not valid (negative, a bandwidth that is
// not positive and finite) count as none declared: the model assumes its
// defaults and learns from observed transfers.
type RouteCoster interface {
	RouteCosts() (postPerDesc, perWrite time.Duration, bandwidth float64)
}

// NotificationWaker is the optional capability of a Notifier whose
// RecvNotification in progress (or else its next one) can be made to
// return at once with ErrTimeout. The agent calls it when it shuts down, so
// its receive loop ends without waiting out its timeout. It never blocks.
type NotificationWaker interface {
	WakeRecvNotification()
}

// RecvWaker is NotificationWaker for a ControlChannel: WakeRecv makes a
// Recv in progress (or else the next one) return at once with ErrTimeout.
type RecvWaker interface {
	WakeRecv()
}

// MessageLimiter is the optional capability of a ControlChannel that
// bounds one message: MaxMessageSize is the largest payload Send accepts,
// in bytes (nixlnotif, whose messages are engine notifications). The
// pipeline sizes its DATA and WANT messages to it.
type MessageLimiter interface {
	MaxMessageSize() int
}

// Listener is the optional capability of an Engine that accepts its peers'
// connections on a network address: Addr returns the host:port it
// advertises (what its Metadata tells peers to dial). A restarted engine
// plugin is given the same address, so peers that loaded its metadata reach
// the new process.
type Listener interface {
	Addr() string
}

// WriteStaller is the optional, test-only capability of an Engine that can
// stall its own writes on purpose, for the conformance suite (the rules
// engine/not-quiescent, engine/post-async and the forget rules): once
// StallWrites returned, writes posted later move no byte, writes in
// flight move at most the pieces already going out, and they all stay
// pending until release is called (ForgetPeer and Close may still fail
// them); then they go on. Stalls nest: writes move again once every release was
// called. release is idempotent and never blocks for long. An error
// (wrapping ErrUnsupported where the engine cannot stall: the host side of
// a plugin whose engine lacks it) stalls nothing. The agent never calls
// it, and an engine need not implement it: without it the rules that need
// a stall skip, or fall back to timing, and say so.
type WriteStaller interface {
	StallWrites() (release func(), err error)
}

// WriteFencer is the optional capability of a WriteGuarded Engine that can
// fence the incoming writes its guard allowed: FenceWrites returns once no
// write into memory overlapping d is landing any more, cutting a frame
// still arriving there. The agent calls it each time a grant ends (DATA,
// cancel, expiry, reclaim) and before the region is granted again, so a
// trickled frame of its former holder never lands in the next one's
// (docs/SECURITY.md). It must return within a frame's deadline.
type WriteFencer interface {
	FenceWrites(d Desc)
}

// Authenticator is an agent's authority over its peers' identities, lent
// to an engine that authenticates its connections with the agent's key but
// does not hold it (an engine in a plugin process): DH computes the X25519
// product of the agent's private key with pub, so the private key stays
// with the agent; KeyOf and NameOf answer from the admitted set, which the
// agent keeps current. Keys are X25519 public keys. It is safe for
// concurrent use.
type Authenticator interface {
	PublicKey() [32]byte
	DH(pub [32]byte) ([32]byte, error)
	KeyOf(peer string) (key [32]byte, ok bool)
	NameOf(key [32]byte) (peer string, ok bool)
}

// Authenticating is the optional capability of an Engine that
// authenticates its peers with an Authenticator: once SetAuthenticator
// installed one, the engine accepts only connections whose key NameOf
// knows and names each incoming write's peer by that key, never by what
// the peer claimed; connections it accepted before are closed. nil removes
// it. The agent installs one before its write guard when authentication is
// on.
type Authenticating interface {
	SetAuthenticator(a Authenticator)
}

// ReadOp is one remote-to-local copy of Src.Len bytes from the peer's
// memory Src into local memory Dst (a READ). Src.Len must equal Dst.Len.
type ReadOp struct {
	Src Desc
	Dst Desc
}

// Reader is the optional capability of an Engine that reads a peer's
// memory (one-sided READ): PostRead posts one or many reads as a single
// operation, as PostWrite does writes. Every destination must lie in
// memory registered with this engine (ErrNotRegistered, ErrOutOfBounds
// before a byte moves); whether a source may be read is the peer's
// decision: a peer serves a read only of memory its ReadGuard allows this
// engine's name at that moment, and a refused read fails the operation
// with ErrForbidden with nothing of it read. PostRead is asynchronous like
// PostWrite; the operation is Done only when every byte is in the local
// destination, and a terminal operation never writes it again.
// ForgetPeer fails the peer's in-flight reads (ErrPeerLost) and Close
// fails them (ErrClosed); both return once those are terminal, so no byte
// of them lands after. DeregisterMemory of a destination in use returns
// ErrInUse.
type Reader interface {
	PostRead(peer string, ops []ReadOp) (Op, error)
}

// ReadGuard authorizes one incoming read: it returns nil and the range
// allowed contains src when peer may read src now, and an error wrapping
// ErrForbidden otherwise. allowed is a range the caller may treat as
// authorized for further reads of the same peer within the same request,
// as for WriteGuard.
type ReadGuard func(peer string, src Desc) (allowed Desc, err error)

// ReadGuarded is the optional capability of an Engine that serves its
// peers' reads (the target side of Reader). It serves a read only when a
// ReadGuard is installed and allows it, naming the reading peer by its
// authenticated name when the engine authenticates (never by what the
// peer claimed); without a guard it serves none. A refused read is
// answered with ErrForbidden before a byte of local memory is sent, and
// counted. The agent installs a guard that allows a peer to read only a
// staging region it gathered for that peer's pull, from the moment it
// offers it until the pull's ACK, cancel or failure (docs/SECURITY.md).
//
// FenceReads returns once no read of memory overlapping d is being served
// any more (one still sending is cut): the agent calls it each time it
// revokes a read grant (its guard refuses the region from then on) and
// reuses the region only once it returned, so no peer reads what the
// region holds next. The agent calls it off its reactor, possibly for
// several regions at once (it must be safe for concurrent use). It must
// return within a frame's deadline.
type ReadGuarded interface {
	SetReadGuard(g ReadGuard)
	FenceReads(d Desc)
}

// CanRead reports whether engine x both posts reads and serves them
// (Reader and ReadGuarded): the pull path reads a holder's staged regions
// only between such engines.
func CanRead(x any) bool {
	_, r := x.(Reader)
	_, g := x.(ReadGuarded)
	return r && g
}
