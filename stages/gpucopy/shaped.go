package gpucopy

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"unsafe"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/cuda/kernels"
	"github.com/bouncekv/bounce/transfer"
)

// maxSegTables bounds the segment tables an engine keeps on the device
// (one per distinct shape; a request's shapes are few). A shape past it
// has its table staged with each chunk's ids instead.
const maxSegTables = 64

// segTables caches the device copies of segment tables by their encoded
// content, so a shape's table is uploaded once.
type segTables struct {
	mu sync.Mutex
	m  map[string]cuda.DevicePtr
}

// segTable returns the device table of enc (kernels.EncodeSegments), uploading
// it the first time; 0 when the cache is full.
func (e *Engine) segTable(enc []byte) (cuda.DevicePtr, error) {
	t := &e.segs
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.m[string(enc)]; ok {
		return p, nil
	}
	if len(t.m) >= maxSegTables {
		return 0, nil
	}
	p, err := e.cc.MemAlloc(uint64(len(enc)))
	if err != nil {
		return 0, fmt.Errorf("segment table of %d bytes: %w", len(enc), err)
	}
	if err := e.cc.CopyHtoD(p, enc); err != nil {
		_ = e.cc.MemFree(p)
		return 0, fmt.Errorf("upload segment table: %w", err)
	}
	if t.m == nil {
		t.m = map[string]cuda.DevicePtr{}
	}
	t.m[string(enc)] = p
	return p, nil
}

// freeSegTables frees the cached tables (no kernel reads them any more).
func (e *Engine) freeSegTables() {
	t := &e.segs
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, p := range t.m {
		_ = e.cc.MemFree(p)
		delete(t.m, k)
	}
}

// HasShaped reports whether the engine's kernel module has the shaped
// block form (SubmitShaped is ErrUnsupported otherwise).
func (e *Engine) HasShaped() bool {
	return e.mod.HasShaped(kernels.BlockGeneral) && e.mod.HasBlocks(kernels.BlockGeneral)
}

// shapedJob is a checked shaped chunk ready to launch.
type shapedJob struct {
	job    kernels.ShapedJob
	family kernels.BlockFamily
	nr     uint64 // region bases at the buffer's start
	segAt  uint64 // offset of the staged segment table (0: cached)
	bytes  uint64 // of the buffer in use
}

// SubmitShaped is SubmitBlocks for a shaped chunk (transfer.ShapedCopy):
// one kernel computing each segment's address from (region base, stride,
// id, offset), the shape's segment table uploaded once per distinct
// shape. Its checks, all before any byte moves: the shape against the
// pool's blocks, the ids whole groups, the unit range within the table,
// the region bytes within region, every id of the groups the chunk
// touches below the pool's block count (one pass, fused with copying them
// into the context's pinned buffer) and, once per pool region touched,
// the span from the least id's first segment byte to the greatest id's
// last within one registered range of the pool's kind the device reaches.
// Completion is as SubmitBlocks'.
func (e *Engine) SubmitShaped(region transfer.Desc, sc transfer.ShapedCopy) (transfer.Op, error) {
	if !e.HasShaped() {
		return nil, fmt.Errorf("%s: the kernel module has no shaped block kernels: %w", e.name, transfer.ErrUnsupported)
	}
	return submit(e, "shaped: ", &e.launched.shaped,
		func(c *copyCtx) (shapedJob, error) { return e.buildShaped(c, region, sc) }, e.launchShaped)
}

