// Package cuda is the CUDA transfer.Gatherer: it copies scattered CUDA (or pinned host) memory into one contiguous region
// with one kernel launch per operation, completion by a CUDA event that
// Poll queries without blocking (see package gpucopy). Where its kernel
// module has them it is also a transfer.BlockGatherer (a block-table chunk
// is one kernel that computes each piece's address from (region base,
// stride, id), no piece table, completion by a flag the kernel stores to
// host-mapped memory) and a transfer.ShapedGatherer (the same for a shaped
// chunk, a layout conversion's segments of groups of blocks); a module
// without them does not claim them, so the pipeline falls back to runs.
package cuda

import (
	"github.com/bouncekv/bounce/stages/gpucopy"
	"github.com/bouncekv/bounce/transfer"
)

// Settings configures a Gatherer.
type Settings = gpucopy.Settings

// Gatherer is the CUDA gather stage. It is safe for concurrent use.
type Gatherer struct {
	e *gpucopy.Engine
}

var (
	_ transfer.Gatherer       = (*Gatherer)(nil)
	_ transfer.BlockGatherer  = blocks{}
	_ transfer.ShapedGatherer = shaped{}
	_ transfer.BlockGatherer  = blocksShaped{}
	_ transfer.ShapedGatherer = blocksShaped{}
)

// New validates s, loads the kernels and builds the context pool; Close
// frees it. The stage it returns is a *Gatherer with the optional
// capabilities its kernel module backs: transfer.BlockGatherer where the
// module has the block kernels, transfer.ShapedGatherer where it has the
// shaped ones (a module lacking them must not claim them: the pipeline
// then expands those chunks into runs).
func New(s Settings) (Stage, error) {
	e, err := gpucopy.New(gpucopy.Gather, s)
	if err != nil {
		return nil, err
	}
	return withCapabilities(&Gatherer{e: e}), nil
}

// Stage is what New returns: the gather stage and the methods of *Gatherer.
type Stage interface {
	transfer.Gatherer
	Launched() gpucopy.Launched
	Idle() int
}

// withCapabilities wraps x in the type naming the optional capabilities
// its engine's module backs.
func withCapabilities(x *Gatherer) Stage {
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

// blocks, shaped and blocksShaped are a *Gatherer with the block form, the
// shaped form or both.
type (
	blocks       struct{ *Gatherer }
	shaped       struct{ *Gatherer }
	blocksShaped struct{ *Gatherer }
)

// GatherBlocks is Gather for a block-table chunk: one kernel computing each
// piece's address from (region base, stride, id), no piece table; the ids
// are checked once each and the registry once per pool region touched
// before any byte moves (see gpucopy.Engine.SubmitBlocks).
func (x blocks) GatherBlocks(region transfer.Desc, c transfer.BlockCopy) (transfer.Op, error) {
	return x.e.SubmitBlocks(region, c)
}

func (x blocksShaped) GatherBlocks(region transfer.Desc, c transfer.BlockCopy) (transfer.Op, error) {
	return x.e.SubmitBlocks(region, c)
}

// GatherShaped is Gather for a shaped block-table chunk (a layout
// conversion's segments of groups of blocks): one kernel computing each
// segment's address from (region base, stride, id, offset), the shape's
// segment table uploaded once; the checks are GatherBlocks' (see
// gpucopy.Engine.SubmitShaped).
func (x shaped) GatherShaped(region transfer.Desc, c transfer.ShapedCopy) (transfer.Op, error) {
	return x.e.SubmitShaped(region, c)
}

func (x blocksShaped) GatherShaped(region transfer.Desc, c transfer.ShapedCopy) (transfer.Op, error) {
	return x.e.SubmitShaped(region, c)
}

// Gather checks region and runs against the registry (CUDA memory of the
// stage's device or pinned, device-mapped host memory) and launches one
// kernel for all runs. A full pool is transfer.ErrBusy; bad runs are
// transfer.ErrOutOfBounds, ErrNotRegistered or ErrUnsupported, and nothing
// moves. The returned Op must be released once terminal.
func (x *Gatherer) Gather(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	return x.e.Submit(region, runs)
}

// Launched counts the operations launched in each form (gpucopy.Launched):
// a block-table chunk that reached GatherBlocks counts in Blocks.
func (x *Gatherer) Launched() gpucopy.Launched { return x.e.Launched() }

// MemoryKinds reports host (pinned) and CUDA memory.
func (x *Gatherer) MemoryKinds() []transfer.MemKind { return x.e.MemoryKinds() }

// Reachable returns the registered range holding d and nil when the stage
// can read it, or why not: host memory must be pinned for the device
// (route auto asks before it picks the bounce route).
func (x *Gatherer) Reachable(d transfer.Desc) (transfer.Desc, error) { return x.e.Reachable(d) }

// Idle returns the number of copy contexts free right now.
func (x *Gatherer) Idle() int { return x.e.Idle() }

// Close waits for launched copies (bounded) and frees the pool. It is
// idempotent.
func (x *Gatherer) Close() error { return x.e.Close() }
