// Package kernels holds the bounce gather and scatter kernels as PTX
// (copy.ptx for compute_80 and copy_sm90.ptx for compute_90, compiled from
// copy.cu by `make ptx` and committed, so builds need no CUDA toolkit) and
// the host side that feeds them: the piece tables a chunk's runs are cut
// into (full and compact; pure Go, tested without a GPU), the block-form
// jobs that need no table (blocks.go), and the launches.
package kernels

import (
	"bytes"
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"unsafe"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/transfer"
)

// PTX is the compiled kernel module (compute_80).
//
//go:embed copy.ptx
var PTX []byte

// PTX90 is the same source compiled for compute_90: it adds the Hopper
// bulk-copy block kernels. Load takes it on devices of compute capability
// 9.0 and later when it is not empty.
//
//go:embed copy_sm90.ptx
var PTX90 []byte

// Kernel names in the module. The wide kernels are optional (a module
// without them launches the general ones for every table).
const (
	GatherKernel      = "bounce_gather"
	ScatterKernel     = "bounce_scatter"
	GatherWideKernel  = "bounce_gather_wide"
	ScatterWideKernel = "bounce_scatter_wide"
	// Block-form kernels (optional: a module without them has no block
	// form): general, vector, bulk and persistent bulk (the
	// compute_90 module only).
	GatherBlocksKernel       = "bounce_gather_blocks"
	ScatterBlocksKernel      = "bounce_scatter_blocks"
	GatherBlocksVecKernel    = "bounce_gather_blocks_vec"
	ScatterBlocksVecKernel   = "bounce_scatter_blocks_vec"
	GatherBlocksBulkKernel   = "bounce_gather_blocks_bulk"
	ScatterBlocksBulkKernel  = "bounce_scatter_blocks_bulk"
	GatherBlocksBulk2Kernel  = "bounce_gather_blocks_bulk2"
	ScatterBlocksBulk2Kernel = "bounce_scatter_blocks_bulk2"
)

// WideMinBytes is the average piece size from which Launch takes the wide
// kernels, one warp per piece: tables of 4 KiB KV blocks go there (0.86
// and 0.94 of one contiguous copy at 16,384 and 81,920 blocks, against
// 0.85 and 0.90 on the general kernels, docs/BENCHMARKS.md); smaller
// pieces stay on the general kernels, faster there (2 KiB: 0.81 against
// 0.74; 512 B: 0.78 against 0.30).
const WideMinBytes = 4 << 10

// PieceBytes is the most bytes one piece moves: the unit one warp copies
// before it takes the next piece. Small enough that a chunk of a few MiB
// spreads over thousands of warps, large enough that the table stays a
// few percent of the bytes.
const PieceBytes = 8 << 10

// PieceSize is the encoded size of one piece: six little-endian uint64s
// (region offset, address, length, count, region stride, address stride),
// the layout of copy.cu's struct Piece.
const PieceSize = 48

// A transfer.Run is the kernel's Piece in memory (View relies on it).
var (
	_ [PieceSize - unsafe.Sizeof(transfer.Run{})]struct{}
	_ [unsafe.Sizeof(transfer.Run{}) - PieceSize]struct{}
	_ [unsafe.Offsetof(transfer.Run{}.AddrStride) - 40]struct{}
	_ [40 - unsafe.Offsetof(transfer.Run{}.AddrStride)]struct{}
)

// Pieces cuts runs into pieces of at most max bytes (max > 0) and appends
// them to dst. A run whose copies are contiguous on both sides (Count 1 or
// both strides equal to Len) becomes one copy cut into max-byte pieces; a
// strided run becomes groups of copies, at most max bytes a group, or each
// copy cut into pieces when one copy exceeds max. Runs that move nothing
// are dropped. The result moves exactly the bytes of runs. Callers
// validate runs first (no overflow: hostcopy-style checks).
func Pieces(dst []transfer.Run, runs []transfer.Run, max uint64) []transfer.Run {
	for _, r := range runs {
		dst = AppendPieces(dst, r, max)
	}
	return dst
}

