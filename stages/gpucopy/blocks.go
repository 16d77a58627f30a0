package gpucopy

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"sync/atomic"
	"unsafe"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/cuda/kernels"
	"github.com/bouncekv/bounce/transfer"
)

// Completion says how a block-form operation's end is seen.
type Completion uint8

const (
	// CompletionFlag: the kernel stores a sequence number to pinned host
	// memory when its last block is done, and Poll reads it (a load, no
	// driver call); every flagQueryEvery-th unanswered Poll also queries
	// the stream, so a device fault is still reported. The default:
	// cheaper than events on the H200 (docs/BENCHMARKS.md, issue 24).
	CompletionFlag Completion = iota
	// CompletionEvent: an event recorded after the kernel, queried by
	// each Poll (one driver call a Poll, one at Submit).
	CompletionEvent
)

// String names the completion for benchmarks.
func (c Completion) String() string {
	if c == CompletionEvent {
		return "event"
	}
	return "flag"
}

// flagQueryEvery is how many unanswered flag polls pass between stream
// queries (the fault check of CompletionFlag).
const flagQueryEvery = 64

// initialBlockBytes is the ids-and-bases buffer each context starts with;
// a larger chunk grows it (a one-off allocation).
const initialBlockBytes = 64 << 10

// blockBuf is a context's block-form state: the pinned buffer the chunk's
// region bases and id window are written to (and its device copy when
// not read zero-copy), the completion flag and the kernel's block
// counter.
type blockBuf struct {
	host    cuda.HostMem
	dev     cuda.DevicePtr
	flag    cuda.HostMem   // one uint32 the kernel stores seq to
	counter cuda.DevicePtr // one uint32, 0 between launches
	seq     uint32
}

func (e *Engine) newBlockBuf(c *copyCtx) error {
	var err error
	if c.blk.flag, err = e.cc.HostAlloc(64); err != nil {
		return err
	}
	if c.blk.counter, err = e.cc.MemAlloc(64); err != nil {
		return err
	}
	if err := e.cc.Memset(c.blk.counter, 0, 64); err != nil {
		return err
	}
	return e.growBlocks(c, initialBlockBytes)
}

// growBlocks gives c an ids-and-bases buffer of at least n bytes. c is
// idle.
func (e *Engine) growBlocks(c *copyCtx, n uint64) error {
	if n <= c.blk.host.Len {
		return nil
	}
	n = max(n, 2*c.blk.host.Len)
	host, err := e.cc.HostAlloc(n)
	if err != nil {
		return err
	}
	var dev cuda.DevicePtr
	if !e.zero {
		if dev, err = e.cc.MemAlloc(n); err != nil {
			_ = e.cc.HostFree(host)
			return err
		}
	}
	e.freeBlockTable(c)
	c.blk.host, c.blk.dev = host, dev
	return nil
}

func (e *Engine) freeBlockTable(c *copyCtx) {
	if c.blk.host.Host != 0 {
		_ = e.cc.HostFree(c.blk.host)
		c.blk.host = cuda.HostMem{}
	}
	if c.blk.dev != 0 {
		_ = e.cc.MemFree(c.blk.dev)
		c.blk.dev = 0
	}
}

func (e *Engine) freeBlockBuf(c *copyCtx) {
	e.freeBlockTable(c)
	if c.blk.flag.Host != 0 {
		_ = e.cc.HostFree(c.blk.flag)
		c.blk.flag = cuda.HostMem{}
	}
	if c.blk.counter != 0 {
		_ = e.cc.MemFree(c.blk.counter)
		c.blk.counter = 0
	}
}

// HasBlocks reports whether the engine's kernel module has the block
// form (SubmitBlocks is ErrUnsupported otherwise).
func (e *Engine) HasBlocks() bool { return e.mod.HasBlocks(kernels.BlockGeneral) }

// blockJob is a checked chunk ready to launch.
type blockJob struct {
	job    kernels.BlockJob
	family kernels.BlockFamily
	bytes  uint64 // of the ids-and-bases buffer in use
}

// SubmitBlocks checks a block-table chunk against region and the
// registry and launches one kernel that computes each piece's address
// from (region base, stride, id): no piece table is built. Its checks,
// all before any byte moves: the piece range within the table, the
// region bytes within region, every id the chunk touches below the
// pool's block count (one pass over them, fused with copying them into
// the context's pinned buffer), and, once per pool region touched, the
// span of its pieces [base + min id*stride, base + max id*stride + len)
// within one registered range of the pool's kind the device reaches.
// The ids and bases are staged to the device with one copy (or read
// zero-copy with ZeroCopyTable). A scatter naming one block twice leaves
// it with bytes of either piece: callers refuse duplicate destination ids
// where that matters.
func (e *Engine) SubmitBlocks(region transfer.Desc, bc transfer.BlockCopy) (transfer.Op, error) {
	if !e.HasBlocks() {
		return nil, fmt.Errorf("%s: the kernel module has no block kernels: %w", e.name, transfer.ErrUnsupported)
	}
	return submit(e, "blocks: ", &e.launched.blocks,
		func(c *copyCtx) (blockJob, error) { return e.buildBlocks(c, region, bc) }, e.launchBlocks)
}

