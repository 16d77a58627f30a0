package wire

import (
	"fmt"
	"math"
	"slices"

	"github.com/bouncekv/bounce/transfer"
)

// The pull messages (wire version 6; version 7 the descriptor form's
// encoding): a receiver that is ready for a request's bytes asks the peer
// holding them to send them (PULL), with the
// grant of its first regions in the same message, and the holder answers
// with the push machinery — gather, write into the granted regions, DATA,
// ACK — or ends the pull with a reason (PULL_END). When the PULL says the
// puller can read (Read) and the holder's engine serves reads, the holder
// writes nothing: it offers each gathered chunk where it staged it
// (STAGED: the staged region and the chunk's DATA), the puller reads it
// into its granted region, scatters it and ACKs, and the ACK (or the end
// of the pull) ends the holder's read grant.
//
// A pull's messages name it by PullID(the puller's request id): DATA from
// the holder, GRANT, ACK and NACK from the puller. Ids with PullBit set are
// never a pushed request's, so the holder tells a pull's GRANT or ACK from
// a push request's of its own, and the puller a pull's DATA from a push.

// PullBit marks a request id as a pull's (PullID).
const PullBit uint64 = 1 << 63

// PullID is the id the messages of a pull carry: the puller's request id
// with PullBit set.
func PullID(request uint64) uint64 { return request | PullBit }

// IsPullID reports whether id names a pull (PullBit set).
func IsPullID(id uint64) bool { return id&PullBit != 0 }

// Pull limits.
const (
	// MaxPullDescs is the most source descriptors one PULL may carry.
	MaxPullDescs = 1 << 22
	// pullDescSize is one encoded descriptor: addr, len u64, device i32,
	// kind u8.
	pullDescSize = 8 + 8 + 4 + 1
	// pullGroupSize is a descriptor group's header: its count u32, the
	// len u64, device i32 and kind u8 its descriptors share, their base
	// address u64 and the width u8 of each one's offset from it (4 or 8).
	pullGroupSize = 4 + 8 + 4 + 1 + 8 + 1
)

// Pull asks the peer that holds a request's source memory to send it
// (puller → holder). Request is the puller's id (its messages carry
// PullID(Request)). ChunkBytes is the puller's plan of the request: the
// holder packs the sources into exactly these chunks (plan.LayoutInto) and
// refuses a plan they do not fill; an empty ChunkBytes cancels the pull
// (the puller gave it up). Credits are the regions the puller granted
// before asking (possibly none: more come in GRANTs), so the holder can
// gather and write at once. Src (the descriptor form: the holder's memory,
// in the puller's order) or Blocks (the block-table form) name what moves;
// a cancel carries neither. Where the bytes land is the puller's business
// in both forms: each DATA names its chunk's piece range and the puller
// scatters it by its own plan, so the holder never sees the puller's
// addresses. Endpoint, TraceParent, Tag and Incarnation are as in Want.
// MinChunk is the puller's chunk ramp (a block pull is planned with it at
// both ends). Read says the puller can read the holder's staged regions
// (its engine is a transfer.Reader and bounce.pull_read allows it): the
// holder may answer with STAGED instead of writing.
//
// The descriptor form is encoded in groups of consecutive descriptors
// sharing a length, device and memory kind, each a base address and the
// descriptors' offsets from it (4 bytes a descriptor for the blocks of a
// KV buffer under 4 GiB; version 7).
type Pull struct {
	Request     uint64
	ChunkBytes  []uint64
	MinChunk    uint64
	Endpoint    string
	TraceParent string
	Tag         []byte
	Incarnation uint64
	Credits     []Credit
	Src         []transfer.Desc
	Blocks      *PullBlocks
	Read        bool
}

// Type returns TypePull.
func (*Pull) Type() Type { return TypePull }

// IsCancel reports whether p cancels its pull (no chunk sizes).
func (p *Pull) IsCancel() bool { return len(p.ChunkBytes) == 0 }

// PullBlocks is the block-table form of a PULL: the pieces of the
// holder's pool SrcPool, blocks SrcIDs (1 to MaxBlockIDs ids), numbered
// region-major as in transfer.Blocks. Where they land is the puller's
// business: its pool has the same geometry (it checked the holder's
// advertised pool), each DATA names a piece range and the puller scatters
// it into its own blocks, so the holder needs neither its pool nor its ids.
type PullBlocks struct {
	SrcPool string
	SrcIDs  []uint32
}

// NackGaveUp: the holder of a pull gave it up (a failed gather or write,
// its timeout); PULL_END carries the cause. Its value leaves room for the
// codes of wire.go.
const NackGaveUp NackCode = 32

