// Package plan turns a transfer's (source, destination) descriptor pairs
// into chunks for the bounce pipeline: each chunk is packed into one
// contiguous region (gather), moved by one bulk write and unpacked at the
// destinations (scatter). It is pure logic: no goroutines, locks, clocks or
// IO.
//
// Packing: non-empty pairs are placed in order, each at the next Align-byte
// aligned offset of the current chunk, while the chunk's Bytes (the end of
// its last piece, alignment padding included) stays within the chunk's cap
// and the source and destination device and memory kind stay the same;
// otherwise a new chunk starts. A pair larger than a new chunk's cap is split
// into pieces of the cap, one chunk each; its last, shorter piece opens the
// chunk the following pairs pack into.
//
// Caps: every chunk's cap is MaxChunk, unless Options.MinChunk is set. Then
// the caps ramp up and taper off so that a pipeline of gather, write and
// scatter fills and drains quickly: chunk i is capped at MinChunk << i, and
// at half the payload not yet placed (never under MinChunk, and never
// leaving less than MinChunk for a last chunk). A 16 MiB transfer with
// MinChunk 2 MiB and MaxChunk 8 MiB becomes chunks of 2, 4, 5, 2.5 and
// 2.5 MiB: its first write starts after a 2 MiB gather and its last scatter
// is 2.5 MiB, not 8; a 320 MiB one starts the same way, runs at 8 MiB and
// ends with 8, 5, 2.5 and 2.5 MiB. The no-sliver rule wins over the ramp (a
// 3 MiB transfer is one chunk); neither restarts at a device change.
//
// Runs: each piece yields one gather run (source address -> region offset)
// and one scatter run (region offset -> destination address). Unless
// Options.NoMerge is set, consecutive runs are coalesced (see Coalesce), so
// a dense transfer of thousands of small descriptors needs a handful of runs.
package plan

import (
	"fmt"
	"math/bits"

	"github.com/bouncekv/bounce/transfer"
)

// DefaultAlign is the in-region alignment of every piece when Options.Align
// is 0.
const DefaultAlign = 32

// Options configures Build.
type Options struct {
	// MaxChunk is the most region bytes one chunk may need (the arena's
	// per-chunk cap). Must be positive.
	MaxChunk uint64
	// MinChunk, when positive and below MaxChunk, ramps the chunk caps up
	// from it and tapers them off toward the end (see the package
	// documentation); 0 caps every chunk at MaxChunk.
	MinChunk uint64
	// Align is the in-region alignment of each piece, a power of two; 0
	// means DefaultAlign.
	Align uint64
	// NoMerge keeps one run per piece (for debugging the control plane).
	NoMerge bool
	// Scatter, when its Bytes is positive, bounds each chunk's scatter runs
	// by their encoded size, so a chunk's DATA fits a control channel's
	// message limit however fragmented the transfer is.
	Scatter ScatterLimit
}

// ScatterLimit bounds the encoded size of one chunk's scatter runs: a run of
// one copy with no strides costs Single bytes, any other Strided bytes.
// A chunk is closed before a piece that could take its runs over Bytes, so
// a dense, fragmented transfer is planned in more, smaller chunks rather
// than in chunks whose DATA no channel can carry. The zero value is no limit.
type ScatterLimit struct {
	Bytes, Single, Strided int
}

// cost returns r's size under l.
func (l ScatterLimit) cost(r transfer.Run) int {
	if r.Count == 1 && r.RegionStride == 0 && r.AddrStride == 0 {
		return l.Single
	}
	return l.Strided
}

// align returns the in-region alignment (Align, DefaultAlign for 0), or
// why the options cannot plan (MaxChunk 0, Align no power of two).
func (opt Options) align() (uint64, error) {
	if opt.MaxChunk == 0 {
		return 0, fmt.Errorf("plan: MaxChunk must be positive")
	}
	align := opt.Align
	if align == 0 {
		align = DefaultAlign
	}
	if align&(align-1) != 0 {
		return 0, fmt.Errorf("plan: Align %d is not a power of two", align)
	}
	return align, nil
}

