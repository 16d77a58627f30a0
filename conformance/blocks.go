package conformance

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/bouncekv/bounce/transfer"
)

// The block-table form (transfer.BlockGatherer, transfer.BlockScatterer,
// transfer.BlockPoster) is certified by the data rules of its kind run on
// block-table transfers — "gather/blocks-byte-exact", "engine/blocks-
// failure-reported" and so on — plus a rule on repeated ids. The pools the
// rules draw have unaligned region bases, gaps between blocks (a stride
// longer than the block), regions apart or interleaved, random or
// contiguous ids and several regions per table, and every chunk starts at a
// random piece (First > 0), so a stage that ignores First, RegionOff or
// the stride is caught. Every byte of every pool buffer that the chunk does
// not name — the gaps around each destination piece included — must keep
// its value. Ids past the pool's block count point at memory the rule laid
// out and registered, so an implementation that does not check ids against
// Pool.Blocks is seen writing there (or gathering from there) rather than
// faulting. The capability is probed on each fixture: without it every
// block rule is skipped with the reason.

// blockRules returns the data rules of kind for the block form: the same
// bodies over a block-table rig, each id renamed "<kind>/blocks-<name>".
func blockRules[F any](kind, noun, capability string, mk func(c *rc, f F) (rig, error)) []rule[F] {
	rules := dataRules(kind, noun, mk)
	for i := range rules {
		rules[i].id = blockRuleID(rules[i].id, kind)
		rules[i].summary = "block form (" + capability + "): " + rules[i].summary + " (skipped without " + capability + ")"
	}
	return rules
}

// blockRuleID turns "<kind>/<name>" into "<kind>/blocks-<name>".
func blockRuleID(id, kind string) string {
	return kind + "/blocks-" + strings.TrimPrefix(id, kind+"/")
}

// blockPool is a pool the rule laid out over buffers of its own. Each
// region's memory holds Blocks+spare blocks, so ids up to Blocks+spare-1 lie
// in memory the rule owns (and registers) although the pool refuses them.
type blockPool struct {
	pool  transfer.Pool
	bufs  [][]byte
	at    []pieceAt
	spare uint64
	shape string
}

// pieceAt is where block 0 of a region lies: a buffer and an offset in it.
type pieceAt struct {
	buf int
	off uint64
}

// Pool shapes: regions in buffers of their own with gaps between blocks,
// regions interleaved in one buffer (K and V of a block side by side), and
// solid regions (stride equal to the block, so a run of ids is one range).
const (
	shapeApart       = "regions apart"
	shapeInterleaved = "regions interleaved"
	shapeSolid       = "solid regions"
)

// layout lays out a pool of regions × blocks blocks of blockLen bytes (and
// spare more per region) in fresh buffers filled with random bytes.
func layout(c *rc, shape string, blockLen, blocks uint64, regions int, spare uint64) (*blockPool, error) {
	r := c.rng
	p := &blockPool{spare: spare, shape: shape}
	p.pool = transfer.Pool{BlockLen: blockLen, Blocks: blocks, Kind: c.memory.Kind, Device: c.memory.Device}
	span := blocks + spare
	switch shape {
	case shapeInterleaved:
		slot := blockLen + r.Uint64N(9)
		stride := uint64(regions)*slot + r.Uint64N(8)
		lead := 1 + r.Uint64N(31)
		b, err := c.buf(lead + (span-1)*stride + uint64(regions)*slot + 1 + r.Uint64N(15))
		if err != nil {
			return nil, err
		}
		p.bufs = [][]byte{b}
		p.pool.Stride = stride
		for k := range regions {
			p.at = append(p.at, pieceAt{0, lead + uint64(k)*slot})
		}
	default:
		stride := blockLen
		if shape == shapeApart {
			stride += 1 + r.Uint64N(16)
		}
		p.pool.Stride = stride
		for k := range regions {
			lead := 1 + r.Uint64N(31)
			b, err := c.buf(lead + (span-1)*stride + blockLen + 1 + r.Uint64N(15))
			if err != nil {
				return nil, err
			}
			p.bufs = append(p.bufs, b)
			p.at = append(p.at, pieceAt{k, lead})
		}
	}
	for _, b := range p.bufs {
		c.fill(b)
	}
	for _, a := range p.at {
		p.pool.Regions = append(p.pool.Regions, addrOf(p.bufs[a.buf])+a.off)
	}
	if err := p.pool.Validate(); err != nil {
		return nil, fmt.Errorf("the suite drew an invalid pool %v: %w", p.pool, err)
	}
	return p, nil
}

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// piece is block id of region r in bufs (the pool's buffers or a copy of
// them laid out alike).
func (p *blockPool) piece(bufs [][]byte, r int, id uint32) []byte {
	a := p.at[r]
	o := a.off + uint64(id)*p.pool.Stride
	return bufs[a.buf][o : o+p.pool.BlockLen]
}

