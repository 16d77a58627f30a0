// Package tcp is a pure-Go transfer.Engine and transfer.Notifier with
// one-sided write semantics over TCP, usable between processes and hosts.
//
// # Model
//
// New listens at once. Metadata advertises the engine's name, its address
// and its registered host ranges; a peer passes it to LoadPeer. Each engine
// dials up to Config.Connections connections to a peer, lazily on the first
// write or notification (or at Connect), and redials on the next use after a connection
// broke. The first frame on a connection is HELLO carrying the dialer's
// metadata, so the accepting engine learns the dialer's name (the Peer of
// received notifications) and can write or notify back even if it never
// loaded it. A learned peer never overrides one loaded with LoadPeer, and
// it is dropped when its last connection ends with nothing in flight to it
// (a HELLO learns it again), so a receiver keeps no entry per sender that
// ever connected.
//
// PostWrite checks every source against the local registry and every
// destination against the peer's advertised ranges before anything is sent,
// splits the post into parts of at most MaxFramePayload bytes and
// MaxSegments segments (striped over the connections when larger than
// Config.StripeBytes) and writes each part as one WRITE frame with writev
// straight from the source memory. The receiver checks every destination
// against its own registry (it never trusts the sender), reads the payload
// with readv straight into the destination memory and replies ACK once the
// bytes are in place. The operation is Done when every part is
// acknowledged.
//
// # Errors and quiescence
//
// A well-formed WRITE naming memory the receiver did not register is read
// and discarded, nothing of it is written, and the receiver replies NACK;
// the connection stays usable and the operation fails with ErrOutOfBounds or
// ErrNotRegistered. A malformed frame (bad header, lengths beyond the wire
// limits, an unexpected type, a first frame other than HELLO) closes the
// connection. A sender that dies inside a frame's payload may leave part of
// that frame's destination written (never anything outside it); the frame
// is never acknowledged, so the sender's operation fails.
//
// ForgetPeer is a fence on the target side as well (transfer.Fencer):
// once it returns, no byte the forgotten peer sent or sends lands here.
// Its named connections are reset and waited for, a read into local
// memory in progress included; a connection still dialing or in HELLO is
// refused (a connection-level NACK, then a reset) when its HELLO names
// the peer, and so is every later one, until LoadPeer loads the peer
// again or Config.FenceHold passed. The dialer's writes on a refused
// connection fail with ErrPeerLost. The fence is bounded: a name is held
// for FenceHold (the node sets it to bounce.quarantine, the time the agent
// trusts any late write to have landed by, fence or not) and at most
// MaxForgotten names are held, the oldest dropped first (counted in
// Stats.FenceEvictions).
//
// A part is resolved only after the goroutine writing it returned from the
// socket write, so a terminal operation never reads its source memory again.
// When a connection breaks, its unacknowledged parts fail with ErrPeerLost;
// ForgetPeer fails them with ErrPeerLost and Close with ErrClosed, and both
// return only after those operations are terminal. Giving up an outgoing
// connection also proves the destination quiet: a reset would not (the
// receiver's kernel keeps what it received, and its reader lands it after
// the reset), so the connection is half-closed and the peer's close awaited
// — it applies and acknowledges what it received, then closes. Writes whose
// bytes went out on a connection the peer did not close within FenceTimeout
// fail wrapping ErrNotQuiescent as well. DeregisterMemory returns
// ErrInUse while an outgoing write reads from the range or an incoming write
// is landing in it.
//
// # Bounds
//
// Nothing waits forever. Dialing and the HELLO exchange are bounded by
// DialTimeout; writing one frame by WriteTimeout; each read inside a received
// frame must progress within IdleTimeout. A peer that stops answering while
// writes are outstanding fails them within WriteTimeout (if it stops
// reading) or 2×IdleTimeout after the last byte was written or
// acknowledged (if it stops acknowledging), then wait at most FenceTimeout
// for the peer's close. A peer process that dies is
// seen at once through the closed socket; a host that vanishes is also
// caught by TCP keepalive (idle IdleTimeout). Close unblocks everything; it
// gives up every peer at once and waits one FenceTimeout for them all.
package tcp
