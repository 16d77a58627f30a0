package wire

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/bouncekv/bounce/transfer"
)

// Limits of the block-table form.
const (
	// MaxBlockIDs is the most destination block ids one WANT may carry.
	MaxBlockIDs = 1 << 24
	// MaxPools is the most pools one agent descriptor may carry.
	MaxPools = 256
	// MaxPoolName is the longest pool name in bytes (an agent name's).
	MaxPoolName = transfer.MaxNameLen
)

// CheckPoolName reports why name cannot name a pool: the agent-name rule
// (transfer.CheckName: 1 to MaxPoolName bytes of UTF-8 without control
// characters, so a name prints safely in logs and errors).
func CheckPoolName(name string) error {
	if err := transfer.CheckName(name); err != nil {
		return fmt.Errorf("pool %w", err)
	}
	return nil
}

// PoolDesc is one pool an agent advertises in its descriptor: its name and
// geometry (transfer.Pool), so a peer can address its blocks by id.
type PoolDesc struct {
	Name string
	Pool transfer.Pool
	// Layout, when set, says what the pool's bytes mean as KV cache
	// (transfer.Layout); it must describe Pool.
	Layout *transfer.Layout
}

// validate reports why p cannot be carried.
func (p *PoolDesc) validate(what string) error {
	if err := CheckPoolName(p.Name); err != nil {
		return errorf(what, ErrMalformed, "%v", err)
	}
	if err := p.Pool.Validate(); err != nil {
		return errorf(what, ErrMalformed, "pool %q: %v", p.Name, err)
	}
	if why := p.checkLayout(); why != "" {
		return errorf(what, ErrMalformed, "%s", why)
	}
	return nil
}

// poolFixed is a pool's encoded size without its name, regions and layout:
// kind u8, device i32, block_len, stride, blocks u64, the region count u32
// and the has-layout byte.
const poolFixed = 1 + 4 + 3*8 + 4 + 1

func poolLen(p *PoolDesc) int {
	return strPrefix + len(p.Name) + poolFixed - 1 + 8*len(p.Pool.Regions) + layoutEncLen(p.Layout)
}

func appendPool(b []byte, p *PoolDesc) []byte {
	b = appendStr(b, p.Name)
	b = append(b, byte(p.Pool.Kind))
	b = le.AppendUint32(b, uint32(p.Pool.Device))
	b = le.AppendUint64(b, p.Pool.BlockLen)
	b = le.AppendUint64(b, p.Pool.Stride)
	b = le.AppendUint64(b, p.Pool.Blocks)
	n := min(len(p.Pool.Regions), math.MaxUint32)
	b = le.AppendUint32(b, uint32(n))
	for _, r := range p.Pool.Regions[:n] {
		b = le.AppendUint64(b, r)
	}
	return appendLayout(b, p.Layout)
}

func (d *decoder) pool(i int) (PoolDesc, bool) {
	var p PoolDesc
	p.Name = d.str(fmt.Sprintf("pools[%d] name", i))
	p.Pool.Kind = transfer.MemKind(d.u8("pool kind"))
	p.Pool.Device = int32(d.u32("pool device"))
	p.Pool.BlockLen = d.u64("pool block length")
	p.Pool.Stride = d.u64("pool stride")
	p.Pool.Blocks = d.u64("pool blocks")
	n := d.count("pool region count", transfer.MaxPoolRegions, 8)
	if d.err != nil {
		return p, false
	}
	p.Pool.Regions = make([]uint64, n)
	for k := range p.Pool.Regions {
		p.Pool.Regions[k] = le.Uint64(d.b[d.off+8*k:])
	}
	d.off += 8 * n
	p.Layout = d.layout()
	if d.err != nil {
		return p, false
	}
	if err := p.validate(d.what); err != nil {
		d.err = err
		return p, false
	}
	return p, true
}

