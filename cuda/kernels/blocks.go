package kernels

import (
	"bytes"
	"fmt"
	"math/bits"

	"github.com/bouncekv/bounce/cuda"
)

// BlockFamily names one of the block-form kernels.
type BlockFamily uint8

const (
	// BlockGeneral: any length and alignment; one warp per 4 KiB of a
	// piece.
	BlockGeneral BlockFamily = iota
	// BlockVector: 16-byte-aligned pieces of a power of two from 128 bytes
	// to 4 KiB, or a multiple of 4 KiB; one warp per 4 KiB slab of the
	// region, eight uint4 loads in flight per lane.
	BlockVector
	// BlockBulk: BlockVector's conditions, each slab moved global ->
	// shared -> global by Hopper bulk copies (cp.async.bulk); compute_90
	// module only.
	BlockBulk
	// BlockBulk2: BlockBulk persistent and double-buffered: one wave of
	// blocks of four warps, each warp taking slabs grid-stride with the
	// next slab's loads in flight while it stores the current one.
	BlockBulk2
	blockFamilies
)

// String names the family for benchmarks.
func (f BlockFamily) String() string {
	switch f {
	case BlockGeneral:
		return "general"
	case BlockVector:
		return "vector"
	case BlockBulk:
		return "bulk"
	case BlockBulk2:
		return "bulk2"
	}
	return fmt.Sprintf("family(%d)", uint8(f))
}

var blockKernels = [blockFamilies][2]string{
	BlockGeneral: {GatherBlocksKernel, ScatterBlocksKernel},
	BlockVector:  {GatherBlocksVecKernel, ScatterBlocksVecKernel},
	BlockBulk:    {GatherBlocksBulkKernel, ScatterBlocksBulkKernel},
	BlockBulk2:   {GatherBlocksBulk2Kernel, ScatterBlocksBulk2Kernel},
}

// bulk2Threads is BlockBulk2's block size.
const bulk2Threads = 128

// maxParams is the most parameters a kernel takes: the shaped kernels'
// (copy.cu's SHAPED_PARAMS; BLOCK_PARAMS has 12).
const maxParams = 16

// SlabBytes is what one warp of the vector and bulk block kernels moves:
// 4 KiB of the region.
const SlabBytes = 4096

// kernelSet is one form's kernels: fn[f][0] gathers and fn[f][1]
// scatters for each BlockFamily f the module holds (nil where it has
// none), and BlockBulk2's wave (its blocks resident at once).
type kernelSet struct {
	fn        [blockFamilies][2]*cuda.Function
	bulk2Wave int
}

// load resolves the kernels of names the module holds and BlockBulk2's
// wave (sms multiprocessors).
func (k *kernelSet) load(mod *cuda.Module, ptx []byte, names [blockFamilies][2]string, sms int) error {
	for f, pair := range names {
		if !bytes.Contains(ptx, []byte(".entry "+pair[0]+"(")) {
			continue
		}
		for d, name := range pair {
			fn, err := mod.Function(name)
			if err != nil {
				return err
			}
			k.fn[f][d] = fn
		}
	}
	if k.fn[BlockBulk2][0] != nil {
		per, err := k.fn[BlockBulk2][0].ActiveBlocks(bulk2Threads)
		if err != nil {
			return err
		}
		k.bulk2Wave = sms * max(per, 1)
	}
	return nil
}

// has reports whether the set holds family f.
func (k *kernelSet) has(f BlockFamily) bool {
	return f < blockFamilies && k.fn[f][0] != nil
}

// launch queues family f's gather or scatter over warps warps of work on
// s with args: the grid and block size each family takes.
func (k *kernelSet) launch(gather bool, f BlockFamily, s *cuda.Stream, args *cuda.Args, warps uint64) error {
	d := 1
	if gather {
		d = 0
	}
	grid := Grid(warps, maxBlockGrid)
	threads := uint32(BlockThreads)
	if f == BlockBulk2 {
		threads = bulk2Threads
		grid = uint32(max(1, min((warps+3)/4, uint64(k.bulk2Wave))))
	}
	return k.fn[f][d].Launch(s, cuda.Dim3{X: grid, Y: 1, Z: 1}, cuda.Dim3{X: threads, Y: 1, Z: 1}, 0, args)
}

// HasBlocks reports whether the module holds block family f.
func (m *Module) HasBlocks(f BlockFamily) bool { return m.blocks.has(f) }