// register registers every buffer of the pool with reg.
func (p *blockPool) register(c *rc, reg func(transfer.Desc) error) error {
	for i, b := range p.bufs {
		if err := reg(c.desc(b)); err != nil {
			return fmt.Errorf("registering pool buffer %d (%s): %w", i, p.shape, err)
		}
	}
	return nil
}

// clones returns a copy of the pool's buffers.
func (p *blockPool) clones() [][]byte {
	out := make([][]byte, len(p.bufs))
	for i, b := range p.bufs {
		out[i] = append([]byte(nil), b...)
	}
	return out
}

// watch adds the pool's buffers to j: want nil means unchanged.
func (p *blockPool) watch(j *job, side string, want [][]byte) {
	for i, b := range p.bufs {
		var w []byte
		if want != nil {
			w = want[i]
		}
		j.watch(fmt.Sprintf("%s pool buffer %d (%s, block %d at stride %d; bytes between pieces are guards)", side, i, p.shape, p.pool.BlockLen, p.pool.Stride), b, w)
	}
}

// drawIDs returns n ids below blocks: distinct and shuffled, or a
// contiguous run from a random start.
func drawIDs(c *rc, n, blocks uint64, contiguous bool) []uint32 {
	ids := make([]uint32, n)
	if contiguous {
		start := c.rng.Uint64N(blocks - n + 1)
		for i := range ids {
			ids[i] = uint32(start + uint64(i))
		}
		return ids
	}
	perm := c.rng.Perm(int(blocks))
	for i := range ids {
		ids[i] = uint32(perm[i])
	}
	return ids
}

// blockLenFor picks a block length and a piece count moving about n bytes:
// one of a few lengths (1, 7, 512, 2 KiB, 4 KiB, 4097) no longer than n,
// raised so that no transfer has more than maxPieces pieces.
func blockLenFor(c *rc, n uint64) (blockLen, count uint64) {
	const maxPieces = 1 << 14
	lens := []uint64{1, 7, 64, 512, 2048, 4096, 4097}
	for {
		blockLen = lens[c.rng.IntN(len(lens))]
		if blockLen <= n {
			break
		}
	}
	blockLen = max(blockLen, (n+maxPieces-1)/maxPieces)
	return blockLen, max(1, n/blockLen)
}

// variantShape is the pool shape and id draw of a job variant: solid
// regions and contiguous ids, regions apart and random ids, interleaved
// regions and random ids.
func variantShape(variant int) (shape string, contiguous bool) {
	switch variant {
	case 0:
		return shapeSolid, true
	case 1:
		return shapeApart, false
	default:
		return shapeInterleaved, false
	}
}

// table draws a block table of count pieces or more in the shape of
// variant: regions, ids and the pool under them.
func table(c *rc, blockLen, count uint64, variant int, maxRegions int) (*blockPool, transfer.Blocks, error) {
	shape, contiguous := variantShape(variant)
	regions := 1 + c.rng.IntN(maxRegions)
	if shape == shapeInterleaved {
		regions = max(regions, 2)
	}
	nIDs := (count+uint64(regions)-1)/uint64(regions) + c.rng.Uint64N(3)
	blocks := nIDs + c.rng.Uint64N(nIDs/2+2)
	p, err := layout(c, shape, blockLen, blocks, regions, 2)
	if err != nil {
		return nil, transfer.Blocks{}, err
	}
	return p, transfer.Blocks{Pool: p.pool, IDs: drawIDs(c, nIDs, blocks, contiguous)}, nil
}

// tableLike draws a destination table of src's region and id counts (the
// shape a pipeline.BlockRequest has: id i to id i in every region) over a
// pool of its own: its own layout, stride, block count and ids.
func tableLike(c *rc, src transfer.Blocks, variant int) (*blockPool, transfer.Blocks, error) {
	shape, contiguous := variantShape(variant)
	nIDs := uint64(len(src.IDs))
	blocks := nIDs + c.rng.Uint64N(nIDs/2+2)
	p, err := layout(c, shape, src.Pool.BlockLen, blocks, len(src.Pool.Regions), 2)
	if err != nil {
		return nil, transfer.Blocks{}, err
	}
	return p, transfer.Blocks{Pool: p.pool, IDs: drawIDs(c, nIDs, blocks, contiguous)}, nil
}

// describe names a table for messages.
func describeTable(p *blockPool, b transfer.Blocks) string {
	return fmt.Sprintf("%d regions x %d ids (%s, block %d at stride %d, %d blocks)", len(b.Pool.Regions), len(b.IDs), p.shape, b.Pool.BlockLen, b.Pool.Stride, b.Pool.Blocks)
}