// planShaped checks sc against a region of regionLen bytes without
// touching memory registration: planBlocks' checks over groups (the plan's
// window is m groups from group off0 of the n, wrapping; alloc gets m
// times the group ids) and the span [spanLo, spanHi) from each region base
// covering the least id's first segment byte to the greatest id's last.
func planShaped(regionLen uint64, sc transfer.ShapedCopy, alloc func(nr, m uint64) ([]uint32, error)) (blockPlan, error) {
	p := sc.Blocks.Pool
	ids := sc.Blocks.IDs
	switch {
	case len(p.Regions) == 0:
		return blockPlan{}, fmt.Errorf("pool has no regions: %w", transfer.ErrOutOfBounds)
	case p.BlockLen == 0 || p.Stride < p.BlockLen:
		return blockPlan{}, fmt.Errorf("pool blocks of %d bytes at stride %d: %w", p.BlockLen, p.Stride, transfer.ErrOutOfBounds)
	case p.Blocks == 0 || p.Blocks > transfer.MaxBlocks:
		return blockPlan{}, fmt.Errorf("pool of %d blocks: %w", p.Blocks, transfer.ErrOutOfBounds)
	case len(ids) == 0:
		return blockPlan{}, fmt.Errorf("block table has no ids: %w", transfer.ErrOutOfBounds)
	}
	if err := sc.Shape.Validate(p.BlockLen); err != nil {
		return blockPlan{}, wrapOOB(err)
	}
	grp := uint64(sc.Shape.Group)
	if uint64(len(ids))%grp != 0 {
		return blockPlan{}, fmt.Errorf("block table of %d ids is not whole groups of %d: %w", len(ids), grp, transfer.ErrOutOfBounds)
	}
	n := uint64(len(ids)) / grp
	units := sc.Units()
	if sc.First > units || sc.Count > units-sc.First {
		return blockPlan{}, fmt.Errorf("units [%d, +%d) pass the table's %d (%d regions x %d groups): %w", sc.First, sc.Count, units, len(p.Regions), n, transfer.ErrOutOfBounds)
	}
	ulen := sc.Shape.UnitLen()
	hi, nb := bits.Mul64(sc.Count, ulen)
	if hi != 0 || sc.RegionOff > regionLen || nb > regionLen-sc.RegionOff {
		return blockPlan{}, fmt.Errorf("%d units of %d bytes from region offset %d pass the region's %d bytes: %w", sc.Count, ulen, sc.RegionOff, regionLen, transfer.ErrOutOfBounds)
	}
	pl := blockPlan{n: n}
	if sc.Count == 0 {
		return pl, nil
	}
	pl.off0 = sc.First % n
	pl.m = min(sc.Count, n)
	pl.lo, pl.hi = sc.RegionsTouched()
	win, err := alloc(uint64(pl.hi-pl.lo), pl.m*grp)
	if err != nil {
		return blockPlan{}, err
	}
	win = win[:pl.m*grp]
	seg := ids[pl.off0*grp : min(n, pl.off0+pl.m)*grp]
	mn, mx := copyIDs(win[:len(seg)], seg)
	if rest := uint64(len(win) - len(seg)); rest > 0 {
		a, b := copyIDs(win[len(seg):], ids[:rest])
		mn, mx = min(mn, a), max(mx, b)
		// A chunk wrapping past a region's last group: ShapedCopy.Check
		// then holds the whole table to the pool, the ids between the
		// window's two ends too (the kernel reads none of them).
		for k, id := range ids[rest : pl.off0*grp] {
			if uint64(id) >= p.Blocks {
				return blockPlan{}, fmt.Errorf("block id %d (index %d) is not below the pool's %d blocks: %w", id, rest+uint64(k), p.Blocks, transfer.ErrOutOfBounds)
			}
		}
	}
	if uint64(mx) >= p.Blocks {
		for k, id := range win {
			if uint64(id) >= p.Blocks {
				return blockPlan{}, fmt.Errorf("block id %d (index %d) is not below the pool's %d blocks: %w", id, (pl.off0*grp+uint64(k))%uint64(len(ids)), p.Blocks, transfer.ErrOutOfBounds)
			}
		}
	}
	segLo, segHi := uint64(math.MaxUint64), uint64(0)
	for _, s := range sc.Shape.Segs {
		segLo = min(segLo, uint64(s.Off))
		segHi = max(segHi, uint64(s.Off)+uint64(s.Len))
	}
	sh, sl := bits.Mul64(uint64(mn), p.Stride)
	eh, el := bits.Mul64(uint64(mx), p.Stride)
	if sh != 0 || eh != 0 || el > math.MaxUint64-segHi {
		return blockPlan{}, fmt.Errorf("block %d at stride %d overflows: %w", mx, p.Stride, transfer.ErrOutOfBounds)
	}
	pl.spanLo, pl.spanHi = sl+segLo, el+segHi
	for r := pl.lo; r < pl.hi; r++ {
		if p.Regions[r] > math.MaxUint64-pl.spanHi {
			return blockPlan{}, fmt.Errorf("pool region %d at %#x: segments overflow the address space: %w", r, p.Regions[r], transfer.ErrOutOfBounds)
		}
	}
	return pl, nil
}