// worst is the most one more piece can add to a chunk's runs: a new single
// run, or a single run turning strided when the piece merges into it.
func (l ScatterLimit) worst() int { return max(l.Single, l.Strided-l.Single) }

// Chunk is one region's worth of a transfer.
type Chunk struct {
	// Index is the chunk's position in Plan.Chunks.
	Index int
	// Bytes is the region size the chunk needs (what a WANT asks for): the
	// end of its last piece, alignment padding included.
	Bytes uint64
	// Payload is the sum of the chunk's piece lengths.
	Payload uint64
	// Descs is the number of descriptor pieces in the chunk.
	Descs int
	// SrcDevice and DstDevice are the devices every piece reads and writes.
	SrcDevice, DstDevice int32
	// SrcKind and DstKind are the memory kinds of every piece.
	SrcKind, DstKind transfer.MemKind
	// Gather copies source addresses (Run.Addr) to region offsets.
	Gather []transfer.Run
	// Scatter copies region offsets to destination addresses (Run.Addr).
	Scatter []transfer.Run
	// First and Count are a block-table chunk's piece range (LayoutBlocks);
	// such a chunk has no runs.
	First, Count uint64

	first int    // the chunk's first piece: descriptor index (Fill)
	pos   uint64 // and its byte offset in that descriptor
	// gbuf and sbuf are Gather's and Scatter's whole arrays when they came
	// from a RunPool (Recycle hands them back).
	gbuf, sbuf []transfer.Run
}

// Plan is a transfer split into chunks.
type Plan struct {
	Chunks []Chunk
	// Descs is the number of non-empty descriptor pairs; a pair split across
	// chunks counts once here and once per piece in Chunk.Descs.
	Descs int
	// Payload is the total bytes moved.
	Payload uint64

	src, dst []transfer.Desc // the pairs, until every chunk is filled
	align    uint64
	merge    bool
	filled   int // chunks filled
	// blocks holds a block-table plan's tables (LayoutBlocks); nil for a
	// descriptor plan.
	blocks *blockTables
	// gatherOnly: Fill emits no scatter runs (LayoutInto).
	gatherOnly bool
}

// MaxPieces bounds the pieces (descriptor parts) one plan may hold, so a
// huge descriptor with a tiny MaxChunk is an error rather than an endless
// allocation.
const MaxPieces = 1 << 26

// Build pairs src[i] with dst[i] and packs the pairs into chunks as the
// package documentation describes. It fails, naming the offending index,
// when the slices differ in length, a pair differs in length or a
// descriptor wraps the address space, and it fails when MaxChunk is 0, Align
// is not a power of two or the plan would exceed MaxPieces pieces.
// Zero-length pairs are skipped. Input is fully validated before anything is
// built. Build is Layout followed by Fill of every chunk.
func Build(src, dst []transfer.Desc, opt Options) (*Plan, error) {
	p, err := Layout(src, dst, opt)
	if err != nil {
		return nil, err
	}
	p.FillAll()
	return p, nil
}