// BlockJob is one block-form launch: pieces k in [0, Count) of a chunk,
// piece k being Len bytes at Region + k*Len on the region side and at
// base(r) + IDs[k mod NIDs]*Stride on the pool side, with r = (Off0 + k) /
// NIDs indexing Bases. Region, Bases and IDs are device addresses (device
// memory or the device mapping of pinned host memory): Bases holds one
// uint64 per pool region the chunk touches, IDs the window of NIDs
// uint32 ids starting at the chunk's first (at most NIDs of them, fewer
// when Count < NIDs). When Done is not 0 the kernel stores Seq there
// (pinned host memory) once every byte is written, counting finished
// blocks in the uint32 at Counter (device memory, 0 between launches).
type BlockJob struct {
	Region, Bases, IDs     cuda.DevicePtr
	NIDs, Off0, Count, Len uint64
	Stride                 uint64
	Done, Counter          cuda.DevicePtr
	Seq                    uint32
}

// VectorShift reports whether pieces of len bytes at 16-byte-aligned
// addresses fit the vector and bulk kernels, and the shift they take:
// log2(len) for a power of two from 128 to 4096, 12 for a multiple of
// 4096.
func VectorShift(len uint64) (uint32, bool) {
	switch {
	case len >= SlabBytes && len%SlabBytes == 0:
		return 12, true
	case len >= 128 && len <= SlabBytes && len&(len-1) == 0:
		return uint32(bits.TrailingZeros64(len)), true
	}
	return 0, false
}

// Aligned16 reports whether every address is a multiple of 16.
func Aligned16(xs ...uint64) bool {
	var or uint64
	for _, x := range xs {
		or |= x
	}
	return or&15 == 0
}

// BlockFamilyFor returns the fastest family the module holds for a job
// whose pieces are vector-eligible (vec) or not: the measured order is
// docs/BENCHMARKS.md's (issue 24).
func (m *Module) BlockFamilyFor(vec bool) BlockFamily {
	if !vec {
		return BlockGeneral
	}
	for _, f := range preferredBlockFamilies {
		if m.HasBlocks(f) {
			return f
		}
	}
	return BlockGeneral
}

// preferredBlockFamilies is the order BlockFamilyFor tries for aligned
// pieces: bulk is within a few percent of the best family in every shape
// measured on the H200 (4 KiB, 2 KiB, 512 B; 16,384 to 131,072 pieces),
// bulk2 loses 3-4% at 81,920 × 4 KiB, vector up to 20% at 2 KiB and
// 512 B (docs/bench/device/issue24).
var preferredBlockFamilies = [...]BlockFamily{BlockBulk, BlockBulk2, BlockVector}

// LaunchBlocks queues job on s with family f (which the module must hold
// and whose conditions job must meet: the caller checks VectorShift and
// alignment), args as its parameter block (from NewArgs).
func (m *Module) LaunchBlocks(gather bool, f BlockFamily, s *cuda.Stream, args *cuda.Args, job BlockJob) error {
	if !m.HasBlocks(f) {
		return fmt.Errorf("kernels: the module has no %s block kernels", f)
	}
	if job.Count == 0 || job.NIDs == 0 || job.Len == 0 {
		return fmt.Errorf("kernels: empty block job (%d pieces, %d ids, %d bytes a piece)", job.Count, job.NIDs, job.Len)
	}
	var sh uint32
	var warps uint64
	if f == BlockGeneral {
		warps = job.Count * ((job.Len + SlabBytes - 1) / SlabBytes)
	} else {
		var ok bool
		if sh, ok = VectorShift(job.Len); !ok {
			return fmt.Errorf("kernels: %d-byte pieces do not fit the %s block kernels", job.Len, f)
		}
		warps = (job.Count*job.Len + SlabBytes - 1) / SlabBytes
	}
	args.SetU64(0, uint64(job.Region))
	args.SetU64(1, uint64(job.Bases))
	args.SetU64(2, uint64(job.IDs))
	args.SetU64(3, job.NIDs)
	args.SetU64(4, job.Off0)
	args.SetU64(5, job.Count)
	args.SetU64(6, job.Len)
	args.SetU64(7, job.Stride)
	args.SetU64(8, uint64(job.Done))
	args.SetU64(9, uint64(job.Counter))
	args.SetU32(10, job.Seq)
	args.SetU32(11, sh)
	return m.blocks.launch(gather, f, s, args, warps)
}

// maxBlockGrid caps a block launch's grid; more work is taken
// grid-stride.
const maxBlockGrid = 1 << 20
