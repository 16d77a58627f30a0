package kernels

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/transfer"
)

// Compact kernels: tables of CompactSize-byte pieces (copy.cu's struct
// Compact), for runs that are one contiguous copy each.
const (
	GatherCompactKernel  = "bounce_gather_compact"
	ScatterCompactKernel = "bounce_scatter_compact"
	// CompactSize is the encoded size of one compact piece: its address,
	// then its region offset shifted left 16 bits or'ed with its length.
	CompactSize = 16
	// MaxCompactRegion bounds the region offsets a compact piece holds.
	MaxCompactRegion = 1 << 48
)

// CompactPiece is one entry of a compact table, laid out as copy.cu's
// struct Compact on a little-endian host.
type CompactPiece struct {
	Addr   uint64
	OffLen uint64 // region offset << 16 | length
}

// Compactable reports whether r becomes compact pieces: one copy, or
// copies contiguous on both sides (any run moving nothing too).
func Compactable(r transfer.Run) bool {
	return r.Len == 0 || r.Count <= 1 || (r.RegionStride == r.Len && r.AddrStride == r.Len)
}

// AppendCompact appends r's pieces (r Compactable, its region bytes below
// MaxCompactRegion, max at most 65535) to dst: exactly PieceCount(r, max)
// of them, moving the bytes AppendPieces's would.
func AppendCompact(dst []CompactPiece, r transfer.Run, max uint64) []CompactPiece {
	if r.Len == 0 || r.Count == 0 {
		return dst
	}
	off, addr, n := r.RegionOff, r.Addr, r.Len*r.Count
	for n > 0 {
		l := min(n, max)
		dst = append(dst, CompactPiece{Addr: addr, OffLen: off<<16 | l})
		off, addr, n = off+l, addr+l, n-l
	}
	return dst
}

// ViewCompact is View for compact tables: buf as a zero-length slice of
// compact pieces with room for len(buf)/CompactSize, or nil on a
// big-endian host or for a buffer not 8-byte aligned.
func ViewCompact(buf []byte) []CompactPiece {
	n := len(buf) / CompactSize
	if n == 0 || binary.NativeEndian.Uint16([]byte{1, 0}) != 1 || uintptr(unsafe.Pointer(&buf[0]))%8 != 0 {
		return nil
	}
	return unsafe.Slice((*CompactPiece)(unsafe.Pointer(&buf[0])), n)[:0]
}

// CompactMax is the piece size compact tables are cut at: PieceBytes
// (within a compact length's 16 bits).
const CompactMax = PieceBytes

var _ [math.MaxUint16 - CompactMax]struct{}

// loadCompact resolves the compact kernels where the module has them.
func (m *Module) loadCompact(ptx []byte) error {
	if !bytes.Contains(ptx, []byte(".entry "+GatherCompactKernel+"(")) {
		return nil
	}
	var err error
	if m.gatherCompact, err = m.mod.Function(GatherCompactKernel); err == nil {
		m.scatterCompact, err = m.mod.Function(ScatterCompactKernel)
	}
	return err
}

// HasCompact reports whether the module holds the compact kernels.
func (m *Module) HasCompact() bool { return m.gatherCompact != nil }

// LaunchCompact queues one gather (or scatter) of the n compact pieces at
// table (a device address) between the region at device address region
// and the pieces' addresses, one warp per piece.
func (m *Module) LaunchCompact(gather bool, s *cuda.Stream, args *cuda.Args, region, table cuda.DevicePtr, n uint64) error {
	if m.gatherCompact == nil {
		return fmt.Errorf("kernels: the module has no compact kernels")
	}
	if n == 0 {
		return nil
	}
	f := m.scatterCompact
	if gather {
		f = m.gatherCompact
	}
	args.SetU64(0, uint64(region))
	args.SetU64(1, uint64(table))
	args.SetU64(2, n)
	return f.Launch(s, cuda.Dim3{X: Grid(n, math.MaxInt32), Y: 1, Z: 1}, cuda.Dim3{X: BlockThreads, Y: 1, Z: 1}, 0, args)
}