// wrapOOB gives a shape's refusal ErrOutOfBounds unless it has a sentinel.
func wrapOOB(err error) error {
	if errors.Is(err, transfer.ErrOutOfBounds) {
		return err
	}
	return fmt.Errorf("%w: %w", err, transfer.ErrOutOfBounds)
}

// buildShaped checks region and sc (see SubmitShaped) and writes the
// chunk's region bases, id window and, when the shape's table is not
// cached on the device, its segment table into c's pinned buffer.
func (e *Engine) buildShaped(c *copyCtx, region transfer.Desc, sc transfer.ShapedCopy) (shapedJob, error) {
	segs := sc.Shape.Segs
	var buf []byte
	var idsEnd uint64
	pl, err := planShaped(region.Len, sc, func(nr, m uint64) ([]uint32, error) {
		idsEnd = 8*nr + 4*m
		need := (idsEnd+15)&^15 + kernels.SegmentSize*uint64(len(segs))
		if err := e.growBlocks(c, need); err != nil {
			return nil, fmt.Errorf("ids buffer of %d bytes: %w", need, err)
		}
		buf = c.blk.host.Bytes()
		return unsafe.Slice((*uint32)(unsafe.Pointer(&buf[8*nr])), m), nil
	})
	if err != nil {
		return shapedJob{}, err
	}
	if err := e.checkRegion(c, region); err != nil {
		return shapedJob{}, err
	}
	if sc.Count == 0 {
		return shapedJob{}, nil
	}
	p := sc.Blocks.Pool
	bases, err := e.stageBases(c, buf, p, pl)
	if err != nil {
		return shapedJob{}, err
	}
	or := bases | p.Stride | (region.Addr + sc.RegionOff)
	// The segment table: cached on the device, or staged after the ids.
	segAt := (idsEnd + 15) &^ 15
	enc := kernels.EncodeSegments(buf[segAt:segAt:len(buf)], segs)
	dev, err := e.segTable(enc)
	if err != nil {
		return shapedJob{}, err
	}
	j := shapedJob{nr: uint64(pl.hi - pl.lo), bytes: idsEnd}
	if dev == 0 {
		j.segAt, j.bytes = segAt, segAt+uint64(len(enc))
	}
	for _, s := range segs {
		or |= uint64(s.Off)
	}
	l := kernels.UniformLen(segs)
	fam := kernels.BlockGeneral
	if _, ok := kernels.VectorShift(l); ok && or&15 == 0 {
		fam = e.mod.ShapedFamilyFor(true)
	} else {
		l = 0
	}
	j.family = fam
	j.job = kernels.ShapedJob{
		Region: cuda.DevicePtr(region.Addr + sc.RegionOff), Segs: dev,
		Groups: pl.n, Off0: pl.off0, Units: sc.Count,
		NSegs: uint32(len(segs)), Group: sc.Shape.Group,
		SegLen: l, UnitLen: sc.Shape.UnitLen(), Stride: p.Stride,
	}
	return j, nil
}

// launchShaped queues j's buffer copy (unless read zero-copy), the kernel
// and the completion on c's stream, and sets o's.
func (e *Engine) launchShaped(c *copyCtx, o *op, j shapedJob) error {
	if j.job.Units == 0 {
		o.flag = nil
		return c.event.Record(c.stream)
	}
	at := c.blk.host.Dev
	if !e.zero {
		if err := c.stream.CopyHtoD(c.blk.dev, c.blk.host.Host, j.bytes); err != nil {
			return fmt.Errorf("stage shaped ids: %w", err)
		}
		at = c.blk.dev
	}
	j.job.Bases, j.job.IDs = at, at+cuda.DevicePtr(8*j.nr)
	if j.segAt != 0 {
		j.job.Segs = at + cuda.DevicePtr(j.segAt)
	}
	if e.completion == CompletionFlag {
		c.blk.seq++
		if c.blk.seq == 0 {
			c.blk.seq = 1
		}
		j.job.Done, j.job.Counter, j.job.Seq = c.blk.flag.Dev, c.blk.counter, c.blk.seq
		o.flag, o.seq = (*uint32)(unsafe.Pointer(&c.blk.flag.Bytes()[0])), c.blk.seq
	}
	if err := e.mod.LaunchShaped(e.dir == Gather, j.family, c.stream, c.args, j.job); err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	if e.completion == CompletionFlag {
		return nil
	}
	return c.event.Record(c.stream)
}