// PullEnd ends a pull on the holder's side (holder → puller): the holder
// refused it before anything moved, or gave it up (a failed gather or
// write, a cancel, shutdown), with a code and a reason the puller's batch
// reports. Unproven says a write into the puller's regions ended without
// proof that it stopped: the puller quarantines them instead of freeing
// them. A holder sends it once no write of the pull is outstanding.
type PullEnd struct {
	Request  uint64 // the puller's request id (not PullID)
	Code     NackCode
	Reason   string
	Unproven bool
}

// Type returns TypePullEnd.
func (*PullEnd) Type() Type { return TypePullEnd }

// pullLen validates p and returns its encoded length.
func pullLen(p *Pull) (int, error) {
	const what = "PULL"
	if p == nil {
		return 0, errorf(what, ErrMalformed, "nil message")
	}
	if len(p.ChunkBytes) > MaxChunks {
		return 0, errorf(what, ErrTooLarge, "%d chunks, limit %d", len(p.ChunkBytes), MaxChunks)
	}
	for i, c := range p.ChunkBytes {
		if c == 0 {
			return 0, errorf(what, ErrMalformed, "chunk_bytes[%d] is 0", i)
		}
	}
	for _, f := range []struct{ name, v string }{{"endpoint", p.Endpoint}, {"traceparent", p.TraceParent}} {
		if err := checkStr(what, f.name, f.v); err != nil {
			return 0, err
		}
	}
	if len(p.Tag) > MaxTag {
		return 0, errorf(what, ErrTooLarge, "tag is %d bytes, limit %d", len(p.Tag), MaxTag)
	}
	if len(p.Credits) > MaxCredits {
		return 0, errorf(what, ErrTooLarge, "%d credits, limit %d", len(p.Credits), MaxCredits)
	}
	for i := range p.Credits {
		if why := checkCredit(&p.Credits[i]); why != "" {
			return 0, errorf(what, ErrMalformed, "credits[%d]: %s", i, why)
		}
	}
	if why := p.checkForm(); why != "" {
		return 0, errorf(what, ErrMalformed, "%s", why)
	}
	if len(p.Src) > MaxPullDescs {
		return 0, errorf(what, ErrTooLarge, "%d descriptors, limit %d", len(p.Src), MaxPullDescs)
	}
	if b := p.Blocks; b != nil && len(b.SrcIDs) > MaxBlockIDs {
		return 0, errorf(what, ErrTooLarge, "%d block ids, limit %d", len(b.SrcIDs), MaxBlockIDs)
	}
	n := headerLen + 8 + 4 + 8*len(p.ChunkBytes) + 8 + strPrefix + len(p.Endpoint) + strPrefix + len(p.TraceParent) +
		strPrefix + len(p.Tag) + 8 + 1 + 4 + creditSize*len(p.Credits) + 1
	if b := p.Blocks; b != nil {
		return n + strPrefix + len(b.SrcPool) + 4 + 4*len(b.SrcIDs), nil
	}
	n += 4 + 4
	for g := range descGroups(p.Src) {
		// The group's descriptors share all but the address: the first
		// is checked whole, the others only for wrapping (the highest).
		if why := checkPullDesc(p.Src[g.i]); why != "" {
			return 0, errorf(what, ErrMalformed, "src[%d]: %s", g.i, why)
		}
		if l := p.Src[g.i].Len; g.hi > math.MaxUint64-l {
			i := g.i + slices.IndexFunc(p.Src[g.i:g.j], func(d transfer.Desc) bool { return d.Addr > math.MaxUint64-l })
			return 0, errorf(what, ErrMalformed, "src[%d]: %s", i, checkPullDesc(p.Src[i]))
		}
		n += pullGroupSize + g.width*(g.j-g.i)
	}
	return n, nil
}

// descGroup is one group of a PULL's descriptors, Src[i:j]: consecutive
// descriptors sharing a length, device and kind, their addresses encoded
// as offsets from the lowest (base), width bytes each (4 when the group
// spans less than 4 GiB, as a KV buffer's blocks do).
type descGroup struct {
	i, j, width int
	base, hi    uint64 // the lowest and highest address
}

// sameGroup reports whether a and b share a length, device and kind (a
// group's descriptors do).
func sameGroup(a, b transfer.Desc) bool {
	return a.Len == b.Len && a.Device == b.Device && a.Kind == b.Kind
}