// pieceOf is piece q of b laid out as in p, within bufs.
func pieceOf(p *blockPool, bufs [][]byte, b transfer.Blocks, q uint64) []byte {
	n := uint64(len(b.IDs))
	return p.piece(bufs, int(q/n), b.IDs[q%n])
}

// ---- stages ----------------------------------------------------------

// blockStageRules are the block-form rules of a gather or scatter suite.
func blockStageRules(kind string) []rule[*stageRig] {
	capability := "transfer.BlockGatherer"
	if kind == "scatter" {
		capability = "transfer.BlockScatterer"
	}
	mk := func(c *rc, s *stageRig) (rig, error) { return s.blocks(c, capability) }
	rules := blockRules(kind, "block "+kind, capability, mk)
	summary := "a block gather whose ids repeat (one block read several times) lands byte-exact"
	if kind == "scatter" {
		summary = "a block scatter whose destination ids repeat (overlapping destinations, the caller's error: the pipeline refuses them) is refused or ends terminal, and either way writes no byte outside the pieces it names; each byte of a piece named twice then holds that byte of one of the pieces copied there"
	}
	return append(rules, rule[*stageRig]{
		kind + "/blocks-repeated-ids", summary + " (skipped without " + capability + ")",
		func(c *rc, s *stageRig) error {
			g, err := s.blocks(c, capability)
			if err != nil {
				return err
			}
			return ruleRepeatedIDs(c, g)
		},
	})
}

// blockStage is a stage offering the block form, as a rig.
type blockStage struct {
	scatter  bool
	do       func(region transfer.Desc, bc transfer.BlockCopy) (transfer.Op, error)
	register func(d transfer.Desc) error
}

// blocks returns s's block form, or a skip naming the missing capability.
func (s *stageRig) blocks(c *rc, capability string) (*blockStage, error) {
	b := &blockStage{scatter: s.scatter, register: s.register}
	if s.scatter {
		if x, ok := s.stage.(transfer.BlockScatterer); ok {
			b.do = x.ScatterBlocks
		}
	} else if x, ok := s.stage.(transfer.BlockGatherer); ok {
		b.do = x.GatherBlocks
	}
	if b.do == nil {
		return nil, c.skipf("%T does not offer %s", s.stage, capability)
	}
	return b, nil
}

func (s *blockStage) noun() string {
	if s.scatter {
		return "block scatter"
	}
	return "block gather"
}

func (s *blockStage) variants() int { return 3 }

// job prepares one chunk of about n bytes of a drawn table: pieces
// [First, First+Count) with First random, packed from an odd RegionOff in
// a region with guards on both sides.
func (s *blockStage) job(c *rc, n uint64, variant int) (*job, error) {
	blockLen, count := blockLenFor(c, n)
	p, b, err := table(c, blockLen, count, variant, 6)
	if err != nil {
		return nil, err
	}
	first := c.rng.Uint64N(b.Len() - count + 1)
	bj, err := s.chunk(c, p, b, first, count, "")
	if err != nil {
		return nil, err
	}
	return bj.job, nil
}

// blockJob is a chunk's job and the memory behind it.
type blockJob struct {
	*job
	// want is what the pool's buffers must hold after a scatter (nil for
	// a gather, which leaves the pool unchanged).
	want      [][]byte
	regionB   []byte
	regionOff uint64
}

// chunk prepares the copy of pieces [first, first+count) of b (over p)
// and the memory it must leave behind.
func (s *blockStage) chunk(c *rc, p *blockPool, b transfer.Blocks, first, count uint64, note string) (*blockJob, error) {
	bl := b.Pool.BlockLen
	regionOff := c.rng.Uint64N(8)*2 + 1
	regionLen := regionOff + count*bl + 1 + c.rng.Uint64N(8)
	rbuf, err := c.buf(regionGuard + regionLen + regionGuard)
	if err != nil {
		return nil, err
	}
	c.fill(rbuf)
	c.step("registering the region and pool of a %s", s.noun())
	if err := s.register(c.desc(rbuf)); err != nil {
		return nil, fmt.Errorf("registering the region's buffer: %w", err)
	}
	if err := p.register(c, s.register); err != nil {
		return nil, err
	}
	regionB := rbuf[regionGuard : regionGuard+regionLen]
	region := c.desc(regionB)
	bc := transfer.BlockCopy{Blocks: b, First: first, Count: count, RegionOff: regionOff}
	bj := &blockJob{job: &job{
		what:        fmt.Sprintf("%s of pieces [%d, +%d) of %d bytes from %s at region offset %d%s", s.noun(), first, count, bl, describeTable(p, b), regionOff, note),
		post:        func() (transfer.Op, error) { return s.do(region, bc) },
		nonBlocking: true,
	}, regionB: regionB, regionOff: regionOff}
	j := bj.job
	j.watch("guard before the region:", rbuf[:regionGuard], nil)
	j.watch("guard after the region:", rbuf[regionGuard+regionLen:], nil)
	if s.scatter {
		bj.want = p.clones()
		for k := range count {
			copy(pieceOf(p, bj.want, b, first+k), regionB[regionOff+k*bl:])
		}
		j.watch("region", regionB, nil)
		p.watch(j, "destination", bj.want)
		return bj, nil
	}
	want := append([]byte(nil), regionB...)
	for k := range count {
		copy(want[regionOff+k*bl:regionOff+(k+1)*bl], pieceOf(p, p.bufs, b, first+k))
	}
	p.watch(j, "source", nil)
	j.watch("region", regionB, want)
	return bj, nil
}

