package transfer

import (
	"errors"
	"fmt"
)

// Sentinel errors. Implementations wrap them with context
// (fmt.Errorf("...: %w", ErrX)) so callers test with errors.Is.
var (
	// ErrBusy means a bounded resource (copy contexts, queue slots) is
	// exhausted right now. It is backpressure: retry later, nothing failed.
	ErrBusy = errors.New("resource busy")
	// ErrQueueFull means a non-blocking send found the peer's queue full and
	// dropped the message.
	ErrQueueFull = errors.New("send queue full")
	// ErrTimeout means a bounded wait ended without a result.
	ErrTimeout = errors.New("timed out")
	// ErrClosed means the object was closed or shut down.
	ErrClosed = errors.New("closed")
	// ErrUnknownPeer means the peer was never loaded or was forgotten.
	ErrUnknownPeer = errors.New("unknown peer")
	// ErrPeerLost means the peer went away while work was in flight.
	ErrPeerLost = errors.New("peer lost")
	// ErrOutOfBounds means an access falls outside registered or granted memory.
	ErrOutOfBounds = errors.New("out of bounds")
	// ErrNotRegistered means the memory was never registered with the engine.
	ErrNotRegistered = errors.New("memory not registered")
	// ErrInUse means the memory or handle is still being used by work in flight.
	ErrInUse = errors.New("in use")
	// ErrBadEndpoint means a control or engine endpoint is malformed or unusable.
	ErrBadEndpoint = errors.New("bad endpoint")
	// ErrBadMetadata means peer metadata could not be decoded or validated.
	ErrBadMetadata = errors.New("bad peer metadata")
	// ErrNotQuiescent means work reached a terminal state without proof that
	// no transport or stage still touches the caller's memory. The memory
	// must not be freed or reused.
	ErrNotQuiescent = errors.New("not quiescent")
	// ErrDeviceFault means the device or transport faulted while an
	// operation used the memory: the memory must never be released and the
	// engine must be restarted.
	ErrDeviceFault = errors.New("device fault")
	// ErrUnsupported means the implementation does not offer the capability.
	ErrUnsupported = errors.New("unsupported")
	// ErrForbidden means the peer may not write where it tried: the target
	// range is neither granted to one of its flows nor registered for it;
	// or it may not read where it tried (a range its ReadGuard does not
	// allow it). It wraps ErrOutOfBounds, so layers that know only the older sentinels
	// (plugin error codes) still classify it.
	ErrForbidden = fmt.Errorf("access not authorized: %w", ErrOutOfBounds)
)
