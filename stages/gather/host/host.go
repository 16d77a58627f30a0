// Package host is the host-memory transfer.Gatherer: it copies scattered registered host memory into one contiguous region
// on a bounded pool of copy contexts and a small fixed set of workers
// (see package hostcopy).
package host

import (
	"github.com/bouncekv/bounce/stages/hostcopy"
	"github.com/bouncekv/bounce/transfer"
)

// Settings configures a Gatherer.
type Settings = hostcopy.Settings

// Gatherer copies each run's addresses into the region. It is safe for concurrent use.
type Gatherer struct {
	e *hostcopy.Engine
}

var (
	_ transfer.Gatherer       = (*Gatherer)(nil)
	_ transfer.BlockGatherer  = (*Gatherer)(nil)
	_ transfer.ShapedGatherer = (*Gatherer)(nil)
)

// New validates s and starts the workers; Close stops them.
func New(s Settings) (*Gatherer, error) {
	e, err := hostcopy.New(hostcopy.Gather, s)
	if err != nil {
		return nil, err
	}
	return &Gatherer{e: e}, nil
}

// Gather checks region and runs, then queues the copy and returns at once. The
// region and every copy of every run (Count copies, with strides) must lie
// in registered host memory and the runs inside the region, or the error
// wraps transfer.ErrOutOfBounds or transfer.ErrNotRegistered and nothing is
// written. When every context is in use the error wraps transfer.ErrBusy;
// after Close it wraps transfer.ErrClosed. The returned Op must be released
// once terminal to return its context. The memory the runs name must stay
// registered and mapped until then.
func (x *Gatherer) Gather(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	return x.e.Submit(region, runs)
}

// GatherBlocks is Gather for a block-table chunk (transfer.BlockGatherer): the
// pieces' addresses come from the pool's geometry and ids, checked once per
// id and once per pool region the chunk touches, never per piece (see
// hostcopy.Engine.SubmitBlocks). Errors are Gather's.
func (x *Gatherer) GatherBlocks(region transfer.Desc, c transfer.BlockCopy) (transfer.Op, error) {
	return x.e.SubmitBlocks(region, c)
}

// GatherShaped is GatherBlocks for a shaped block copy (transfer.ShapedGatherer):
// a layout conversion's units, each segment's address computed from the
// pool's geometry, ids and the shape (see hostcopy.Engine.SubmitShaped).
// Errors are Gather's.
func (x *Gatherer) GatherShaped(region transfer.Desc, c transfer.ShapedCopy) (transfer.Op, error) {
	return x.e.SubmitShaped(region, c)
}

// Idle returns the number of copy contexts free right now.
func (x *Gatherer) Idle() int { return x.e.Idle() }

// Close fails queued operations with transfer.ErrClosed, waits for running
// copies and stops the workers. It is idempotent.
func (x *Gatherer) Close() error { return x.e.Close() }