// Registration of a bad job's memory.
const (
	regAll         = iota // region and pool registered whole
	regNoPool             // the pool not registered
	regFirstRegion        // only the pool's first region registered
	regNoRegion           // the region not registered
)

// badMem is the memory of one bad block copy.
type badMem struct {
	p      *blockPool
	b      transfer.Blocks
	rbuf   []byte
	region transfer.Desc
}

// Geometry of the bad jobs' pools: 2 regions of 16 blocks of 64 bytes (4
// spare), tables of 8 ids.
const (
	badBL, badBlocks, badRegions, badIDs = 64, 16, 2, 8
)

// badBlockCase is a block copy that must be refused.
type badBlockCase struct {
	what      string
	reg       int
	edit      func(x *badMem) (first, count, regionOff uint64)
	sentinels []error
}

func badBlockCases() []badBlockCase {
	bounds := []error{transfer.ErrOutOfBounds, transfer.ErrNotRegistered}
	return []badBlockCase{
		{"an id at the pool's block count (the chunk's last piece)", regAll, func(x *badMem) (uint64, uint64, uint64) {
			x.b.IDs[badIDs-1] = badBlocks
			return 0, badIDs, 0
		}, nil},
		{"an id past the pool's block count (a chunk that wraps to the table's first id)", regAll, func(x *badMem) (uint64, uint64, uint64) {
			x.b.IDs[0] = badBlocks + 1
			return badIDs - 2, 4, 0
		}, nil},
		{"pieces past the end of the table", regAll, func(x *badMem) (uint64, uint64, uint64) {
			return badRegions*badIDs - 2, 4, 0
		}, nil},
		{"pieces past the end of the region", regAll, func(x *badMem) (uint64, uint64, uint64) {
			return 0, 4, x.region.Len - 3*badBL - 1
		}, []error{transfer.ErrOutOfBounds}},
		{"an empty block table", regAll, func(x *badMem) (uint64, uint64, uint64) {
			x.b.IDs = nil
			return 0, 1, 0
		}, nil},
		{"a pool in unregistered memory", regNoPool, func(x *badMem) (uint64, uint64, uint64) {
			return 0, badRegions * badIDs, 0
		}, bounds},
		{"a pool whose last region is in unregistered memory", regFirstRegion, func(x *badMem) (uint64, uint64, uint64) {
			return 0, badRegions * badIDs, 0
		}, bounds},
		{"a region in unregistered memory", regNoRegion, func(x *badMem) (uint64, uint64, uint64) {
			return 0, 4, 0
		}, bounds},
	}
}

// newBadBlocks lays out the memory of one bad case: a pool apart, a table
// naming its last valid block, a region of 16 blocks with guards.
func newBadBlocks(c *rc) (*badMem, error) {
	p, err := layout(c, shapeApart, badBL, badBlocks, badRegions, 4)
	if err != nil {
		return nil, err
	}
	x := &badMem{p: p, b: transfer.Blocks{Pool: p.pool, IDs: drawIDs(c, badIDs, badBlocks, false)}}
	// The highest valid block is named, so a pool registered short of its
	// end is caught.
	x.b.IDs[1] = badBlocks - 1
	if x.rbuf, err = c.buf(regionGuard + 16*badBL + regionGuard); err != nil {
		return nil, err
	}
	c.fill(x.rbuf)
	x.region = c.desc(x.rbuf[regionGuard : regionGuard+16*badBL])
	return x, nil
}

