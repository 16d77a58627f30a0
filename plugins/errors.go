package plugins

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	"github.com/bouncekv/bounce/transfer"
)

// sentinel pairs a wire code with a transfer sentinel error.
type sentinel struct {
	code pb.Code
	err  error
}

// sentinels maps wire codes to transfer's sentinel errors. It is a constant
// table, never written.
var sentinels = [...]sentinel{
	{pb.Code_CODE_BUSY, transfer.ErrBusy},
	{pb.Code_CODE_QUEUE_FULL, transfer.ErrQueueFull},
	{pb.Code_CODE_TIMEOUT, transfer.ErrTimeout},
	{pb.Code_CODE_CLOSED, transfer.ErrClosed},
	{pb.Code_CODE_UNKNOWN_PEER, transfer.ErrUnknownPeer},
	{pb.Code_CODE_PEER_LOST, transfer.ErrPeerLost},
	{pb.Code_CODE_OUT_OF_BOUNDS, transfer.ErrOutOfBounds},
	{pb.Code_CODE_NOT_REGISTERED, transfer.ErrNotRegistered},
	{pb.Code_CODE_IN_USE, transfer.ErrInUse},
	{pb.Code_CODE_BAD_ENDPOINT, transfer.ErrBadEndpoint},
	{pb.Code_CODE_BAD_METADATA, transfer.ErrBadMetadata},
	{pb.Code_CODE_NOT_QUIESCENT, transfer.ErrNotQuiescent},
	{pb.Code_CODE_DEVICE_FAULT, transfer.ErrDeviceFault},
	{pb.Code_CODE_UNSUPPORTED, transfer.ErrUnsupported},
	{pb.Code_CODE_FORBIDDEN, transfer.ErrForbidden},
}

// toProtoError encodes err with every transfer sentinel it wraps.
func toProtoError(err error) *pb.Error {
	if err == nil {
		return nil
	}
	e := &pb.Error{Message: []byte(err.Error())}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			e.Codes = append(e.Codes, s.code)
		}
	}
	return e
}

// RemoteError is an error a plugin reported: its message and the transfer
// sentinels it wrapped in the plugin process, so errors.Is works on the
// host side.
type RemoteError struct {
	// Msg is the plugin's error message.
	Msg string
	// Wrapped are the transfer sentinels the plugin's error wrapped.
	Wrapped []error
}

// Error returns the plugin's message.
func (e *RemoteError) Error() string { return e.Msg }

// Unwrap returns the wrapped sentinels.
func (e *RemoteError) Unwrap() []error { return e.Wrapped }

// fromProtoError decodes a wire error; unknown codes are ignored.
func fromProtoError(e *pb.Error) error {
	if e == nil {
		return nil
	}
	r := &RemoteError{Msg: string(e.GetMessage())}
	if r.Msg == "" {
		r.Msg = "plugin reported an error without a message"
	}
	for _, c := range e.GetCodes() {
		for _, s := range sentinels {
			if s.code == c {
				r.Wrapped = append(r.Wrapped, s.err)
			}
		}
	}
	return r
}

// ErrNotServed is wrapped (with transfer.ErrUnsupported) by the error of
// a call to a service the plugin binary does not serve: opening a writer
// of a binary whose ServeOpts has no Writer, say.
var ErrNotServed = errors.New("the plugin does not serve this")

// rpcError turns a failed gRPC call into an error wrapping a transfer
// sentinel: a plugin that went away is ErrPeerLost (or ErrClosed after the
// host closed it), a call past its deadline ErrTimeout.
func rpcError(what string, err error, closed bool) error {
	if closed {
		return fmt.Errorf("plugin: %s: plugin closed: %w", what, transfer.ErrClosed)
	}
	switch status.Code(err) {
	case codes.Unimplemented:
		return fmt.Errorf("plugin: %s: %w: %v: %w", what, ErrNotServed, err, transfer.ErrUnsupported)
	case codes.DeadlineExceeded:
		return fmt.Errorf("plugin: %s: no reply in time: %v: %w", what, err, transfer.ErrTimeout)
	case codes.Canceled:
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("plugin: %s: no reply in time: %v: %w", what, err, transfer.ErrTimeout)
		}
	}
	return fmt.Errorf("plugin: %s: plugin unreachable: %v: %w", what, err, transfer.ErrPeerLost)
}

// isConnLost reports whether a failed call means the connection to the
// plugin is gone (rather than slow).
func isConnLost(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable:
		return true
	case codes.Canceled:
		return !errors.Is(err, context.DeadlineExceeded)
	}
	return false
}