// descGroups yields the groups ds is encoded in.
func descGroups(ds []transfer.Desc) func(yield func(descGroup) bool) {
	return func(yield func(descGroup) bool) {
		for i := 0; i < len(ds); {
			lo, hi := ds[i].Addr, ds[i].Addr
			j := i + 1
			for ; j < len(ds) && sameGroup(ds[i], ds[j]); j++ {
				lo, hi = min(lo, ds[j].Addr), max(hi, ds[j].Addr)
			}
			g := descGroup{i: i, j: j, width: 8, base: lo, hi: hi}
			if hi-lo <= math.MaxUint32 {
				g.width = 4
			}
			if !yield(g) {
				return
			}
			i = j
		}
	}
}

// checkForm says why p's form breaks an invariant, or "".
func (p *Pull) checkForm() string {
	cancel := len(p.ChunkBytes) == 0
	if cancel {
		if p.Blocks != nil || len(p.Src) > 0 || len(p.Credits) > 0 || p.Read {
			return "a cancel carries no blocks, descriptors, credits or read flag"
		}
		return ""
	}
	if b := p.Blocks; b != nil {
		if len(p.Src) > 0 {
			return "both descriptors and blocks"
		}
		switch {
		case CheckPoolName(b.SrcPool) != nil:
			return fmt.Sprintf("source %v", CheckPoolName(b.SrcPool))
		case len(b.SrcIDs) == 0:
			return "no block ids"
		}
		return ""
	}
	if len(p.Src) == 0 {
		return "no descriptors" // each is checked by group (pullLen)
	}
	return ""
}

func checkPullDesc(d transfer.Desc) string {
	switch {
	case d.Len == 0:
		return "len 0"
	case d.Addr+d.Len < d.Addr:
		return fmt.Sprintf("addr %#x + len %d overflows", d.Addr, d.Len)
	case d.Device < 0:
		return fmt.Sprintf("negative device %d", d.Device)
	case d.Kind > transfer.CUDA:
		return fmt.Sprintf("unknown memory kind %d", uint8(d.Kind))
	}
	return ""
}

func appendPull(b []byte, p *Pull) []byte {
	b = le.AppendUint64(b, p.Request)
	b = le.AppendUint32(b, uint32(len(p.ChunkBytes)))
	for _, c := range p.ChunkBytes {
		b = le.AppendUint64(b, c)
	}
	b = le.AppendUint64(b, p.MinChunk)
	b = appendStr(b, p.Endpoint)
	b = appendStr(b, p.TraceParent)
	b = appendTag(b, p.Tag)
	b = le.AppendUint64(b, p.Incarnation)
	flags := byte(0)
	if p.Read {
		flags = pullRead
	}
	b = append(b, flags)
	b = le.AppendUint32(b, uint32(len(p.Credits)))
	for i := range p.Credits {
		b = appendCredit(b, &p.Credits[i])
	}
	if bl := p.Blocks; bl != nil {
		b = append(b, formBlocks)
		b = appendStr(b, bl.SrcPool)
		b = le.AppendUint32(b, uint32(len(bl.SrcIDs)))
		for _, id := range bl.SrcIDs {
			b = le.AppendUint32(b, id)
		}
		return b
	}
	b = append(b, formDescs)
	b = le.AppendUint32(b, uint32(len(p.Src)))
	at := len(b) // the group count, known at the end
	b = le.AppendUint32(b, 0)
	groups := 0
	for g := range descGroups(p.Src) {
		d := p.Src[g.i]
		b = le.AppendUint32(b, uint32(g.j-g.i))
		b = le.AppendUint64(b, d.Len)
		b = le.AppendUint32(b, uint32(d.Device))
		b = append(b, byte(d.Kind))
		b = le.AppendUint64(b, g.base)
		b = append(b, byte(g.width))
		if g.width == 4 {
			for _, e := range p.Src[g.i:g.j] {
				b = le.AppendUint32(b, uint32(e.Addr-g.base))
			}
		} else {
			for _, e := range p.Src[g.i:g.j] {
				b = le.AppendUint64(b, e.Addr-g.base)
			}
		}
		groups++
	}
	le.PutUint32(b[at:], uint32(groups))
	return b
}