// badJobs prepares block copies that must be refused with nothing
// written. Each case has a pool and a region of its own, and the pieces of
// each chunk before the fault are valid ones, so "nothing written" also
// means the stage checked before it copied.
func (s *blockStage) badJobs(c *rc) ([]*job, error) {
	var out []*job
	for _, k := range badBlockCases() {
		x, err := newBadBlocks(c)
		if err != nil {
			return nil, err
		}
		if k.reg != regNoRegion {
			if err := s.register(c.desc(x.rbuf)); err != nil {
				return nil, fmt.Errorf("registering the region's buffer: %w", err)
			}
		}
		switch k.reg {
		case regAll, regNoRegion:
			err = x.p.register(c, s.register)
		case regFirstRegion:
			err = s.register(c.desc(x.p.bufs[0]))
		}
		if err != nil {
			return nil, err
		}
		first, count, off := k.edit(x)
		bc := transfer.BlockCopy{Blocks: x.b, First: first, Count: count, RegionOff: off}
		region := x.region
		j := &job{
			what:        fmt.Sprintf("%s with %s", s.noun(), k.what),
			post:        func() (transfer.Op, error) { return s.do(region, bc) },
			nonBlocking: true,
			sentinels:   k.sentinels,
		}
		j.watch("region buffer", x.rbuf, nil)
		x.p.watch(j, "the", nil)
		out = append(out, j)
	}
	return out, nil
}

// ---- repeated ids ----------------------------------------------------

// repeater is a rig that can prepare transfers whose ids repeat.
type repeater interface {
	// repeated prepares a transfer whose source ids repeat (srcJob, which
	// must land byte-exact) and one whose destination ids repeat (dstJob,
	// with the pieces named more than once); either may be nil where the
	// form has no such side.
	repeated(c *rc) (srcJob, dstJob *job, ovs []overlap, err error)
}

// overlap is a destination piece several pieces of a transfer name: its
// memory, its place in the job's expected memory, and a copy of each
// piece copied there.
type overlap struct {
	what    string
	dst     []byte
	want    []byte
	sources [][]byte
}

func ruleRepeatedIDs(c *rc, g repeater) error {
	srcJob, dstJob, ovs, err := g.repeated(c)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	if srcJob != nil {
		op, err := c.complete(srcJob)
		if err != nil {
			return err
		}
		m := srcJob.mismatch()
		_ = op.Release()
		if m != "" {
			return fmt.Errorf("%s: %s", srcJob.what, m)
		}
	}
	if dstJob == nil {
		return nil
	}
	j := dstJob
	op, perr, err := c.post(j)
	if err != nil {
		return err
	}
	how, cause := "the call", perr
	if perr == nil {
		o, err := c.wait(op, j.what)
		if err != nil {
			return err
		}
		_ = op.Release()
		if o.st == transfer.Done {
			return checkOverlaps(c, j, ovs)
		}
		how, cause = "a failed op", o.err
	}
	if m := j.changed(); m != "" {
		c.tainted("%s wrote memory", j.what)
		return fmt.Errorf("%s was refused by %s (%v) but %s: a refusal writes nothing", j.what, how, cause, m)
	}
	c.note("%s refused by %s: %v", j.what, how, cause)
	return nil
}

// checkOverlaps checks a done transfer with repeated destinations: every
// byte but the overlapping pieces as the model says, and each byte of those
// from one of the pieces copied there.
func checkOverlaps(c *rc, j *job, ovs []overlap) error {
	for _, ov := range ovs {
		copy(ov.want, ov.dst)
	}
	if m := j.mismatch(); m != "" {
		return fmt.Errorf("%s ended done but %s (pieces named more than once aside): no byte outside the pieces named may change", j.what, m)
	}
	for _, ov := range ovs {
		for k := range ov.dst {
			ok := false
			for _, src := range ov.sources {
				ok = ok || ov.dst[k] == src[k]
			}
			if !ok {
				return fmt.Errorf("%s ended done but %s byte %d = 0x%02x, which is that byte of none of the %d pieces copied there", j.what, ov.what, k, ov.dst[k], len(ov.sources))
			}
		}
	}
	c.note("%s ended done; each piece named more than once holds bytes of the pieces copied there", j.what)
	return nil
}

// repeatIDs draws 10 distinct ids below blocks and makes ids 7, 8 and 9
// repeat ids 0, 3 and 0.
func repeatIDs(c *rc, blocks uint64) []uint32 {
	ids := drawIDs(c, 10, blocks, false)
	ids[7], ids[8], ids[9] = ids[0], ids[3], ids[0]
	return ids
}

// repeatSlots are the id slots naming the same block in repeatIDs.
var repeatSlots = [][]uint64{{0, 7, 9}, {3, 8}}

