// Package host is the host-memory transfer.Scatterer: it copies one contiguous region out to scattered registered host memory
// on a bounded pool of copy contexts and a small fixed set of workers
// (see package hostcopy).
package host

import (
	"github.com/bouncekv/bounce/stages/hostcopy"
	"github.com/bouncekv/bounce/transfer"
)

// Settings configures a Scatterer.
type Settings = hostcopy.Settings

// Scatterer copies the region out to each run's addresses. It is safe for concurrent use.
type Scatterer struct {
	e *hostcopy.Engine
}

var (
	_ transfer.Scatterer       = (*Scatterer)(nil)
	_ transfer.BlockScatterer  = (*Scatterer)(nil)
	_ transfer.ShapedScatterer = (*Scatterer)(nil)
)

// New validates s and starts the workers; Close stops them.
func New(s Settings) (*Scatterer, error) {
	e, err := hostcopy.New(hostcopy.Scatter, s)
	if err != nil {
		return nil, err
	}
	return &Scatterer{e: e}, nil
}

// Scatter checks region and runs, then queues the copy and returns at once. The
// region and every copy of every run (Count copies, with strides) must lie
// in registered host memory and the runs inside the region, or the error
// wraps transfer.ErrOutOfBounds or transfer.ErrNotRegistered and nothing is
// written. When every context is in use the error wraps transfer.ErrBusy;
// after Close it wraps transfer.ErrClosed. The returned Op must be released
// once terminal to return its context. The memory the runs name must stay
// registered and mapped until then.
func (x *Scatterer) Scatter(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	return x.e.Submit(region, runs)
}

// ScatterBlocks is Scatter for a block-table chunk (transfer.BlockScatterer): the
// pieces' addresses come from the pool's geometry and ids, checked once per
// id and once per pool region the chunk touches, never per piece (see
// hostcopy.Engine.SubmitBlocks). Errors are Scatter's.
func (x *Scatterer) ScatterBlocks(region transfer.Desc, c transfer.BlockCopy) (transfer.Op, error) {
	return x.e.SubmitBlocks(region, c)
}

// ScatterShaped is ScatterBlocks for a shaped block copy (transfer.ShapedScatterer):
// a layout conversion's units, each segment's address computed from the
// pool's geometry, ids and the shape (see hostcopy.Engine.SubmitShaped).
// Errors are Scatter's.
func (x *Scatterer) ScatterShaped(region transfer.Desc, c transfer.ShapedCopy) (transfer.Op, error) {
	return x.e.SubmitShaped(region, c)
}

// Idle returns the number of copy contexts free right now.
func (x *Scatterer) Idle() int { return x.e.Idle() }

// Close fails queued operations with transfer.ErrClosed, waits for running
// copies and stops the workers. It is idempotent.
func (x *Scatterer) Close() error { return x.e.Close() }