// Layout validates the pairs as Build does and decides the chunks — their
// Bytes, Payload, Descs, devices and kinds, exactly as Build would — without
// emitting their runs: each chunk's Gather and Scatter stay nil until Fill.
// A caller can so send a WANT (which needs only the chunk sizes) and start
// the first chunk after a pass that costs a fraction of Build, and emit the
// other chunks' runs while earlier ones move. The plan keeps src and dst
// until every chunk is filled; the caller must not change them before.
func Layout(src, dst []transfer.Desc, opt Options) (*Plan, error) {
	if len(src) != len(dst) {
		return nil, fmt.Errorf("plan: %d source descriptors but %d destinations", len(src), len(dst))
	}
	align, err := opt.align()
	if err != nil {
		return nil, err
	}
	if l := opt.Scatter; l.Bytes != 0 && (l.Bytes < 0 || l.Single <= 0 || l.Strided < l.Single || l.Bytes < l.Strided) {
		return nil, fmt.Errorf("plan: scatter limit %+v: want Bytes >= Strided >= Single > 0 (or Bytes 0, no limit)", l)
	}
	var payload, pieces uint64
	for i := range src {
		s, d := src[i], dst[i]
		if s.Len != d.Len {
			return nil, fmt.Errorf("plan: descriptor %d: source %v is %d bytes but destination %v is %d", i, s, s.Len, d, d.Len)
		}
		if s.Len == 0 {
			continue
		}
		if s.Addr > ^uint64(0)-s.Len {
			return nil, fmt.Errorf("plan: descriptor %d: source %v wraps the address space", i, s)
		}
		if d.Addr > ^uint64(0)-d.Len {
			return nil, fmt.Errorf("plan: descriptor %d: destination %v wraps the address space", i, d)
		}
		if payload > ^uint64(0)-s.Len {
			return nil, fmt.Errorf("plan: descriptor %d: total payload overflows", i)
		}
		payload += s.Len
		if pieces += (s.Len-1)/opt.MaxChunk + 1; pieces > MaxPieces {
			return nil, fmt.Errorf("plan: descriptor %d: transfer needs more than %d pieces of at most %d bytes", i, MaxPieces, opt.MaxChunk)
		}
	}
	b := builder{
		p:     &Plan{src: src, dst: dst, align: align, merge: !opt.NoMerge},
		cur:   -1,
		max:   opt.MaxChunk,
		min:   opt.MinChunk,
		total: payload,
		align: align,
		merge: !opt.NoMerge,
		lim:   opt.Scatter,
	}
	for i := range src {
		if src[i].Len != 0 {
			b.add(i, src[i], dst[i])
		}
	}
	if len(b.p.Chunks) == 0 {
		b.p.src, b.p.dst = nil, nil
	}
	return b.p, nil
}

// ChunkBytes returns every chunk's Bytes, in order: the sizes a WANT or
// PULL asks for.
func (p *Plan) ChunkBytes() []uint64 {
	sizes := make([]uint64, len(p.Chunks))
	for i, c := range p.Chunks {
		sizes[i] = c.Bytes
	}
	return sizes
}

// Filled reports whether chunk k's runs are emitted (a block-table chunk
// has none to emit: always true).
func (p *Plan) Filled(k int) bool { return p.blocks != nil || p.Chunks[k].Gather != nil }

// Fill emits chunk k's gather and scatter runs, if Layout left them out;
// it is a no-op for a chunk already filled. Its arrays are fresh (FillFrom
// draws them from a RunPool).
func (p *Plan) Fill(k int) { p.FillFrom(k, nil) }

// FillFrom is Fill drawing the chunk's two run arrays from pool (nil: fresh
// arrays). It is one pass over the chunk's descriptors that emits both the
// gather and the scatter runs, merged as they are emitted, into arrays
// nothing clears first: a reused array is only appended to. The caller
// hands the arrays back with Recycle once nothing reads them.
func (p *Plan) FillFrom(k int, pool *RunPool) {
	c := &p.Chunks[k]
	if c.Gather != nil || p.src == nil {
		return
	}
	get := func() []transfer.Run {
		if pool != nil {
			return pool.get(c.Descs)
		}
		return make([]transfer.Run, 0, c.Descs)
	}
	var gather, scatter []transfer.Run = get(), nil
	if !p.gatherOnly {
		scatter = get()
	}
	i, pos := c.first, c.pos
	var end uint64
	for left := c.Payload; left > 0; i, pos = i+1, 0 {
		s := p.src[i]
		if s.Len == 0 {
			continue
		}
		n := min(s.Len-pos, left)
		off := (end + p.align - 1) &^ (p.align - 1) // Layout proved it fits
		g := transfer.Run{RegionOff: off, Addr: s.Addr + pos, Len: n, Count: 1}
		if p.merge {
			gather = appendRunFrom(gather, 0, g)
		} else {
			gather = append(gather, g)
		}
		if !p.gatherOnly {
			r := transfer.Run{RegionOff: off, Addr: p.dst[i].Addr + pos, Len: n, Count: 1}
			if p.merge {
				scatter = appendRunFrom(scatter, 0, r)
			} else {
				scatter = append(scatter, r)
			}
		}
		end = off + n
		left -= n
	}
	if pool == nil {
		gather, scatter = trim(gather), trim(scatter)
	} else {
		c.gbuf, c.sbuf = gather, scatter
	}
	c.Gather, c.Scatter = gather[:len(gather):len(gather)], scatter[:len(scatter):len(scatter)]
	if p.filled++; p.filled == len(p.Chunks) {
		p.src, p.dst = nil, nil // every chunk is filled: drop the caller's slices
	}
}