// repeated prepares a block copy of a whole table whose ids repeat: for a
// gather the same source block fills several region slots; for a scatter
// the same destination block receives several region slots.
func (s *blockStage) repeated(c *rc) (*job, *job, []overlap, error) {
	const bl, blocks = 97, 24
	regions := 2 + c.rng.IntN(2)
	p, err := layout(c, shapeApart, bl, blocks, regions, 2)
	if err != nil {
		return nil, nil, nil, err
	}
	ids := repeatIDs(c, blocks)
	b := transfer.Blocks{Pool: p.pool, IDs: ids}
	bj, err := s.chunk(c, p, b, 0, b.Len(), fmt.Sprintf(" (ids %v repeat)", ids))
	if err != nil {
		return nil, nil, nil, err
	}
	if !s.scatter {
		return bj.job, nil, nil, nil
	}
	n := uint64(len(ids))
	var ovs []overlap
	for r := range regions {
		for _, slots := range repeatSlots {
			id := ids[slots[0]]
			ov := overlap{what: fmt.Sprintf("region %d block %d", r, id), dst: p.piece(p.bufs, r, id), want: p.piece(bj.want, r, id)}
			for _, k := range slots {
				q := uint64(r)*n + k
				o := bj.regionOff + q*bl
				ov.sources = append(ov.sources, append([]byte(nil), bj.regionB[o:o+bl]...))
			}
			ovs = append(ovs, ov)
		}
	}
	return nil, bj.job, ovs, nil
}

// ---- engines -----------------------------------------------------------

// blockEngineRules are the block-form rules of the engine suite.
func blockEngineRules() []rule[*enginePeer] {
	const capability = "transfer.BlockPoster"
	mk := func(c *rc, e *enginePeer) (rig, error) { return e.blocks(c) }
	rules := blockRules("engine", "block write", capability, mk)
	rules = append(rules, rule[*enginePeer]{
		"engine/blocks-geometry",
		"a block write between tables of different region and id counts (piece q of the source to piece q of the destination, as transfer.BlockWrite defines it) lands byte-exact, or is refused by the call wrapping transfer.ErrUnsupported with nothing written (skipped without " + capability + ")",
		func(c *rc, e *enginePeer) error {
			g, err := e.blocks(c)
			if err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			return ruleGeometry(c, g)
		},
	})
	return append(rules, rule[*enginePeer]{
		"engine/blocks-repeated-ids",
		"a block write whose source ids repeat lands byte-exact; one whose destination ids repeat (the caller's error: the pipeline refuses them) is refused or ends terminal, writes no byte outside the pieces it names, and each byte of a piece named twice holds that byte of one of the pieces written there (skipped without " + capability + ")",
		func(c *rc, e *enginePeer) error {
			g, err := e.blocks(c)
			if err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			return ruleRepeatedIDs(c, g)
		},
	})
}

// blockEngine is an engine pair whose A offers the block form, as a rig:
// A writes tables of its pools into B's.
type blockEngine struct {
	e    *enginePeer
	post func(peer string, w transfer.BlockWrite) (transfer.Op, error)
}

// blocks connects the pair and returns its block form, or a skip naming
// the missing capability.
func (e *enginePeer) blocks(c *rc) (*blockEngine, error) {
	bp, ok := e.A.(transfer.BlockPoster)
	if !ok {
		return nil, c.skipf("%T does not offer transfer.BlockPoster", e.A)
	}
	if err := e.connect(c); err != nil {
		return nil, err
	}
	return &blockEngine{e: e, post: bp.PostBlocks}, nil
}

func (g *blockEngine) noun() string  { return "block write" }
func (g *blockEngine) variants() int { return 3 }

// register registers src's buffers at A and dst's at B (reloading B into
// A); either may be nil.
func (g *blockEngine) register(c *rc, src, dst *blockPool) error {
	if src != nil {
		if err := src.register(c, g.e.A.RegisterMemory); err != nil {
			return fmt.Errorf("A: %w", err)
		}
	}
	if dst != nil {
		if err := dst.register(c, g.e.B.RegisterMemory); err != nil {
			return fmt.Errorf("B: %w", err)
		}
	}
	return g.e.reload(c)
}

// job prepares a block write of about n bytes between a source and a
// destination table of the same region and id counts (each its own pool
// layout and ids): pieces [First, First+Count) with First random.
// engine/blocks-geometry covers tables of different shapes.
func (g *blockEngine) job(c *rc, n uint64, variant int) (*job, error) {
	bl, count := blockLenFor(c, n)
	sp, sb, err := table(c, bl, count, variant, 4)
	if err != nil {
		return nil, err
	}
	dp, db, err := tableLike(c, sb, variant)
	if err != nil {
		return nil, err
	}
	first := c.rng.Uint64N(min(sb.Len(), db.Len()) - count + 1)
	bj, err := g.write(c, sp, sb, dp, db, first, count, "")
	if err != nil {
		return nil, err
	}
	return bj.job, nil
}

// write prepares the write of pieces [first, first+count) of src (over
// sp) to the same pieces of dst (over dp), registering both pools.
func (g *blockEngine) write(c *rc, sp *blockPool, src transfer.Blocks, dp *blockPool, dst transfer.Blocks, first, count uint64, note string) (*blockJob, error) {
	c.step("registering the pools of a block write")
	if err := g.register(c, sp, dp); err != nil {
		return nil, err
	}
	return g.prepare(sp, src, dp, dst, first, count, note), nil
}