// blockPlan is what planBlocks proves of a chunk: its id window (m ids
// from index off0 of the n ids, wrapping), the pool regions [lo, hi) it
// touches, and the bytes [spanLo, spanHi) its pieces span from each of
// their bases (least id to greatest).
type blockPlan struct {
	n, off0, m     uint64
	lo, hi         int
	spanLo, spanHi uint64
}

// planBlocks checks bc against a region of regionLen bytes without
// touching memory registration: the pool's shape, the piece range within
// the table, the region bytes within the region, every id of the chunk's
// window below the pool's block count (one pass, fused with copying the
// window into the slice alloc returns for nr region bases and m ids), and
// no piece address overflowing. A chunk of no pieces checks the first
// three only.
func planBlocks(regionLen uint64, bc transfer.BlockCopy, alloc func(nr, m uint64) ([]uint32, error)) (blockPlan, error) {
	p := bc.Blocks.Pool
	ids := bc.Blocks.IDs
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
	n := uint64(len(ids))
	total := bc.Blocks.Len()
	if bc.First > total || bc.Count > total-bc.First {
		return blockPlan{}, fmt.Errorf("pieces [%d, +%d) pass the table's %d (%d regions x %d ids): %w", bc.First, bc.Count, total, len(p.Regions), n, transfer.ErrOutOfBounds)
	}
	hi, nb := bits.Mul64(bc.Count, p.BlockLen)
	if hi != 0 || bc.RegionOff > regionLen || nb > regionLen-bc.RegionOff {
		return blockPlan{}, fmt.Errorf("%d pieces of %d bytes from region offset %d pass the region's %d bytes: %w", bc.Count, p.BlockLen, bc.RegionOff, regionLen, transfer.ErrOutOfBounds)
	}
	pl := blockPlan{n: n}
	if bc.Count == 0 {
		return pl, nil
	}
	pl.off0 = bc.First % n
	pl.m = min(bc.Count, n)
	pl.lo, pl.hi = bc.Blocks.RegionsTouched(bc.First, bc.Count)
	win, err := alloc(uint64(pl.hi-pl.lo), pl.m)
	if err != nil {
		return blockPlan{}, err
	}
	win = win[:pl.m]
	// The id window: ids[off0:] then, when the chunk wraps, ids[:rest].
	seg := ids[pl.off0:min(n, pl.off0+pl.m)]
	mn, mx := copyIDs(win[:len(seg)], seg)
	if rest := pl.m - uint64(len(seg)); rest > 0 {
		a, b := copyIDs(win[len(seg):], ids[:rest])
		mn, mx = min(mn, a), max(mx, b)
	}
	if uint64(mx) >= p.Blocks {
		for k, id := range win {
			if uint64(id) >= p.Blocks {
				return blockPlan{}, fmt.Errorf("block id %d (index %d) is not below the pool's %d blocks: %w", id, (pl.off0+uint64(k))%n, p.Blocks, transfer.ErrOutOfBounds)
			}
		}
	}
	sh, sl := bits.Mul64(uint64(mn), p.Stride)
	eh, el := bits.Mul64(uint64(mx), p.Stride)
	if sh != 0 || eh != 0 || el > math.MaxUint64-p.BlockLen {
		return blockPlan{}, fmt.Errorf("block %d at stride %d overflows: %w", mx, p.Stride, transfer.ErrOutOfBounds)
	}
	pl.spanLo, pl.spanHi = sl, el+p.BlockLen
	for r := pl.lo; r < pl.hi; r++ {
		if p.Regions[r] > math.MaxUint64-pl.spanHi {
			return blockPlan{}, fmt.Errorf("pool region %d at %#x: pieces overflow the address space: %w", r, p.Regions[r], transfer.ErrOutOfBounds)
		}
	}
	return pl, nil
}

// buildBlocks checks region and bc (see SubmitBlocks) and writes the
// chunk's region bases and id window into c's pinned buffer.
func (e *Engine) buildBlocks(c *copyCtx, region transfer.Desc, bc transfer.BlockCopy) (blockJob, error) {
	var buf []byte
	pl, err := planBlocks(region.Len, bc, func(nr, m uint64) ([]uint32, error) {
		need := 8*nr + 4*m
		if err := e.growBlocks(c, need); err != nil {
			return nil, fmt.Errorf("ids buffer of %d bytes: %w", need, err)
		}
		buf = c.blk.host.Bytes()
		return unsafe.Slice((*uint32)(unsafe.Pointer(&buf[8*nr])), m), nil
	})
	if err != nil {
		return blockJob{}, err
	}
	if err := e.checkRegion(c, region); err != nil {
		return blockJob{}, err
	}
	if bc.Count == 0 {
		return blockJob{}, nil
	}
	p := bc.Blocks.Pool
	bases, err := e.stageBases(c, buf, p, pl)
	if err != nil {
		return blockJob{}, err
	}
	or := bases | p.Stride | (region.Addr + bc.RegionOff)
	fam := kernels.BlockGeneral
	if _, ok := kernels.VectorShift(p.BlockLen); ok && or&15 == 0 {
		fam = e.mod.BlockFamilyFor(true)
	}
	return blockJob{
		job: kernels.BlockJob{
			Region: cuda.DevicePtr(region.Addr + bc.RegionOff),
			NIDs:   pl.n, Off0: pl.off0, Count: bc.Count, Len: p.BlockLen, Stride: p.Stride,
		},
		family: fam,
		bytes:  8*uint64(pl.hi-pl.lo) + 4*pl.m,
	}, nil
}