// AppendPieces appends the pieces of one run (see Pieces) to dst; exactly
// PieceCount(r, max) of them.
func AppendPieces(dst []transfer.Run, r transfer.Run, max uint64) []transfer.Run {
	if r.Len == 0 || r.Count == 0 {
		return dst
	}
	if r.Count == 1 || (r.RegionStride == r.Len && r.AddrStride == r.Len) {
		if n := r.Len * r.Count; n <= max {
			return append(dst, transfer.Run{RegionOff: r.RegionOff, Addr: r.Addr, Len: n, Count: 1, RegionStride: n, AddrStride: n})
		}
		return cut(dst, r.RegionOff, r.Addr, r.Len*r.Count, max)
	}
	if r.Len >= max {
		for k := range r.Count {
			dst = cut(dst, r.RegionOff+k*r.RegionStride, r.Addr+k*r.AddrStride, r.Len, max)
		}
		return dst
	}
	g := max / r.Len
	for k := uint64(0); k < r.Count; k += g {
		n := min(g, r.Count-k)
		dst = append(dst, transfer.Run{
			RegionOff: r.RegionOff + k*r.RegionStride, Addr: r.Addr + k*r.AddrStride,
			Len: r.Len, Count: n, RegionStride: r.RegionStride, AddrStride: r.AddrStride,
		})
	}
	return dst
}

// PieceCount returns how many pieces AppendPieces makes of r.
func PieceCount(r transfer.Run, max uint64) uint64 {
	switch {
	case r.Len == 0 || r.Count == 0:
		return 0
	case r.Count == 1 || (r.RegionStride == r.Len && r.AddrStride == r.Len):
		return ceilDiv(r.Len*r.Count, max)
	case r.Len >= max:
		return r.Count * ceilDiv(r.Len, max)
	default:
		return ceilDiv(r.Count, max/r.Len)
	}
}

func ceilDiv(a, b uint64) uint64 { return a/b + min(a%b, 1) }

// View returns buf, pinned table memory, as a zero-length slice of pieces
// with room for len(buf)/PieceSize of them: on a little-endian host a
// transfer.Run is laid out as the kernel's Piece, so pieces appended to
// the view within its capacity are the encoded table (no Encode pass). It
// returns nil on a big-endian host or for a buffer not 8-byte aligned:
// use Encode there.
func View(buf []byte) []transfer.Run {
	n := len(buf) / PieceSize
	if n == 0 || binary.NativeEndian.Uint16([]byte{1, 0}) != 1 || uintptr(unsafe.Pointer(&buf[0]))%8 != 0 {
		return nil
	}
	return unsafe.Slice((*transfer.Run)(unsafe.Pointer(&buf[0])), n)[:0]
}

func cut(dst []transfer.Run, off, addr, n, max uint64) []transfer.Run {
	for n > 0 {
		l := min(n, max)
		dst = append(dst, transfer.Run{RegionOff: off, Addr: addr, Len: l, Count: 1, RegionStride: l, AddrStride: l})
		off, addr, n = off+l, addr+l, n-l
	}
	return dst
}

// Encode writes pieces into buf in the kernel's layout; buf must hold
// len(pieces)*PieceSize bytes.
func Encode(buf []byte, pieces []transfer.Run) error {
	if hi, lo := bits.Mul64(uint64(len(pieces)), PieceSize); hi != 0 || lo > uint64(len(buf)) {
		return fmt.Errorf("kernels: %d pieces need %d bytes, buffer has %d", len(pieces), uint64(len(pieces))*PieceSize, len(buf))
	}
	for i, p := range pieces {
		b := buf[i*PieceSize:]
		binary.LittleEndian.PutUint64(b[0:], p.RegionOff)
		binary.LittleEndian.PutUint64(b[8:], p.Addr)
		binary.LittleEndian.PutUint64(b[16:], p.Len)
		binary.LittleEndian.PutUint64(b[24:], p.Count)
		binary.LittleEndian.PutUint64(b[32:], p.RegionStride)
		binary.LittleEndian.PutUint64(b[40:], p.AddrStride)
	}
	return nil
}

// BlockThreads is the launch's block size: eight warps.
const BlockThreads = 256

// Grid returns the number of blocks for n pieces when the device holds
// wave blocks at once: one warp per piece, at most one wave (more pieces
// are taken grid-stride, so no block waits for a second wave).
func Grid(n uint64, wave int) uint32 {
	warps := uint64(BlockThreads / 32)
	blocks := (n + warps - 1) / warps
	return uint32(max(1, min(blocks, uint64(max(wave, 1)))))
}

// Module is the kernel module loaded in one context.
type Module struct {
	mod     *cuda.Module
	gather  *cuda.Function
	scatter *cuda.Function
	wave    int // blocks resident at once on the whole device
	// The wide kernels and their wave; nil when the module has none.
	gatherWide, scatterWide *cuda.Function
	waveWide                int
	// The compact kernels; nil when the module has none.
	gatherCompact, scatterCompact *cuda.Function
	// The block-form and shaped kernels the module holds.
	blocks, shaped kernelSet
}