// prepare is write without the registration: the pools are registered
// already.
func (g *blockEngine) prepare(sp *blockPool, src transfer.Blocks, dp *blockPool, dst transfer.Blocks, first, count uint64, note string) *blockJob {
	w := transfer.BlockWrite{Src: src, Dst: dst, First: first, Count: count}
	peer := g.e.peerB
	bj := &blockJob{job: &job{
		what: fmt.Sprintf("block write of pieces [%d, +%d) of %d bytes from %s to %s%s", first, count, src.Pool.BlockLen, describeTable(sp, src), describeTable(dp, dst), note),
		post: func() (transfer.Op, error) { return g.post(peer, w) },
	}}
	bj.want = dp.clones()
	for k := range count {
		copy(pieceOf(dp, bj.want, dst, first+k), pieceOf(sp, sp.bufs, src, first+k))
	}
	sp.watch(bj.job, "source", nil)
	dp.watch(bj.job, "destination", bj.want)
	return bj
}

// badJobs prepares block writes that must be refused with nothing
// written, each over pools of its own.
func (g *blockEngine) badJobs(c *rc) ([]*job, error) {
	bounds := []error{transfer.ErrOutOfBounds, transfer.ErrNotRegistered}
	type pair struct {
		sp, dp   *blockPool
		src, dst transfer.Blocks
		peer     string
	}
	const (
		full  = badRegions * badIDs
		ghost = "conformance-peer-never-loaded"
	)
	cases := []struct {
		what      string
		regSrc    int
		regDst    int
		edit      func(x *pair) (first, count uint64)
		sentinels []error
	}{
		{"a destination id at the pool's block count (the write's last piece)", regAll, regAll, func(x *pair) (uint64, uint64) {
			x.dst.IDs[badIDs-1] = badBlocks
			return 0, badIDs
		}, nil},
		{"a source id past the pool's block count (a write that wraps to the table's first id)", regAll, regAll, func(x *pair) (uint64, uint64) {
			x.src.IDs[0] = badBlocks + 1
			return badIDs - 2, 4
		}, nil},
		{"pieces past the end of the destination table", regAll, regAll, func(x *pair) (uint64, uint64) {
			x.dst.IDs = x.dst.IDs[:badIDs-2]
			return 0, full
		}, nil},
		{"source and destination block lengths that differ", regAll, regAll, func(x *pair) (uint64, uint64) {
			x.dst.Pool.BlockLen /= 2
			return 0, 4
		}, nil},
		{"empty block tables", regAll, regAll, func(x *pair) (uint64, uint64) {
			x.src.IDs, x.dst.IDs = nil, nil
			return 0, 1
		}, nil},
		{"a destination pool in memory the peer never registered", regAll, regNoPool, func(x *pair) (uint64, uint64) {
			return 0, full
		}, bounds},
		{"a destination pool whose last region the peer never registered", regAll, regFirstRegion, func(x *pair) (uint64, uint64) {
			return 0, full
		}, bounds},
		{"a source pool in unregistered memory", regNoPool, regAll, func(x *pair) (uint64, uint64) {
			return 0, full
		}, bounds},
		{"a source pool whose last region is unregistered", regFirstRegion, regAll, func(x *pair) (uint64, uint64) {
			return 0, full
		}, bounds},
		{fmt.Sprintf("a peer never loaded (%q)", ghost), regAll, regAll, func(x *pair) (uint64, uint64) {
			x.peer = ghost
			return 0, full
		}, []error{transfer.ErrUnknownPeer}},
	}
	reg := func(p *blockPool, how int, to func(transfer.Desc) error) error {
		switch how {
		case regAll:
			return p.register(c, to)
		case regFirstRegion:
			return to(c.desc(p.bufs[0]))
		}
		return nil
	}
	var out []*job
	for _, k := range cases {
		x := &pair{peer: g.e.peerB}
		var err error
		for _, side := range []struct {
			p   **blockPool
			b   *transfer.Blocks
			how int
			to  func(transfer.Desc) error
		}{{&x.sp, &x.src, k.regSrc, g.e.A.RegisterMemory}, {&x.dp, &x.dst, k.regDst, g.e.B.RegisterMemory}} {
			if *side.p, err = layout(c, shapeApart, badBL, badBlocks, badRegions, 4); err != nil {
				return nil, err
			}
			*side.b = transfer.Blocks{Pool: (*side.p).pool, IDs: drawIDs(c, badIDs, badBlocks, false)}
			side.b.IDs[1] = badBlocks - 1
			if err := reg(*side.p, side.how, side.to); err != nil {
				return nil, err
			}
		}
		if err := g.e.reload(c); err != nil {
			return nil, err
		}
		first, count := k.edit(x)
		w := transfer.BlockWrite{Src: x.src, Dst: x.dst, First: first, Count: count}
		peer := x.peer
		j := &job{
			what:      fmt.Sprintf("block write with %s", k.what),
			post:      func() (transfer.Op, error) { return g.post(peer, w) },
			sentinels: k.sentinels,
		}
		x.sp.watch(j, "source", nil)
		x.dp.watch(j, "destination", nil)
		out = append(out, j)
	}
	return out, nil
}