// copyIDs copies src to dst (of its length) and returns their least and
// greatest id.
func copyIDs(dst, src []uint32) (mn, mx uint32) {
	mn = math.MaxUint32
	dst = dst[:len(src)]
	for i, id := range src {
		dst[i] = id
		mn = min(mn, id)
		mx = max(mx, id)
	}
	return mn, mx
}

// checkRegion checks that the contiguous region is not empty and lies in
// one registered range the device reaches, and records it in c's scope.
func (e *Engine) checkRegion(c *copyCtx, region transfer.Desc) error {
	if region.Len == 0 {
		return fmt.Errorf("region %v: empty: %w", region, transfer.ErrOutOfBounds)
	}
	rd, err := e.reg.FindKind(region.Kind, region.Device, region.Addr, region.Len)
	if err != nil {
		return fmt.Errorf("region %v: %w", region, err)
	}
	if err := e.touch(&c.scope, rd); err != nil {
		return fmt.Errorf("region %v: %w", region, err)
	}
	return nil
}

// stageBases writes the bases of pool regions [pl.lo, pl.hi) at the start
// of buf, checks each region's span [base+spanLo, base+spanHi) once, and
// returns the bases or-ed together (for the kernels' alignment test).
func (e *Engine) stageBases(c *copyCtx, buf []byte, p transfer.Pool, pl blockPlan) (uint64, error) {
	var or uint64
	for r := pl.lo; r < pl.hi; r++ {
		base := p.Regions[r]
		binary.LittleEndian.PutUint64(buf[8*uint64(r-pl.lo):], base)
		or |= base
		if err := e.checkSpan(c, p, base+pl.spanLo, pl.spanHi-pl.spanLo); err != nil {
			return 0, fmt.Errorf("pool region %d: %w", r, err)
		}
	}
	return or, nil
}

// checkSpan proves [addr, addr+n) lies in one registered range of the
// pool's kind that the device reaches.
func (e *Engine) checkSpan(c *copyCtx, p transfer.Pool, addr, n uint64) error {
	if c.last.Len != 0 && c.last.Kind == p.Kind && c.last.Device == p.Device && c.last.Contains(addr, n) {
		return nil
	}
	d, err := e.reg.FindKind(p.Kind, p.Device, addr, n)
	if err != nil {
		return err
	}
	return e.touch(&c.scope, d)
}

// launchBlocks queues j's ids copy (unless read zero-copy), the kernel
// and the completion (flag or event) on c's stream, and sets o's.
func (e *Engine) launchBlocks(c *copyCtx, o *op, j blockJob) error {
	if j.job.Count == 0 {
		o.flag = nil
		return c.event.Record(c.stream)
	}
	at := c.blk.host.Dev
	if !e.zero {
		if err := c.stream.CopyHtoD(c.blk.dev, c.blk.host.Host, j.bytes); err != nil {
			return fmt.Errorf("stage block ids: %w", err)
		}
		at = c.blk.dev
	}
	nr := (j.bytes - 4*min(j.job.Count, j.job.NIDs)) / 8
	j.job.Bases, j.job.IDs = at, at+cuda.DevicePtr(8*nr)
	if e.completion == CompletionFlag {
		c.blk.seq++
		if c.blk.seq == 0 {
			c.blk.seq = 1 // 0 is the flag's initial value
		}
		j.job.Done, j.job.Counter, j.job.Seq = c.blk.flag.Dev, c.blk.counter, c.blk.seq
		o.flag, o.seq = (*uint32)(unsafe.Pointer(&c.blk.flag.Bytes()[0])), c.blk.seq
	}
	if err := e.mod.LaunchBlocks(e.dir == Gather, j.family, c.stream, c.args, j.job); err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	if e.completion == CompletionFlag {
		return nil
	}
	return c.event.Record(c.stream)
}

// pollFlag is Poll's test of a flag-completed operation: done when the
// flag holds the operation's sequence number; every flagQueryEvery-th
// miss the stream is queried (a device fault is reported there, and a
// stream found idle is done).
func (o *op) pollFlag() (bool, error) {
	if atomic.LoadUint32(o.flag) == o.seq {
		return true, nil
	}
	o.misses++
	if o.misses%flagQueryEvery != 0 {
		return false, nil
	}
	return o.c.stream.Query()
}