// WantBlocks is the block-table form of a WANT: the request writes pieces of
// the receiver's pool Pool, numbered region-major over IDs as in
// transfer.Blocks (piece q is region q/len(IDs) of block IDs[q%len(IDs)]).
// It is sent once per request; each DATA then names a piece range. Pieces is
// the request's piece count (regions × ids) and BlockLen the bytes of one
// piece, which must equal the pool's. IDs holds 1 to MaxBlockIDs ids and
// Pieces is a positive multiple of len(IDs) of at most
// transfer.MaxPoolRegions regions; the receiver checks the ids against its
// pool (below its block count, no duplicates).
//
// With a Shape (a layout conversion, version 6) the request moves the
// shape's (region, group) units instead of whole pieces: Pieces counts
// units (regions × len(IDs)/Shape.Group), each DATA names a unit range, and
// unit q writes Shape's segments of group q % groups of region q / groups
// (transfer.ShapedCopy). The shape must be valid for BlockLen, its segments
// disjoint, and the ids whole groups.
type WantBlocks struct {
	Pool     string
	BlockLen uint64
	Pieces   uint64
	IDs      []uint32
	Shape    *transfer.Shape
}

// Regions is the number of pool regions the request covers.
func (w *WantBlocks) Regions() uint64 {
	if w.Shape != nil {
		return w.Pieces / (uint64(len(w.IDs)) / uint64(w.Shape.Group))
	}
	return w.Pieces / uint64(len(w.IDs))
}

func (w *WantBlocks) check() string {
	switch err := CheckPoolName(w.Pool); {
	case err != nil:
		return err.Error()
	case w.BlockLen == 0:
		return "block length 0"
	case len(w.IDs) == 0:
		return "no block ids"
	case w.Shape != nil:
		return w.checkShape()
	case w.Pieces == 0 || w.Pieces%uint64(len(w.IDs)) != 0:
		return fmt.Sprintf("%d pieces is not a positive multiple of %d ids", w.Pieces, len(w.IDs))
	case w.Pieces/uint64(len(w.IDs)) > transfer.MaxPoolRegions:
		return fmt.Sprintf("%d pieces over %d ids is more than %d regions", w.Pieces, len(w.IDs), transfer.MaxPoolRegions)
	}
	if hi, _ := bits.Mul64(w.Pieces, w.BlockLen); hi != 0 {
		return fmt.Sprintf("%d pieces of %d bytes overflow", w.Pieces, w.BlockLen)
	}
	return ""
}

// wantBlocksLen is the encoded size of w after the form byte.
func wantBlocksLen(w *WantBlocks) int {
	n := strPrefix + len(w.Pool) + 8 + 8 + 4 + 4*len(w.IDs)
	if w.Shape != nil {
		n += shapeLen(w.Shape)
	}
	return n
}

func appendWantBlocks(b []byte, w *WantBlocks) []byte {
	b = appendStr(b, w.Pool)
	b = le.AppendUint64(b, w.BlockLen)
	b = le.AppendUint64(b, w.Pieces)
	b = le.AppendUint32(b, uint32(len(w.IDs)))
	for _, id := range w.IDs {
		b = le.AppendUint32(b, id)
	}
	if w.Shape != nil {
		b = appendShape(b, w.Shape)
	}
	return b
}

func (d *decoder) wantBlocks(shaped bool) *WantBlocks {
	w := &WantBlocks{Pool: d.str("pool")}
	w.BlockLen = d.u64("block length")
	w.Pieces = d.u64("pieces")
	n := d.count("block id count", MaxBlockIDs, 4)
	if d.err != nil {
		return nil
	}
	w.IDs = make([]uint32, n)
	for i := range w.IDs {
		w.IDs[i] = le.Uint32(d.b[d.off+4*i:])
	}
	d.off += 4 * n
	if shaped {
		if w.Shape = d.shape(); d.err != nil {
			return nil
		}
	}
	if why := w.check(); why != "" {
		d.err = errorf(d.what, ErrMalformed, "blocks: %s", why)
		return nil
	}
	return w
}

// PieceRange is the block-table form of a DATA: pieces [First, First+Count)
// of the request's WANT, packed back to back in the region from offset 0.
// Count is positive and First+Count does not overflow.
type PieceRange struct {
	First, Count uint64
}

func (p PieceRange) check() string {
	if p.Count == 0 {
		return "piece count 0"
	}
	if p.First > math.MaxUint64-p.Count {
		return fmt.Sprintf("pieces [%d, +%d) overflow", p.First, p.Count)
	}
	return ""
}

// Wire form bytes.
const (
	formDescs  = 0
	formBlocks = 1
)
