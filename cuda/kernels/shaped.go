package kernels

import (
	"encoding/binary"
	"fmt"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/transfer"
)

// Shaped block-form kernels (transfer.ShapedCopy), one pair per
// BlockFamily: general (any segment lengths and alignment, one warp per
// segment of a unit), vector, bulk and bulk2 (uniform segments of a
// VectorShift length, everything 16-byte aligned: the block kernels' slab
// loops with a segment standing for a piece).
const (
	GatherShapedKernel       = "bounce_gather_shaped"
	ScatterShapedKernel      = "bounce_scatter_shaped"
	GatherShapedVecKernel    = "bounce_gather_shaped_vec"
	ScatterShapedVecKernel   = "bounce_scatter_shaped_vec"
	GatherShapedBulkKernel   = "bounce_gather_shaped_bulk"
	ScatterShapedBulkKernel  = "bounce_scatter_shaped_bulk"
	GatherShapedBulk2Kernel  = "bounce_gather_shaped_bulk2"
	ScatterShapedBulk2Kernel = "bounce_scatter_shaped_bulk2"
)

var shapedKernels = [blockFamilies][2]string{
	BlockGeneral: {GatherShapedKernel, ScatterShapedKernel},
	BlockVector:  {GatherShapedVecKernel, ScatterShapedVecKernel},
	BlockBulk:    {GatherShapedBulkKernel, ScatterShapedBulkKernel},
	BlockBulk2:   {GatherShapedBulk2Kernel, ScatterShapedBulk2Kernel},
}

// SegmentSize is the encoded size of one segment (copy.cu's struct Seg):
// four little-endian uint32s, its block index in the group, its offset
// there, its length and its offset in the unit on the region side.
const SegmentSize = 16

// EncodeSegments appends segs in the kernel's layout to dst.
func EncodeSegments(dst []byte, segs []transfer.Segment) []byte {
	var roff uint32
	for _, s := range segs {
		dst = binary.LittleEndian.AppendUint32(dst, s.Block)
		dst = binary.LittleEndian.AppendUint32(dst, s.Off)
		dst = binary.LittleEndian.AppendUint32(dst, s.Len)
		dst = binary.LittleEndian.AppendUint32(dst, roff)
		roff += s.Len
	}
	return dst
}

// UniformLen returns the length every segment of segs has, or 0 when
// they differ (or there are none).
func UniformLen(segs []transfer.Segment) uint64 {
	if len(segs) == 0 {
		return 0
	}
	l := segs[0].Len
	for _, s := range segs[1:] {
		if s.Len != l {
			return 0
		}
	}
	return uint64(l)
}

// HasShaped reports whether the module holds shaped family f.
func (m *Module) HasShaped(f BlockFamily) bool { return m.shaped.has(f) }

// ShapedFamilyFor is BlockFamilyFor for the shaped kernels: the general
// family for segments off the vector conditions, else the first of the
// block order the module holds.
func (m *Module) ShapedFamilyFor(vec bool) BlockFamily {
	if !vec {
		return BlockGeneral
	}
	for _, f := range preferredBlockFamilies {
		if m.HasShaped(f) {
			return f
		}
	}
	return BlockGeneral
}

// ShapedJob is one shaped launch: units [0, Units) of a chunk, NSegs
// segments each (the table at Segs, EncodeSegments' layout, in device
// memory or device-mapped pinned memory), packed back to back from Region
// (UnitLen bytes a unit). Unit u is group (Off0 + u) mod Groups of pool
// region (Off0 + u) / Groups, indexing Bases (one uint64 per pool region
// the chunk touches); its Group ids lie at IDs + 4*Group*w, w the group's
// index from Off0 (wrapping), the window holding at most Groups groups.
// SegLen is the segments' common length for the vector families (0 for
// the general one). Done, Counter and Seq are BlockJob's.
type ShapedJob struct {
	Region, Bases, IDs, Segs cuda.DevicePtr
	Groups, Off0, Units      uint64
	NSegs, Group             uint32
	SegLen, UnitLen, Stride  uint64
	Done, Counter            cuda.DevicePtr
	Seq                      uint32
}

// LaunchShaped queues job on s with family f (which the module must hold
// and whose conditions the caller checked: for all but BlockGeneral a
// SegLen VectorShift takes and 16-byte alignment of every address and
// offset), args as its parameter block (from NewArgs).
func (m *Module) LaunchShaped(gather bool, f BlockFamily, s *cuda.Stream, args *cuda.Args, job ShapedJob) error {
	if !m.HasShaped(f) {
		return fmt.Errorf("kernels: the module has no %s shaped kernels", f)
	}
	if job.Units == 0 || job.NSegs == 0 || job.Groups == 0 || job.Group == 0 || job.UnitLen == 0 {
		return fmt.Errorf("kernels: empty shaped job (%d units, %d segments, %d groups of %d ids, %d bytes a unit)", job.Units, job.NSegs, job.Groups, job.Group, job.UnitLen)
	}
	items := job.Units * uint64(job.NSegs)
	var sh uint32
	warps := items
	if f != BlockGeneral {
		var ok bool
		if sh, ok = VectorShift(job.SegLen); !ok || job.SegLen*uint64(job.NSegs) != job.UnitLen {
			return fmt.Errorf("kernels: %d segments of %d bytes (units of %d) do not fit the %s shaped kernels", job.NSegs, job.SegLen, job.UnitLen, f)
		}
		warps = (items*job.SegLen + SlabBytes - 1) / SlabBytes
	}
	args.SetU64(0, uint64(job.Region))
	args.SetU64(1, uint64(job.Bases))
	args.SetU64(2, uint64(job.IDs))
	args.SetU64(3, uint64(job.Segs))
	args.SetU64(4, job.Groups)
	args.SetU64(5, job.Off0)
	args.SetU64(6, items)
	args.SetU64(7, job.SegLen)
	args.SetU64(8, job.Stride)
	args.SetU64(9, job.UnitLen)
	args.SetU32(10, job.Group)
	args.SetU32(11, job.NSegs)
	args.SetU64(12, uint64(job.Done))
	args.SetU64(13, uint64(job.Counter))
	args.SetU32(14, job.Seq)
	args.SetU32(15, sh)
	return m.shaped.launch(gather, f, s, args, warps)
}