// RunPool is a free list of run arrays that FillFrom draws from and
// Recycle returns to, so a stream of requests fills its chunks into the
// same few arrays instead of allocating (and clearing) two per chunk. It
// keeps at most maxPooled arrays of at most maxPooledRuns runs each. It is
// not safe for concurrent use: one per goroutine that fills (the agent's
// reactor).
type RunPool struct {
	free [][]transfer.Run
}

// Limits of a RunPool.
const (
	maxPooled     = 64
	maxPooledRuns = 1 << 18
)

// get returns an empty array, with room for n runs when the pool has one
// that large.
func (rp *RunPool) get(n int) []transfer.Run {
	for i := len(rp.free) - 1; i >= 0; i-- {
		if b := rp.free[i]; cap(b) >= n || i == 0 {
			last := len(rp.free) - 1
			rp.free[i] = rp.free[last]
			rp.free[last] = nil
			rp.free = rp.free[:last]
			return b[:0]
		}
	}
	return make([]transfer.Run, 0, n)
}

// put keeps runs for a later FillFrom.
func (rp *RunPool) put(runs []transfer.Run) {
	if cap(runs) == 0 || cap(runs) > maxPooledRuns || len(rp.free) >= maxPooled {
		return
	}
	rp.free = append(rp.free, runs[:0])
}

// RecycleGather hands chunk k's gather runs back to pool once nothing reads
// them (its gather op is terminal); the chunk's Gather becomes empty (not
// nil: the chunk stays filled).
func (p *Plan) RecycleGather(k int, pool *RunPool) {
	c := &p.Chunks[k]
	if pool == nil || c.gbuf == nil {
		return
	}
	pool.put(c.gbuf)
	c.gbuf, c.Gather = nil, c.Gather[:0:0]
}

// RecycleScatter is RecycleGather for chunk k's scatter runs, once its DATA
// is encoded.
func (p *Plan) RecycleScatter(k int, pool *RunPool) {
	c := &p.Chunks[k]
	if pool == nil || c.sbuf == nil {
		return
	}
	pool.put(c.sbuf)
	c.sbuf, c.Scatter = nil, c.Scatter[:0:0]
}

// TakeScatter hands chunk k's scatter runs to the caller, who owns them
// from now on (to recycle as it likes): the chunk keeps none (its Scatter
// becomes empty, not nil: the chunk stays filled).
func (p *Plan) TakeScatter(k int) []transfer.Run {
	c := &p.Chunks[k]
	runs := c.Scatter
	c.sbuf, c.Scatter = nil, runs[:0:0]
	return runs
}

// FillAll fills every chunk not yet filled.
func (p *Plan) FillAll() {
	for k := range p.Chunks {
		p.Fill(k)
	}
}

// builder packs pieces into the plan's last chunk, deciding chunk
// boundaries only: it tracks the current chunk's last scatter run (the one
// a piece may merge into, which the scatter limit depends on) but emits no
// runs.
type builder struct {
	p             *Plan
	cur           int    // index of the chunk being filled, -1 before the first or after a device change
	max, min      uint64 // Options.MaxChunk and MinChunk
	cap           uint64 // the current chunk's cap
	total, placed uint64 // the plan's payload, and how much of it is placed
	align         uint64
	merge         bool
	lim           ScatterLimit
	runBytes      int          // the current chunk's scatter runs under lim
	last          transfer.Run // the current chunk's last scatter run (Count 0: none)
}

