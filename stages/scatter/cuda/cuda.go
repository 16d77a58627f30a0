// Package cuda is the CUDA transfer.Scatterer: it copies one contiguous region out to scattered CUDA (or pinned host) memory
// with one kernel launch per operation, completion by a CUDA event that
// Poll queries without blocking (see package gpucopy). It is also a
// transfer.BlockScatterer: a block-table chunk is one kernel that computes
// each piece's address from (region base, stride, id), no piece table,
// completion by a flag the kernel stores to host-mapped memory.
package cuda

import (
	"github.com/bouncekv/bounce/stages/gpucopy"
	"github.com/bouncekv/bounce/transfer"
)

// Settings configures a Scatterer.
type Settings = gpucopy.Settings

// Scatterer is the CUDA scatter stage. It is safe for concurrent use.
type Scatterer struct {
	e *gpucopy.Engine
}

var (
	_ transfer.Scatterer      = (*Scatterer)(nil)
	_ transfer.BlockScatterer = (*Scatterer)(nil)
)

// New validates s, loads the kernels and builds the context pool; Close
// frees it.
func New(s Settings) (*Scatterer, error) {
	e, err := gpucopy.New(gpucopy.Scatter, s)
	if err != nil {
		return nil, err
	}
	return &Scatterer{e: e}, nil
}

// Scatter checks region and runs against the registry (CUDA memory of the
// stage's device or pinned, device-mapped host memory) and launches one
// kernel for all runs. A full pool is transfer.ErrBusy; bad runs are
// transfer.ErrOutOfBounds, ErrNotRegistered or ErrUnsupported, and nothing
// moves. The returned Op must be released once terminal.
func (x *Scatterer) Scatter(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	return x.e.Submit(region, runs)
}

// ScatterBlocks is Scatter for a block-table chunk: one kernel computing each
// piece's address from (region base, stride, id), no piece table; the ids
// are checked once each and the registry once per pool region touched
// before any byte moves (see gpucopy.Engine.SubmitBlocks). A module
// without block kernels is transfer.ErrUnsupported.
func (x *Scatterer) ScatterBlocks(region transfer.Desc, c transfer.BlockCopy) (transfer.Op, error) {
	return x.e.SubmitBlocks(region, c)
}

// Launched counts the operations launched in each form (gpucopy.Launched):
// a block-table chunk that reached ScatterBlocks counts in Blocks.
func (x *Scatterer) Launched() gpucopy.Launched { return x.e.Launched() }

// MemoryKinds reports host (pinned) and CUDA memory.
func (x *Scatterer) MemoryKinds() []transfer.MemKind { return x.e.MemoryKinds() }

// Idle returns the number of copy contexts free right now.
func (x *Scatterer) Idle() int { return x.e.Idle() }

// Close waits for launched copies (bounded) and frees the pool. It is
// idempotent.
func (x *Scatterer) Close() error { return x.e.Close() }
