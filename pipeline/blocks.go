package pipeline

import (
	"fmt"
	"slices"
	"time"

	"github.com/bouncekv/bounce/pipeline/convert"
	"github.com/bouncekv/bounce/pipeline/credit"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// BlockRequest is the block-table form of a Request: write the pieces of
// local pool SrcPool's blocks SrcIDs to the peer's pool DstPool (a pool of
// the peer's descriptor), blocks DstIDs, id i to id i in every region
// (piece r of SrcIDs[i] to piece r of DstIDs[i]). The two pools must have
// the same block length and region count. Every id must be below its
// pool's block count, and DstIDs must not name a block twice (two pieces
// landing in one place would leave its bytes to whichever copy ran last):
// Submit refuses both before anything moves, in O(ids), and the receiver
// checks the destination ids again against its own pool.
//
// The request costs its ids, not its pieces: it is planned as ranges of
// pieces, its WANT carries the destination ids once and each DATA one piece
// range. Like Src and Dst, the agent reads the id slices until the batch is
// terminal; the caller must not change them before.
type BlockRequest struct {
	SrcPool string
	SrcIDs  []uint32
	DstPool string
	DstIDs  []uint32

	// src and dst are the resolved tables (set on Submit's own copy).
	src, dst transfer.Blocks
	// conv, when set, is the layout conversion the request moves with
	// (the two pools' layouts differ): it moves conv's units, not pieces.
	conv *convert.Conversion
}

// pieces is the number of pieces the request moves (regions × ids) or,
// converted, its units (regions × groups), once Submit resolved it.
func (br *BlockRequest) pieces() uint64 {
	if br.conv != nil {
		return uint64(len(br.src.Pool.Regions)) * (uint64(len(br.src.IDs)) / uint64(br.conv.Src.Group))
	}
	return br.src.Len()
}

// unitLen is the bytes of one piece or, converted, of one unit.
func (br *BlockRequest) unitLen() uint64 {
	if br.conv != nil {
		return br.conv.UnitLen()
	}
	return br.src.Pool.BlockLen
}

// localPool is a registered pool and what its regions lie in.
type localPool struct {
	name   string
	pool   transfer.Pool
	layout *transfer.Layout // the pool's KV layout, when registered with one
	// writers holds, per region, the peers that may write the memory the
	// region lies in (nil: every admitted peer).
	writers [][]string
	// users counts the requests using the pool (sender batches not yet
	// quiescent, receiver flows not yet ended).
	users int
}

// writable reports whether peer may write every region of the pool.
func (lp *localPool) writable(peer string) bool {
	for _, w := range lp.writers {
		if w != nil && !slices.Contains(w, peer) {
			return false
		}
	}
	return true
}

// RegisterPool registers a block pool under name, so requests can name its
// blocks by id (BlockRequest) and peers learn its geometry from this
// agent's descriptor (peers must reload the descriptor to see it). The
// name follows the agent-name rule (transfer.CheckName) and is not
// registered yet; the pool must be valid (transfer.Pool.Validate) and
// every region's span must lie in one range already registered with this
// agent (RegisterMemory, or RegisterMemoryFor for memory only some peers
// may write: a peer may write the pool only when it may write every
// region), else the error names the region.
func (a *Agent) RegisterPool(name string, p transfer.Pool) error {
	return a.registerPool(name, p, nil)
}

func (a *Agent) registerPool(name string, p transfer.Pool, l *transfer.Layout) error {
	if err := wire.CheckPoolName(name); err != nil {
		return fmt.Errorf("pipeline: register pool: %w", err)
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("pipeline: register pool %q: %w", name, err)
	}
	if l != nil {
		if err := l.CheckPool(p); err != nil {
			return fmt.Errorf("pipeline: register pool %q: %w", name, err)
		}
	}
	p.Regions = slices.Clone(p.Regions)
	lp := &localPool{name: name, pool: p, layout: l, writers: make([][]string, len(p.Regions))}
	a.poolMu.Lock()
	defer a.poolMu.Unlock()
	if _, dup := a.pools[name]; dup {
		return fmt.Errorf("pipeline: register pool %q: a pool of that name is registered", name)
	}
	if len(a.pools) >= wire.MaxPools {
		return fmt.Errorf("pipeline: register pool %q: %d pools registered, the most a descriptor carries", name, wire.MaxPools)
	}
	for r := range p.Regions {
		span := p.Span(r)
		d, err := a.set.Registry.FindKind(span.Kind, span.Device, span.Addr, span.Len)
		if err != nil {
			return fmt.Errorf("pipeline: register pool %q: region %d %v does not lie in memory registered with this agent (RegisterMemory first): %w", name, r, span, err)
		}
		lp.writers[r] = a.dests.writers(d)
	}
	if a.pools == nil {
		a.pools = map[string]*localPool{}
	}
	a.pools[name] = lp
	return nil
}

// DeregisterPool removes a pool registered with RegisterPool. It refuses
// with ErrInUse while a request uses it: a submitted one not yet quiescent,
// or a peer's request writing into it.
func (a *Agent) DeregisterPool(name string) error {
	a.poolMu.Lock()
	defer a.poolMu.Unlock()
	lp, ok := a.pools[name]
	if !ok {
		return fmt.Errorf("pipeline: deregister pool %q: %w", name, transfer.ErrNotRegistered)
	}
	if lp.users > 0 {
		return fmt.Errorf("pipeline: deregister pool %q: %d requests use it: %w", name, lp.users, transfer.ErrInUse)
	}
	delete(a.pools, name)
	return nil
}

// poolOverLocked returns the name of a registered pool with a region in d,
// or "". a.poolMu is held.
func (a *Agent) poolOverLocked(d transfer.Desc) string {
	for _, lp := range a.pools {
		for r := range lp.pool.Regions {
			if s := lp.pool.Span(r); s.Kind == d.Kind && s.Device == d.Device && s.Addr < d.End() && d.Addr < s.End() {
				return lp.name
			}
		}
	}
	return ""
}

// poolDescs returns the registered pools for the descriptor, by name.
func (a *Agent) poolDescs() []wire.PoolDesc {
	a.poolMu.Lock()
	defer a.poolMu.Unlock()
	out := make([]wire.PoolDesc, 0, len(a.pools))
	for _, lp := range a.pools {
		out = append(out, wire.PoolDesc{Name: lp.name, Pool: lp.pool, Layout: lp.layout})
	}
	slices.SortFunc(out, func(x, y wire.PoolDesc) int {
		switch {
		case x.Name < y.Name:
			return -1
		case x.Name > y.Name:
			return 1
		}
		return 0
	})
	return out
}

// usePool pins pool name for one request and returns it; release with
// unusePool.
func (a *Agent) usePool(name string) (*localPool, bool) {
	a.poolMu.Lock()
	defer a.poolMu.Unlock()
	lp, ok := a.pools[name]
	if ok {
		lp.users++
	}
	return lp, ok
}

func (a *Agent) unusePool(lp *localPool) {
	a.poolMu.Lock()
	lp.users--
	a.poolMu.Unlock()
}

// resolveBlocks validates a block-table request against the local source
// pool and the peer's destination pool and returns its resolved copy, with
// the source pool pinned (the caller unpins it once the request is
// quiescent, or at once when it is refused). It is O(ids).
func (a *Agent) resolveBlocks(br *BlockRequest, pi *peerInfo) (*BlockRequest, *localPool, error) {
	dp, ok := pi.pools[br.DstPool]
	if !ok {
		return nil, nil, fmt.Errorf("peer %q advertises no pool %q (reload its descriptor after it registered the pool): %w", pi.name, br.DstPool, transfer.ErrNotRegistered)
	}
	lp, ok := a.usePool(br.SrcPool)
	if !ok {
		return nil, nil, fmt.Errorf("no local pool %q (RegisterPool first): %w", br.SrcPool, transfer.ErrNotRegistered)
	}
	out := *br
	out.src = transfer.Blocks{Pool: lp.pool, IDs: br.SrcIDs}
	out.dst = transfer.Blocks{Pool: dp, IDs: br.DstIDs}
	var err error
	if out.conv, err = a.conversion(lp, pi, br); err != nil {
		a.unusePool(lp)
		return nil, nil, err
	}
	switch sp := lp.pool; {
	case out.conv != nil:
		if _, err = out.conv.Groups(len(br.SrcIDs), len(br.DstIDs)); err == nil {
			err = out.checkIDs()
		}
	case len(br.SrcIDs) != len(br.DstIDs):
		err = fmt.Errorf("%d source block ids but %d destination ids", len(br.SrcIDs), len(br.DstIDs))
	case sp.BlockLen != dp.BlockLen:
		err = fmt.Errorf("source pool %q has blocks of %d bytes, destination pool %q of %d: %w", br.SrcPool, sp.BlockLen, br.DstPool, dp.BlockLen, transfer.ErrUnsupported)
	case len(sp.Regions) != len(dp.Regions):
		err = fmt.Errorf("source pool %q has %d regions, destination pool %q %d: %w", br.SrcPool, len(sp.Regions), br.DstPool, len(dp.Regions), transfer.ErrUnsupported)
	default:
		err = out.checkIDs()
	}
	if err != nil {
		a.unusePool(lp)
		return nil, nil, err
	}
	return &out, lp, nil
}

// blockRuns counts the copy runs of a block-table request the way
// costmodel.Runs counts a descriptor list's: per region, a new run starts
// where either side's next piece does not follow the previous one in
// memory. O(ids).
func blockRuns(br *BlockRequest) int {
	if br.conv != nil { // a run per segment, at most
		return int(br.pieces()) * len(br.conv.Src.Segs)
	}
	s, d := br.src, br.dst
	if len(s.IDs) == 0 {
		return 0
	}
	solidS, solidD := s.Pool.Stride == s.Pool.BlockLen, d.Pool.Stride == d.Pool.BlockLen
	runs := 1
	for i := 1; i < len(s.IDs); i++ {
		if !solidS || !solidD || s.IDs[i] != s.IDs[i-1]+1 || d.IDs[i] != d.IDs[i-1]+1 {
			runs++
		}
	}
	return runs * len(s.Pool.Regions)
}

// expandWrites spells a block write out as one WriteOp per piece: the
// direct route for an engine without transfer.BlockPoster (the
// per-descriptor baseline itself).
func expandWrites(w transfer.BlockWrite) []transfer.WriteOp {
	ops := make([]transfer.WriteOp, w.Count)
	for k := range ops {
		q := w.First + uint64(k)
		ops[k] = transfer.WriteOp{Src: w.Src.Piece(q), Dst: w.Dst.Piece(q)}
	}
	return ops
}

// gatherBlocks starts a block-table chunk's gather: the stage's own
// GatherBlocks when it has the capability (transfer.BlockGatherer), else
// the chunk expanded to runs (expandRuns). That expansion, and its twin in
// scatterBlocks, is the only place the pipeline spells a block-table chunk
// out piece by piece: for a third-party stage that predates the form.
func gatherBlocks(g transfer.Gatherer, region transfer.Desc, c transfer.BlockCopy) (transfer.Op, error) {
	if bg, ok := g.(transfer.BlockGatherer); ok {
		return bg.GatherBlocks(region, c)
	}
	if err := c.Check(region.Len); err != nil {
		return nil, err
	}
	return g.Gather(region, expandRuns(c))
}

// scatterBlocks is gatherBlocks for the receiver's scatter.
func scatterBlocks(s transfer.Scatterer, region transfer.Desc, c transfer.BlockCopy) (transfer.Op, error) {
	if bs, ok := s.(transfer.BlockScatterer); ok {
		return bs.ScatterBlocks(region, c)
	}
	if err := c.Check(region.Len); err != nil {
		return nil, err
	}
	return s.Scatter(region, expandRuns(c))
}

// expandRuns spells a block copy out as runs: per region, the ids in
// order, consecutive ids merged into one run when the pool's blocks are
// contiguous (Stride = BlockLen) and into one strided run when they follow
// each other at the stride. c must be checked (BlockCopy.Check).
func expandRuns(c transfer.BlockCopy) []transfer.Run {
	b, bl := c.Blocks, c.Blocks.Pool.BlockLen
	n := uint64(len(b.IDs))
	runs := make([]transfer.Run, 0, 16)
	for k := uint64(0); k < c.Count; {
		q := c.First + k
		reg, j := int(q/n), q%n
		// Pieces of one region: ids j.. while they stay in it.
		span := min(c.Count-k, n-j)
		base := b.Pool.Regions[reg]
		for i := uint64(0); i < span; i++ {
			addr := base + uint64(b.IDs[j+i])*b.Pool.Stride
			runs = appendMerged(runs, transfer.Run{RegionOff: c.RegionOff + (k+i)*bl, Addr: addr, Len: bl, Count: 1})
		}
		k += span
	}
	return runs
}

// appendMerged appends r, growing the last run when r continues it
// (contiguous, or one more copy at its strides).
func appendMerged(runs []transfer.Run, r transfer.Run) []transfer.Run {
	if n := len(runs); n > 0 {
		l := &runs[n-1]
		switch {
		case l.Count == 1 && l.RegionOff+l.Len == r.RegionOff && l.Addr+l.Len == r.Addr:
			l.Len += r.Len
			return runs
		case l.Count == 1 && l.Len == r.Len && r.RegionOff > l.RegionOff && r.Addr > l.Addr:
			l.Count, l.RegionStride, l.AddrStride = 2, r.RegionOff-l.RegionOff, r.Addr-l.Addr
			return runs
		case l.Count > 1 && l.Len == r.Len && l.RegionOff+l.Count*l.RegionStride == r.RegionOff && l.Addr+l.Count*l.AddrStride == r.Addr:
			l.Count++
			return runs
		}
	}
	return append(runs, r)
}

// recvBlocks is a block-table flow's destination on the receiver: its pool
// (pinned while the flow lives) and the WANT's ids, checked once.
type recvBlocks struct {
	pool  *localPool
	table transfer.Blocks
	// shape, when set, is a converted request's destination shape: the
	// flow's DATAs name units of it (transfer.ShapedCopy).
	shape *transfer.Shape
}

// units is the request's pieces or, converted, its units.
func (rb *recvBlocks) units() uint64 {
	if rb.shape != nil {
		return uint64(len(rb.table.Pool.Regions)) * (uint64(len(rb.table.IDs)) / uint64(rb.shape.Group))
	}
	return rb.table.Len()
}

// unitLen is the bytes of one of its units.
func (rb *recvBlocks) unitLen() uint64 {
	if rb.shape != nil {
		return rb.shape.UnitLen()
	}
	return rb.table.Pool.BlockLen
}

// checkWantBlocks checks a block-table WANT against the local pool it
// names, once per request: the pool exists, has the WANT's block length and
// region count, may be written by peer (its regions lie in memory
// registered for peer or for every peer), and the ids are below its block
// count with none twice. O(ids). The pool comes back pinned.
func (r *reactor) checkWantBlocks(peer string, w *wire.WantBlocks) (*recvBlocks, error) {
	lp, ok := r.a.usePool(w.Pool)
	if !ok {
		return nil, fmt.Errorf("no pool %q here", w.Pool)
	}
	rb := &recvBlocks{pool: lp, table: transfer.Blocks{Pool: lp.pool, IDs: w.IDs}, shape: w.Shape}
	var err error
	switch p := lp.pool; {
	case w.Shape != nil && p.BlockLen != w.BlockLen:
		err = fmt.Errorf("pool %q has blocks of %d bytes, not the shape's %d", w.Pool, p.BlockLen, w.BlockLen)
	case w.Shape != nil:
		err = checkWantShape(w, lp, peer)
	case p.BlockLen != w.BlockLen:
		err = fmt.Errorf("pool %q has blocks of %d bytes, not %d", w.Pool, p.BlockLen, w.BlockLen)
	case uint64(len(p.Regions)) != w.Regions():
		err = fmt.Errorf("pool %q has %d regions, not %d", w.Pool, len(p.Regions), w.Regions())
	case !lp.writable(peer):
		err = fmt.Errorf("pool %q lies in memory %q may not write: %w", w.Pool, peer, transfer.ErrForbidden)
	default:
		r.a.stats.blockTableChecks.Add(1)
		if err = rb.table.CheckIDs(true); err != nil {
			err = fmt.Errorf("pool %q: %w", w.Pool, err)
		}
	}
	if err != nil {
		r.a.unusePool(lp)
		return nil, err
	}
	return rb, nil
}

// acceptPieces ends the checks of a DATA in the piece-range form: why (if
// not "") is why its range does not fit its flow, and the DATA is refused
// — counted, logged, NACKed, its flow failed (refuseData) —; otherwise its
// region begins to scatter (false when it already does).
func (r *reactor) acceptPieces(peer string, key credit.FlowKey, d *wire.Data, why string) bool {
	r.recycleRuns(d.Runs)
	if why == "" {
		return r.beginScatter(peer, key, d)
	}
	r.a.stats.badRuns.Add(1)
	r.a.obs.reject(r, peer, rejectBadRuns)
	r.log.Warn("DATA rejected: bad piece range", "peer", peer, "request", d.Request, "chunk", d.Chunk, "why", why)
	r.refuseData(peer, key, d, fmt.Errorf("chunk %d: %w: %s", d.Chunk, ErrRefused, why), wire.NackBadBlocks, why)
	return false
}

// onBlockData validates a block-table DATA with one range check (its piece
// range lies in the request's pieces and fits the granted region) and
// queues its scatter; f is the flow's record (nil when it has none).
func (r *reactor) onBlockData(peer string, key credit.FlowKey, grant credit.Region, d *wire.Data, f *recvFlow) {
	var why string
	switch pr := d.Pieces; {
	case f == nil || f.blocks == nil:
		why = "a piece range for a request that is not a block-table one"
	case !d.IsBlocks():
		why = "scatter runs for a block-table request"
	case pr.First > f.blocks.units() || pr.Count > f.blocks.units()-pr.First:
		why = fmt.Sprintf("pieces [%d, +%d) pass the request's %d", pr.First, pr.Count, f.blocks.units())
	case pr.Count > grant.Len/f.blocks.unitLen():
		why = fmt.Sprintf("%d pieces of %d bytes pass the %d-byte region", pr.Count, f.blocks.unitLen(), grant.Len)
	case f.pull != nil: // a pull's: exactly its chunk's range
		why = f.pull.checkRange(grant, d)
	}
	if !r.acceptPieces(peer, key, d, why) {
		return
	}
	bc := transfer.BlockCopy{Blocks: f.blocks.table, First: d.Pieces.First, Count: d.Pieces.Count}
	t := &scatterTask{key: key, chunk: d.Chunk, region: r.regionDesc(d.Region, grant.Len), off: d.Region, queued: time.Now()}
	if f.blocks.shape != nil {
		t.shaped = &transfer.ShapedCopy{BlockCopy: bc, Shape: *f.blocks.shape}
	} else {
		t.blocks = &bc
	}
	r.queueScatter(d, t)
}