// repeated prepares two whole-table block writes: one whose source ids
// repeat (destinations distinct), one whose destination ids repeat.
func (g *blockEngine) repeated(c *rc) (*job, *job, []overlap, error) {
	const bl, blocks = 97, 24
	regions := 2 + c.rng.IntN(2)
	var jobs [2]*blockJob
	var ovs []overlap
	for side := range 2 {
		sp, err := layout(c, shapeApart, bl, blocks, regions, 2)
		if err != nil {
			return nil, nil, nil, err
		}
		dp, err := layout(c, shapeApart, bl, blocks, regions, 2)
		if err != nil {
			return nil, nil, nil, err
		}
		src := transfer.Blocks{Pool: sp.pool, IDs: drawIDs(c, 10, blocks, false)}
		dst := transfer.Blocks{Pool: dp.pool, IDs: drawIDs(c, 10, blocks, false)}
		ids := &src.IDs
		if side == 1 {
			ids = &dst.IDs
		}
		*ids = repeatIDs(c, blocks)
		jobs[side], err = g.write(c, sp, src, dp, dst, 0, src.Len(), fmt.Sprintf(" (ids %v repeat)", *ids))
		if err != nil {
			return nil, nil, nil, err
		}
		if side == 0 {
			continue
		}
		n := uint64(len(dst.IDs))
		for r := range regions {
			for _, slots := range repeatSlots {
				id := dst.IDs[slots[0]]
				ov := overlap{what: fmt.Sprintf("destination region %d block %d", r, id), dst: dp.piece(dp.bufs, r, id), want: dp.piece(jobs[side].want, r, id)}
				for _, k := range slots {
					ov.sources = append(ov.sources, append([]byte(nil), pieceOf(sp, sp.bufs, src, uint64(r)*n+k)...))
				}
				ovs = append(ovs, ov)
			}
		}
	}
	return jobs[0].job, jobs[1].job, ovs, nil
}

// ruleGeometry writes between tables of different shapes: 3 regions of 10
// ids into 2 regions of 15 and back, in chunks that cross region
// boundaries on one side and not the other.
func ruleGeometry(c *rc, g *blockEngine) error {
	for _, shapes := range [][2]int{{3, 2}, {2, 3}} {
		const bl, pieces = 129, 30
		var tabs [2]transfer.Blocks
		var pools [2]*blockPool
		for side, regions := range shapes {
			nIDs := uint64(pieces / regions)
			p, err := layout(c, shapeApart, bl, nIDs+3, regions, 2)
			if err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			pools[side], tabs[side] = p, transfer.Blocks{Pool: p.pool, IDs: drawIDs(c, nIDs, nIDs+3, false)}
		}
		if err := g.register(c, pools[0], pools[1]); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		// Each chunk's model starts from what memory holds after the
		// chunk before it.
		for _, chunk := range [][2]uint64{{0, pieces}, {7, 11}, {14, 2}} {
			j := g.prepare(pools[0], tabs[0], pools[1], tabs[1], chunk[0], chunk[1], "").job
			op, perr, err := c.post(j)
			if err != nil {
				return err
			}
			if perr != nil {
				if m := j.changed(); m != "" {
					c.tainted("%s wrote memory", j.what)
					return fmt.Errorf("%s was refused (%v) but %s: a refusal writes nothing", j.what, perr, m)
				}
				if !errors.Is(perr, transfer.ErrUnsupported) {
					return fmt.Errorf("%s: refused with %q; tables of different shapes are a valid transfer.BlockWrite: land it, or refuse it wrapping transfer.ErrUnsupported", j.what, perr)
				}
				c.note("%s refused as unsupported: %v", j.what, perr)
				return nil
			}
			o, err := c.wait(op, j.what)
			if err != nil {
				return err
			}
			_ = op.Release()
			if o.st != transfer.Done {
				return fmt.Errorf("%s: Poll reported %v; want done (or a refusal by the call wrapping transfer.ErrUnsupported)", j.what, o)
			}
			if m := j.mismatch(); m != "" {
				return fmt.Errorf("%s: %s", j.what, m)
			}
		}
	}
	return nil
}
