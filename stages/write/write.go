// Package write is the bulk-write stage of the bounce pipeline: one
// contiguous local region into a region the peer granted, posted as a single
// write on a transfer.Engine.
package write

import (
	"context"
	"fmt"

	"github.com/bouncekv/bounce/transfer"
)

// Writer is a transfer.Writer over an Engine. It is safe for concurrent use
// when the engine is.
type Writer struct {
	engine transfer.Engine
}

var (
	_ transfer.Writer        = (*Writer)(nil)
	_ transfer.ContextWriter = (*Writer)(nil)
)

// New returns a Writer that posts through engine.
func New(engine transfer.Engine) *Writer { return &Writer{engine: engine} }

// Write posts one WriteOp{src, dst} to peer and returns the engine's Op, so
// Done means the bytes are visible at the target. src.Len must equal dst.Len
// and be positive (otherwise the error wraps transfer.ErrOutOfBounds);
// engine errors are returned wrapped.
func (w *Writer) Write(peer string, src, dst transfer.Desc) (transfer.Op, error) {
	return w.WriteContext(context.Background(), peer, src, dst)
}

// WriteContext is Write that hands ctx (the chunk's trace span) to an
// engine that takes one (transfer.ContextPoster).
func (w *Writer) WriteContext(ctx context.Context, peer string, src, dst transfer.Desc) (transfer.Op, error) {
	if w.engine == nil {
		return nil, fmt.Errorf("write: to %q: no engine: %w", peer, transfer.ErrClosed)
	}
	if src.Len == 0 || src.Len != dst.Len {
		return nil, fmt.Errorf("write: to %q: source %v and destination %v must have the same positive length: %w",
			peer, src, dst, transfer.ErrOutOfBounds)
	}
	ops := []transfer.WriteOp{{Src: src, Dst: dst}}
	var (
		op  transfer.Op
		err error
	)
	if cp, ok := w.engine.(transfer.ContextPoster); ok {
		op, err = cp.PostWriteContext(ctx, peer, ops)
	} else {
		op, err = w.engine.PostWrite(peer, ops)
	}
	if err != nil {
		return nil, fmt.Errorf("write: to %q: %w", peer, err)
	}
	return op, nil
}