func (b *builder) add(i int, s, d transfer.Desc) {
	b.p.Descs++
	b.p.Payload += s.Len
	if b.cur >= 0 {
		c := &b.p.Chunks[b.cur]
		if c.SrcDevice != s.Device || c.SrcKind != s.Kind || c.DstDevice != d.Device || c.DstKind != d.Kind {
			b.cur = -1
		}
	}
	if b.cur >= 0 && b.lim.Bytes > 0 && b.runBytes+b.lim.worst() > b.lim.Bytes {
		b.cur = -1 // its DATA is full
	}
	if b.cur >= 0 {
		if off, ok := b.fit(b.p.Chunks[b.cur].Bytes, s.Len); ok {
			b.place(off, d.Addr, s.Len)
			return
		}
	}
	// A new chunk; a pair larger than its cap is split, every piece opening
	// its own chunk and all but the last filling it.
	for pos := uint64(0); pos < s.Len; {
		b.open(i, pos, s, d)
		n := min(b.cap, s.Len-pos)
		b.place(0, d.Addr+pos, n)
		pos += n
	}
}

// capFor returns the cap of chunk i when remaining payload bytes are still
// to be placed (see the package documentation).
func (b *builder) capFor(i int, remaining uint64) uint64 {
	if b.min == 0 || b.min >= b.max {
		return b.max
	}
	c := b.max
	if i < 64 && b.min <= b.max>>i {
		c = min(c, b.min<<i) // ramp up
	}
	c = min(c, max(b.min, remaining-remaining/2)) // taper: half of what is left
	if remaining-min(remaining, c) < b.min {
		c = min(b.max, max(c, remaining)) // no sliver after this chunk
	}
	return c
}

// fit returns the aligned offset after end and whether n bytes fit there.
func (b *builder) fit(end, n uint64) (uint64, bool) {
	off, carry := bits.Add64(end, b.align-1, 0)
	if carry != 0 {
		return 0, false
	}
	off &^= b.align - 1
	return off, off <= b.cap && n <= b.cap-off
}

// open starts a new chunk for pieces of the pair (s, d) from byte pos of
// descriptor i.
func (b *builder) open(i int, pos uint64, s, d transfer.Desc) {
	b.cur = len(b.p.Chunks)
	b.cap = b.capFor(b.cur, b.total-b.placed)
	b.p.Chunks = append(b.p.Chunks, Chunk{
		Index:     b.cur,
		SrcDevice: s.Device, DstDevice: d.Device,
		SrcKind: s.Kind, DstKind: d.Kind,
		first: i, pos: pos,
	})
	b.runBytes = 0
	b.last = transfer.Run{}
}

// place puts n bytes for destination dst at region offset off of the
// current chunk, keeping the scatter-run accounting the limit needs.
func (b *builder) place(off, dst, n uint64) {
	s := transfer.Run{RegionOff: off, Addr: dst, Len: n, Count: 1}
	if b.lim.Bytes > 0 {
		if prev := b.last; b.merge && prev.Count != 0 && merge(&b.last, s) {
			b.runBytes += b.lim.cost(b.last) - b.lim.cost(prev)
		} else {
			b.last = s
			b.runBytes += b.lim.cost(s)
		}
	}
	c := &b.p.Chunks[b.cur]
	c.Bytes = off + n
	c.Payload += n
	c.Descs++
	b.placed += n
}

// trim copies runs into an array of their own size when they use less than
// half of theirs, so a well merged plan does not pin the worst-case array.
func trim(runs []transfer.Run) []transfer.Run {
	if len(runs) >= cap(runs)/2 {
		return runs
	}
	return append([]transfer.Run(nil), runs...)
}