// pullDescs decodes the descriptor form's groups (appendPull): k
// descriptors, every group at least one of them.
func (d *decoder) pullDescs() []transfer.Desc {
	k := d.count("descriptor count", MaxPullDescs, 4)
	g := d.count("descriptor group count", MaxPullDescs, pullGroupSize)
	switch {
	case d.err != nil:
		return nil
	case g > k:
		d.err = errorf(d.what, ErrMalformed, "%d descriptor groups for %d descriptors", g, k)
		return nil
	case k == 0:
		return nil
	}
	src := make([]transfer.Desc, k)
	next := 0
	for j := range g {
		h := d.take("descriptor group", pullGroupSize)
		if d.err != nil {
			return nil
		}
		n := uint64(le.Uint32(h))
		shared := transfer.Desc{Len: le.Uint64(h[4:]), Device: int32(le.Uint32(h[12:])), Kind: transfer.MemKind(h[16])}
		base, width := le.Uint64(h[17:]), int(h[25])
		switch {
		case n == 0:
			d.err = errorf(d.what, ErrMalformed, "descriptor group %d is empty", j)
		case n > uint64(k-next):
			d.err = errorf(d.what, ErrMalformed, "descriptor group %d holds %d descriptors, %d of the count are left", j, n, k-next)
		case width != 4 && width != 8:
			d.err = errorf(d.what, ErrMalformed, "descriptor group %d: offset width %d, want 4 or 8", j, width)
		case next > 0 && sameGroup(src[next-1], shared):
			// The encoder's groups are maximal: one encoding per list.
			d.err = errorf(d.what, ErrMalformed, "descriptor group %d shares the previous group's length, device and kind", j)
		}
		a := d.take("descriptor offsets", width*int(n))
		if d.err != nil {
			return nil
		}
		out := src[next : next+int(n)]
		lo, hi := uint64(math.MaxUint64), uint64(0) // base + hi must not wrap
		if width == 4 {
			for i := range out {
				off := uint64(le.Uint32(a[4*i:]))
				lo, hi = min(lo, off), max(hi, off)
				shared.Addr = base + off
				out[i] = shared
			}
		} else {
			for i := range out {
				off := le.Uint64(a[8*i:])
				lo, hi = min(lo, off), max(hi, off)
				shared.Addr = base + off
				out[i] = shared
			}
		}
		switch {
		case base+hi < base:
			d.err = errorf(d.what, ErrMalformed, "descriptor group %d: base %#x + offset %#x overflows", j, base, hi)
		case lo != 0:
			d.err = errorf(d.what, ErrMalformed, "descriptor group %d: base %#x is not its lowest address (offsets from %#x)", j, base, lo)
		case width == 8 && hi <= math.MaxUint32:
			d.err = errorf(d.what, ErrMalformed, "descriptor group %d: 8-byte offsets where 4 hold them", j)
		}
		if d.err != nil {
			return nil
		}
		next += int(n)
	}
	if next != k {
		d.err = errorf(d.what, ErrMalformed, "descriptor groups hold %d descriptors, the count says %d", next, k)
		return nil
	}
	return src
}

// pullRead is the PULL flag of a puller that can read (Pull.Read).
const pullRead byte = 1

func appendDesc(b []byte, d transfer.Desc) []byte {
	b = le.AppendUint64(b, d.Addr)
	b = le.AppendUint64(b, d.Len)
	b = le.AppendUint32(b, uint32(d.Device))
	return append(b, byte(d.Kind))
}

func decodeDesc(e []byte) transfer.Desc {
	return transfer.Desc{Addr: le.Uint64(e[0:]), Len: le.Uint64(e[8:]), Device: int32(le.Uint32(e[16:])), Kind: transfer.MemKind(e[20])}
}

// Staged offers a pull's chunk for the puller to read (holder → puller),
// the holder having gathered it into its own staging region Src: the
// puller reads Src (Data's chunk's bytes, Src.Len of them) into its
// granted region Data.Region, then scatters and ACKs it as if Data had
// come after a write. Until that ACK, or the pull's end, the holder lets
// the puller read Src and nothing else of its memory.
type Staged struct {
	Src  transfer.Desc
	Data Data
}

// Type returns TypeStaged.
func (*Staged) Type() Type { return TypeStaged }

func stagedLen(m *Staged) (int, error) {
	const what = "STAGED"
	if m == nil {
		return 0, errorf(what, ErrMalformed, "nil message")
	}
	if why := checkPullDesc(m.Src); why != "" {
		return 0, errorf(what, ErrMalformed, "src: %s", why)
	}
	n, err := dataLen(what, &m.Data)
	return n + pullDescSize, err
}

func appendStaged(b []byte, m *Staged) []byte {
	return appendData(appendDesc(b, m.Src), &m.Data)
}

func (d *decoder) staged() (*Staged, error) {
	m := &Staged{}
	e := d.take("src", pullDescSize)
	if d.err != nil {
		return nil, d.err
	}
	m.Src = decodeDesc(e)
	if why := checkPullDesc(m.Src); why != "" {
		return nil, errorf(d.what, ErrMalformed, "src: %s", why)
	}
	if err := d.data(&m.Data); err != nil {
		return nil, err
	}
	return m, nil
}

