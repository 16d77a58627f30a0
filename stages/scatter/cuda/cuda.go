// Package cuda is the CUDA transfer.Scatterer: it copies one contiguous region out to scattered CUDA (or pinned host) memory
// with one kernel launch per operation, completion by a CUDA event that
// Poll queries without blocking (see package gpucopy). Where its kernel
// module has them it is also a transfer.BlockScatterer (a block-table chunk
// is one kernel that computes each piece's address from (region base,
// stride, id), no piece table, completion by a flag the kernel stores to
// host-mapped memory) and a transfer.ShapedScatterer (the same for a shaped
// chunk, a layout conversion's segments of groups of blocks); a module
// without them does not claim them, so the pipeline falls back to runs.
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
	_ transfer.Scatterer       = (*Scatterer)(nil)
	_ transfer.BlockScatterer  = blocks{}
	_ transfer.ShapedScatterer = shaped{}
	_ transfer.BlockScatterer  = blocksShaped{}
	_ transfer.ShapedScatterer = blocksShaped{}
)

// New validates s, loads the kernels and builds the context pool; Close
// frees it. The stage it returns is a *Scatterer with the optional
// capabilities its kernel module backs: transfer.BlockScatterer where the
// module has the block kernels, transfer.ShapedScatterer where it has the
// shaped ones (a module lacking them must not claim them: the pipeline
// then expands those chunks into runs).
func New(s Settings) (Stage, error) {
	e, err := gpucopy.New(gpucopy.Scatter, s)
	if err != nil {
		return nil, err
	}
	return withCapabilities(&Scatterer{e: e}), nil
}

// Stage is what New returns: the scatter stage and the methods of *Scatterer.
type Stage interface {
	transfer.Scatterer
	Launched() gpucopy.Launched
	Idle() int
}

// withCapabilities wraps x in the type naming the optional capabilities
// its engine's module backs.
func withCapabilities(x *Scatterer) Stage {
	switch b, sh := x.e.HasBlocks(), x.e.HasShaped(); {
	case b && sh:
		return blocksShaped{x}
	case b:
		return blocks{x}
	case sh:
		return shaped{x}
	}
	return x
}

// blocks, shaped and blocksShaped are a *Scatterer with the block form, the
// shaped form or both.
type (
	blocks       struct{ *Scatterer }
	shaped       struct{ *Scatterer }
	blocksShaped struct{ *Scatterer }
)

// ScatterBlocks is Scatter for a block-table chunk: one kernel computing each
// piece's address from (region base, stride, id), no piece table; the ids
// are checked once each and the registry once per pool region touched
// before any byte moves (see gpucopy.Engine.SubmitBlocks).
func (x blocks) ScatterBlocks(region transfer.Desc, c transfer.BlockCopy) (transfer.Op, error) {
	return x.e.SubmitBlocks(region, c)
}

func (x blocksShaped) ScatterBlocks(region transfer.Desc, c transfer.BlockCopy) (transfer.Op, error) {
	return x.e.SubmitBlocks(region, c)
}

// ScatterShaped is Scatter for a shaped block-table chunk (a layout
// conversion's segments of groups of blocks): one kernel computing each
// segment's address from (region base, stride, id, offset), the shape's
// segment table uploaded once; the checks are ScatterBlocks' (see
// gpucopy.Engine.SubmitShaped).
func (x shaped) ScatterShaped(region transfer.Desc, c transfer.ShapedCopy) (transfer.Op, error) {
	return x.e.SubmitShaped(region, c)
}

func (x blocksShaped) ScatterShaped(region transfer.Desc, c transfer.ShapedCopy) (transfer.Op, error) {
	return x.e.SubmitShaped(region, c)
}

// Scatter checks region and runs against the registry (CUDA memory of the
// stage's device or pinned, device-mapped host memory) and launches one
// kernel for all runs. A full pool is transfer.ErrBusy; bad runs are
// transfer.ErrOutOfBounds, ErrNotRegistered or ErrUnsupported, and nothing
// moves. The returned Op must be released once terminal.
func (x *Scatterer) Scatter(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	return x.e.Submit(region, runs)
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