// Load JIT-compiles ptx in c; nil takes the embedded module for the
// device (PTX90 from compute capability 9.0 where it is not empty, else
// PTX).
func Load(c *cuda.Context, ptx []byte) (*Module, error) {
	if ptx == nil {
		ptx = PTX
		major, err := c.Attribute(cuda.AttrComputeCapabilityMajor)
		if err != nil {
			return nil, err
		}
		if major >= 9 && len(PTX90) > 0 {
			ptx = PTX90
		}
	}
	sms, err := c.Attribute(cuda.AttrMultiprocessorCount)
	if err != nil {
		return nil, err
	}
	mod, err := c.LoadPTX(ptx)
	if err != nil {
		return nil, fmt.Errorf("kernels: load module: %w", err)
	}
	m := &Module{mod: mod}
	if m.gather, err = mod.Function(GatherKernel); err == nil {
		m.scatter, err = mod.Function(ScatterKernel)
	}
	var per int
	if err == nil {
		per, err = m.gather.ActiveBlocks(BlockThreads)
	}
	if err != nil {
		_ = mod.Unload()
		return nil, err
	}
	m.wave = sms * max(per, 1)
	if bytes.Contains(ptx, []byte(".entry "+GatherWideKernel+"(")) {
		if m.gatherWide, err = mod.Function(GatherWideKernel); err == nil {
			m.scatterWide, err = mod.Function(ScatterWideKernel)
		}
		if err == nil {
			per, err = m.gatherWide.ActiveBlocks(BlockThreads)
		}
		if err != nil {
			_ = mod.Unload()
			return nil, err
		}
		m.waveWide = sms * max(per, 1)
	}
	if err := m.loadCompact(ptx); err != nil {
		_ = mod.Unload()
		return nil, err
	}
	if err := m.blocks.load(mod, ptx, blockKernels, sms); err != nil {
		_ = mod.Unload()
		return nil, err
	}
	if err := m.shaped.load(mod, ptx, shapedKernels, sms); err != nil {
		_ = mod.Unload()
		return nil, err
	}
	return m, nil
}

// HasWide reports whether the module holds the wide kernels.
func (m *Module) HasWide() bool { return m.gatherWide != nil }

// NewArgs allocates the parameter block of one launch slot (room for the
// block kernels' parameters, the most any kernel takes).
func NewArgs(c *cuda.Context) (*cuda.Args, error) { return c.NewArgs(maxParams) }

// Launch queues one gather (or scatter, when !gather) of n pieces at table
// (a device address: device memory, or the device mapping of pinned host
// memory) between the region at device address region and the pieces'
// addresses, on s, with args as its parameter block. bytes is what the
// pieces move in all: from WideMinBytes a piece on average, the wide
// kernels run (where the module has them).
func (m *Module) Launch(gather bool, s *cuda.Stream, args *cuda.Args, region, table cuda.DevicePtr, n, bytes uint64) error {
	return m.LaunchAs(gather, m.Wide(n, bytes), s, args, region, table, n)
}

// Wide reports whether Launch takes the wide kernels for n pieces moving
// bytes.
func (m *Module) Wide(n, bytes uint64) bool {
	return m.gatherWide != nil && n > 0 && bytes/n >= WideMinBytes
}

// LaunchAs is Launch with the kernel family named: wide (which the module
// must hold; one warp per piece, a block per eight pieces) or general (one
// wave of resident blocks taking pieces grid-stride). Benchmarks compare
// the two with it.
func (m *Module) LaunchAs(gather, wide bool, s *cuda.Stream, args *cuda.Args, region, table cuda.DevicePtr, n uint64) error {
	return m.launch(gather, wide, wide, s, args, region, table, n)
}

// launch is LaunchAs; full launches one warp per piece instead of one wave
// of resident blocks taking pieces grid-stride (measured faster for the
// wide kernels).
func (m *Module) launch(gather, wide, full bool, s *cuda.Stream, args *cuda.Args, region, table cuda.DevicePtr, n uint64) error {
	if n == 0 {
		return nil
	}
	f, wave := m.scatter, m.wave
	if gather {
		f = m.gather
	}
	if wide {
		if m.gatherWide == nil {
			return fmt.Errorf("kernels: the module has no wide kernels")
		}
		f, wave = m.scatterWide, m.waveWide
		if gather {
			f = m.gatherWide
		}
	}
	args.SetU64(0, uint64(region))
	args.SetU64(1, uint64(table))
	args.SetU64(2, n)
	grid := Grid(n, wave)
	if full {
		grid = Grid(n, math.MaxInt32)
	}
	return f.Launch(s, cuda.Dim3{X: grid, Y: 1, Z: 1}, cuda.Dim3{X: BlockThreads, Y: 1, Z: 1}, 0, args)
}

// Wave returns the blocks the device holds at once (the launch's largest
// grid).
func (m *Module) Wave() int { return m.wave }

// Unload unloads the module.
func (m *Module) Unload() error { return m.mod.Unload() }