// credit decodes the credit at the start of e (creditSize bytes; the
// caller checked they are there). GRANT and PULL carry credits alike.
func credit(e []byte) Credit {
	return Credit{Region: le.Uint64(e[0:]), Addr: le.Uint64(e[8:]), Len: le.Uint64(e[16:]),
		Chunk: le.Uint32(e[24:]), Device: int32(le.Uint32(e[28:])), Kind: transfer.MemKind(e[32])}
}

// appendCredit encodes c (creditSize bytes), as GRANT and PULL carry it.
func appendCredit(b []byte, c *Credit) []byte {
	b = le.AppendUint64(b, c.Region)
	b = le.AppendUint64(b, c.Addr)
	b = le.AppendUint64(b, c.Len)
	b = le.AppendUint32(b, c.Chunk)
	b = le.AppendUint32(b, uint32(c.Device))
	return append(b, byte(c.Kind))
}

func (d *decoder) pull() (*Pull, error) {
	p := &Pull{Request: d.u64("request")}
	n := d.count("chunk count", MaxChunks, 8)
	if d.err != nil {
		return nil, d.err
	}
	if n > 0 {
		p.ChunkBytes = make([]uint64, n)
		for i := range p.ChunkBytes {
			p.ChunkBytes[i] = le.Uint64(d.b[d.off+8*i:])
		}
		d.off += 8 * n
	}
	p.MinChunk = d.u64("min chunk")
	p.Endpoint = d.str("endpoint")
	p.TraceParent = d.str("traceparent")
	p.Tag = d.tag()
	p.Incarnation = d.u64("incarnation")
	switch f := d.u8("flags"); {
	case d.err != nil:
	case f&^pullRead != 0:
		return nil, errorf(d.what, ErrMalformed, "flags %#x, want 0 or %#x (read)", f, pullRead)
	default:
		p.Read = f == pullRead
	}
	if nc := d.count("credit count", MaxCredits, creditSize); d.err == nil && nc > 0 {
		p.Credits = make([]Credit, nc)
		for i := range p.Credits {
			p.Credits[i] = credit(d.b[d.off+creditSize*i:])
		}
		d.off += creditSize * nc
	}
	switch form := d.u8("form"); {
	case d.err != nil:
	case form == formBlocks:
		bl := &PullBlocks{SrcPool: d.str("source pool")}
		k := d.count("block id count", MaxBlockIDs, 4)
		if d.err != nil {
			break
		}
		bl.SrcIDs = make([]uint32, k)
		for i := range k {
			bl.SrcIDs[i] = le.Uint32(d.b[d.off+4*i:])
		}
		d.off += 4 * k
		p.Blocks = bl
	case form == formDescs:
		p.Src = d.pullDescs()
	default:
		return nil, errorf(d.what, ErrMalformed, "form %d, want 0 (descriptors) or 1 (blocks)", form)
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	// The same checks as the encoder's, so every decoded PULL encodes.
	if _, err := pullLen(p); err != nil {
		return nil, err
	}
	return p, nil
}

func pullEndLen(m *PullEnd) (int, error) {
	const what = "PULL_END"
	if m == nil {
		return 0, errorf(what, ErrMalformed, "nil message")
	}
	if m.Code == 0 {
		return 0, errorf(what, ErrMalformed, "code 0")
	}
	if err := checkStr(what, "reason", m.Reason); err != nil {
		return 0, err
	}
	return headerLen + 8 + 2 + 1 + strPrefix + len(m.Reason), nil
}

func appendPullEnd(b []byte, m *PullEnd) []byte {
	b = le.AppendUint64(b, m.Request)
	b = le.AppendUint16(b, uint16(m.Code))
	flags := byte(0)
	if m.Unproven {
		flags = 1
	}
	b = append(b, flags)
	return appendStr(b, m.Reason)
}

func (d *decoder) pullEnd() (*PullEnd, error) {
	m := &PullEnd{Request: d.u64("request"), Code: NackCode(d.u16("code"))}
	switch f := d.u8("flags"); {
	case d.err != nil:
	case f > 1:
		return nil, errorf(d.what, ErrMalformed, "flags %#x, want 0 or 1 (unproven)", f)
	default:
		m.Unproven = f == 1
	}
	if d.err == nil && m.Code == 0 {
		return nil, errorf(d.what, ErrMalformed, "code 0")
	}
	m.Reason = d.str("reason")
	if err := d.end(); err != nil {
		return nil, err
	}
	return m, nil
}
