package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/bouncekv/bounce/transfer"
)

const (
	// magic is "BNCE" read as a little-endian uint32.
	magic     uint32 = 'B' | 'N'<<8 | 'C'<<16 | 'E'<<24
	headerLen        = 8

	strPrefix   = 2  // uint16 string length
	creditSize  = 33 // region, addr, len u64 + chunk u32 + device i32 + kind u8
	runTagLen   = 1
	runSingle   = 0 // tag: RegionOff, Addr, Len; Count 1, no strides
	runStrided  = 1 // tag: all six fields
	singleSize  = runTagLen + 3*8
	stridedSize = runTagLen + 6*8
	ackSize     = 8 + 4 + 8 + 8
	// pieceRangeSize is a block-table DATA's first and count.
	pieceRangeSize = 16
)

var le = binary.LittleEndian

// errorf wraps sentinel with the kind of encoding and a description of the
// field that failed.
func errorf(what string, sentinel error, format string, args ...any) error {
	return fmt.Errorf("wire: %s: %s: %w", what, fmt.Sprintf(format, args...), sentinel)
}

// ---- encoding ----

// Marshal encodes m into a new slice of exactly the encoded length.
func Marshal(m Message) ([]byte, error) {
	return AppendMarshal(nil, m)
}

// AppendMarshal appends the encoding of m to dst and returns the extended
// slice; it allocates only when dst lacks capacity. On error dst is returned
// unchanged. Encoding checks the same limits and invariants the decoder
// does, so every successful encoding decodes to an equal message.
func AppendMarshal(dst []byte, m Message) ([]byte, error) {
	n, err := EncodedLen(m)
	if err != nil {
		return dst, err
	}
	b := slices.Grow(dst, n) // every append below fits: no reallocation
	b = appendHeader(b, m.Type())
	switch m := m.(type) {
	case *Want:
		b = le.AppendUint64(b, m.Request)
		b = le.AppendUint32(b, uint32(len(m.ChunkBytes)))
		for _, c := range m.ChunkBytes {
			b = le.AppendUint64(b, c)
		}
		b = appendStr(b, m.Endpoint)
		b = appendStr(b, m.TraceParent)
		b = appendTag(b, m.Tag)
		if m.Blocks == nil {
			b = append(b, formDescs)
		} else {
			b = append(b, wantForm(m.Blocks))
			b = appendWantBlocks(b, m.Blocks)
		}
		b = le.AppendUint64(b, m.Incarnation)
	case *Grant:
		b = le.AppendUint64(b, m.Request)
		b = le.AppendUint32(b, uint32(len(m.Credits)))
		for i := range m.Credits {
			b = appendCredit(b, &m.Credits[i])
		}
	case *Data:
		b = appendData(b, m)
	case *Ack:
		b = le.AppendUint64(b, m.Request)
		b = le.AppendUint32(b, m.Chunk)
		b = le.AppendUint64(b, m.Region)
		b = le.AppendUint64(b, m.ScatterNS)
	case *Nack:
		b = le.AppendUint64(b, m.Request)
		b = le.AppendUint32(b, m.Chunk)
		b = le.AppendUint16(b, uint16(m.Code))
		b = appendStr(b, m.Reason)
	case *Done:
		b = le.AppendUint64(b, m.Request)
		b = le.AppendUint64(b, m.Bytes)
		b = appendStr(b, m.Endpoint)
		b = appendStr(b, m.Reason)
		b = appendStr(b, m.TraceParent)
		b = appendTag(b, m.Tag)
	case *Pull:
		b = appendPull(b, m)
	case *PullEnd:
		b = appendPullEnd(b, m)
	case *Staged:
		b = appendStaged(b, m)
	}
	return b, nil
}

// appendData appends an already validated DATA body.
func appendData(b []byte, m *Data) []byte {
	b = le.AppendUint64(b, m.Request)
	b = le.AppendUint32(b, m.Chunk)
	b = le.AppendUint64(b, m.Region)
	b = appendStr(b, m.TraceParent)
	b = le.AppendUint32(b, uint32(len(m.Runs)))
	if len(m.Runs) == 0 { // the block-table form
		b = le.AppendUint64(b, m.Pieces.First)
		b = le.AppendUint64(b, m.Pieces.Count)
	}
	return appendRuns(b, m.Runs)
}

// appendRuns appends already validated runs: a tag, then the fields.
func appendRuns(b []byte, runs []transfer.Run) []byte {
	for i := range runs {
		r := &runs[i]
		if isSingle(r) {
			b = append(b, runSingle)
			b = le.AppendUint64(b, r.RegionOff)
			b = le.AppendUint64(b, r.Addr)
			b = le.AppendUint64(b, r.Len)
			continue
		}
		b = append(b, runStrided)
		b = le.AppendUint64(b, r.RegionOff)
		b = le.AppendUint64(b, r.Addr)
		b = le.AppendUint64(b, r.Len)
		b = le.AppendUint64(b, r.Count)
		b = le.AppendUint64(b, r.RegionStride)
		b = le.AppendUint64(b, r.AddrStride)
	}
	return b
}

func isSingle(r *transfer.Run) bool {
	return r.Count == 1 && r.RegionStride == 0 && r.AddrStride == 0
}

// EncodedLen validates m and returns the length of its encoding.
func EncodedLen(m Message) (int, error) {
	switch m := m.(type) {
	case *Want:
		if m == nil {
			return 0, errorf("WANT", ErrMalformed, "nil message")
		}
		if len(m.ChunkBytes) > MaxChunks {
			return 0, errorf("WANT", ErrTooLarge, "%d chunks, limit %d", len(m.ChunkBytes), MaxChunks)
		}
		for i, c := range m.ChunkBytes {
			if c == 0 {
				return 0, errorf("WANT", ErrMalformed, "chunk_bytes[%d] is 0", i)
			}
		}
		if err := checkStr("WANT", "endpoint", m.Endpoint); err != nil {
			return 0, err
		}
		if err := checkStr("WANT", "traceparent", m.TraceParent); err != nil {
			return 0, err
		}
		if len(m.Tag) > MaxTag {
			return 0, errorf("WANT", ErrTooLarge, "tag is %d bytes, limit %d", len(m.Tag), MaxTag)
		}
		n := headerLen + 8 + 4 + 8*len(m.ChunkBytes) + strPrefix + len(m.Endpoint) + strPrefix + len(m.TraceParent) + strPrefix + len(m.Tag) + 1
		if m.Blocks != nil {
			if len(m.ChunkBytes) == 0 {
				return 0, errorf("WANT", ErrMalformed, "a cancel carries no blocks")
			}
			if len(m.Blocks.IDs) > MaxBlockIDs {
				return 0, errorf("WANT", ErrTooLarge, "%d block ids, limit %d", len(m.Blocks.IDs), MaxBlockIDs)
			}
			if why := m.Blocks.check(); why != "" {
				return 0, errorf("WANT", ErrMalformed, "blocks: %s", why)
			}
			n += wantBlocksLen(m.Blocks)
		}
		return n + 8, nil // the incarnation
	case *Grant:
		if m == nil {
			return 0, errorf("GRANT", ErrMalformed, "nil message")
		}
		if len(m.Credits) == 0 {
			return 0, errorf("GRANT", ErrMalformed, "no credits")
		}
		if len(m.Credits) > MaxCredits {
			return 0, errorf("GRANT", ErrTooLarge, "%d credits, limit %d", len(m.Credits), MaxCredits)
		}
		for i := range m.Credits {
			if why := checkCredit(&m.Credits[i]); why != "" {
				return 0, errorf("GRANT", ErrMalformed, "credits[%d]: %s", i, why)
			}
		}
		return headerLen + 8 + 4 + creditSize*len(m.Credits), nil
	case *Data:
		return dataLen("DATA", m)
	case *Ack:
		if m == nil {
			return 0, errorf("ACK", ErrMalformed, "nil message")
		}
		return headerLen + ackSize, nil
	case *Nack:
		if m == nil {
			return 0, errorf("NACK", ErrMalformed, "nil message")
		}
		if m.Code == 0 {
			return 0, errorf("NACK", ErrMalformed, "code 0")
		}
		if err := checkStr("NACK", "reason", m.Reason); err != nil {
			return 0, err
		}
		return headerLen + 8 + 4 + 2 + strPrefix + len(m.Reason), nil
	case *Done:
		if m == nil {
			return 0, errorf("DONE", ErrMalformed, "nil message")
		}
		if err := checkStr("DONE", "endpoint", m.Endpoint); err != nil {
			return 0, err
		}
		if err := checkStr("DONE", "reason", m.Reason); err != nil {
			return 0, err
		}
		if err := checkStr("DONE", "traceparent", m.TraceParent); err != nil {
			return 0, err
		}
		if len(m.Tag) > MaxTag {
			return 0, errorf("DONE", ErrTooLarge, "tag is %d bytes, limit %d", len(m.Tag), MaxTag)
		}
		return headerLen + 8 + 8 + strPrefix + len(m.Endpoint) + strPrefix + len(m.Reason) + strPrefix + len(m.TraceParent) + strPrefix + len(m.Tag), nil
	case *Pull:
		return pullLen(m)
	case *PullEnd:
		return pullEndLen(m)
	case *Staged:
		return stagedLen(m)
	case nil:
		return 0, fmt.Errorf("wire: nil message: %w", ErrMalformed)
	default:
		return 0, fmt.Errorf("wire: cannot encode %T (type %v): %w", m, m.Type(), ErrWrongType)
	}
}

// dataLen validates a DATA (what names the message carrying it) and returns
// its encoded length.
func dataLen(what string, m *Data) (int, error) {
	if m == nil {
		return 0, errorf(what, ErrMalformed, "nil message")
	}
	if len(m.Runs) == 0 && m.Pieces.Count == 0 {
		return 0, errorf(what, ErrMalformed, "no runs")
	}
	if len(m.Runs) > 0 && m.Pieces != (PieceRange{}) {
		return 0, errorf(what, ErrMalformed, "both runs and a piece range")
	}
	if len(m.Runs) > MaxRuns {
		return 0, errorf(what, ErrTooLarge, "%d runs, limit %d", len(m.Runs), MaxRuns)
	}
	if err := checkStr(what, "traceparent", m.TraceParent); err != nil {
		return 0, err
	}
	n := headerLen + 8 + 4 + 8 + strPrefix + len(m.TraceParent) + 4
	if len(m.Runs) == 0 {
		if why := m.Pieces.check(); why != "" {
			return 0, errorf(what, ErrMalformed, "%s", why)
		}
		return n + pieceRangeSize, nil
	}
	for i := range m.Runs {
		r := &m.Runs[i]
		if why := checkRun(r); why != "" {
			return 0, errorf(what, ErrMalformed, "runs[%d]: %s", i, why)
		}
		if isSingle(r) {
			n += singleSize
		} else {
			n += stridedSize
		}
	}
	return n, nil
}

func checkStr(what, field, s string) error {
	if len(s) > MaxString {
		return errorf(what, ErrTooLarge, "%s is %d bytes, limit %d", field, len(s), MaxString)
	}
	return nil
}

// checkRun returns why r cannot be carried, or "". The common cases are
// decided without building a message.
func checkRun(r *transfer.Run) string {
	if r.Len != 0 && r.Count == 1 && r.RegionOff <= math.MaxUint64-r.Len && r.Addr <= math.MaxUint64-r.Len {
		return ""
	}
	return describeRun(r)
}

func describeRun(r *transfer.Run) string {
	switch {
	case r.Len == 0:
		return "len 0"
	case r.Count == 0:
		return "count 0"
	}
	if _, _, ok := r.RegionSpan(); !ok {
		return fmt.Sprintf("region span overflows (off %d, len %d, count %d, stride %d)", r.RegionOff, r.Len, r.Count, r.RegionStride)
	}
	if _, _, ok := r.AddrSpan(); !ok {
		return fmt.Sprintf("address span overflows (addr %#x, len %d, count %d, stride %d)", r.Addr, r.Len, r.Count, r.AddrStride)
	}
	return ""
}

// checkCredit returns why c cannot be carried, or "".
func checkCredit(c *Credit) string {
	if c.Len != 0 && c.Addr <= math.MaxUint64-c.Len && c.Region <= math.MaxUint64-c.Len && c.Device >= 0 && c.Kind <= transfer.CUDA {
		return ""
	}
	return describeCredit(c)
}

func describeCredit(c *Credit) string {
	switch {
	case c.Len == 0:
		return "len 0"
	case c.Addr > math.MaxUint64-c.Len:
		return fmt.Sprintf("addr %#x + len %d overflows", c.Addr, c.Len)
	case c.Region > math.MaxUint64-c.Len:
		return fmt.Sprintf("region %d + len %d overflows", c.Region, c.Len)
	case c.Device < 0:
		return fmt.Sprintf("negative device %d", c.Device)
	default:
		return fmt.Sprintf("unknown memory kind %d (want host 0 or cuda 1)", uint8(c.Kind))
	}
}

// ---- decoding ----

// PeekType checks the header of an encoded message and returns its type
// without decoding the body.
func PeekType(b []byte) (Type, error) {
	t, err := readHeader(b, "message")
	if err != nil {
		return 0, err
	}
	if t < TypeWant || t > TypeStaged {
		return 0, fmt.Errorf("wire: message: header names %v, not a control message: %w", t, ErrWrongType)
	}
	if b[7] != 0 {
		return 0, errorf(t.String(), ErrMalformed, "reserved flags %#x", b[7])
	}
	return t, nil
}

// Unmarshal decodes one control message. The result shares no memory with b.
func Unmarshal(b []byte) (Message, error) {
	t, err := PeekType(b)
	if err != nil {
		return nil, err
	}
	d := decoder{b: b, off: headerLen, what: t.String()}
	var m Message
	switch t {
	case TypeWant:
		m, err = d.want()
	case TypeGrant:
		m, err = d.grant()
	case TypeData:
		out := new(Data)
		err = d.data(out)
		m = out
	case TypeAck:
		m, err = d.ack()
	case TypeNack:
		m, err = d.nack()
	case TypeDone:
		m, err = d.done()
	case TypePull:
		m, err = d.pull()
	case TypePullEnd:
		m, err = d.pullEnd()
	case TypeStaged:
		m, err = d.staged()
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

// UnmarshalData decodes a DATA message into out, reusing out.Runs' backing
// array when it is large enough, so a receiver that keeps one Data per worker
// decodes without allocating. Input of another type is ErrWrongType. On error
// out is left in an unspecified state.
func UnmarshalData(b []byte, out *Data) error {
	t, err := PeekType(b)
	if err != nil {
		return err
	}
	if t != TypeData {
		return fmt.Errorf("wire: DATA: input is %v: %w", t, ErrWrongType)
	}
	d := decoder{b: b, off: headerLen, what: "DATA"}
	return d.data(out)
}

// readHeader checks magic, length and version and returns the type byte.
func readHeader(b []byte, what string) (Type, error) {
	n := min(len(b), 4)
	for i := range n {
		if b[i] != byte(magic>>(8*i)) {
			return 0, fmt.Errorf("wire: %s: header magic %q, want %q: %w", what, b[:n], le.AppendUint32(nil, magic), ErrBadMagic)
		}
	}
	if len(b) < headerLen {
		return 0, fmt.Errorf("wire: %s: header needs %d bytes, have %d: %w", what, headerLen, len(b), ErrTruncated)
	}
	if v := le.Uint16(b[4:]); v != Version {
		return 0, fmt.Errorf("wire: %s: version %d, this codec speaks %d (peers must run the same bounce wire version; upgrade the older one): %w", what, v, Version, ErrBadVersion)
	}
	return Type(b[6]), nil
}

// expectHeader checks the header of a non-message encoding of kind want.
func expectHeader(b []byte, want Type) error {
	t, err := readHeader(b, want.String())
	if err != nil {
		return err
	}
	if t != want {
		return fmt.Errorf("wire: %v: header names %v: %w", want, t, ErrWrongType)
	}
	if b[7] != 0 {
		return errorf(want.String(), ErrMalformed, "reserved flags %#x", b[7])
	}
	return nil
}

// decoder reads fields in order. The first failure sticks in err and later
// reads return zero values, so callers check err once per step that matters.
type decoder struct {
	b    []byte
	off  int
	what string
	err  error
}

func (d *decoder) left() int { return len(d.b) - d.off }

func (d *decoder) need(field string, n int) bool {
	if d.err != nil {
		return false
	}
	if d.left() < n {
		d.err = errorf(d.what, ErrTruncated, "%s needs %d bytes, %d left", field, n, d.left())
		return false
	}
	return true
}

// take returns the next n bytes and advances past them, or nil (with d.err
// set) when fewer are left.
func (d *decoder) take(field string, n int) []byte {
	if !d.need(field, n) {
		return nil
	}
	v := d.b[d.off : d.off+n]
	d.off += n
	return v
}

func (d *decoder) u8(field string) uint8 {
	if b := d.take(field, 1); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) u16(field string) uint16 {
	if b := d.take(field, 2); b != nil {
		return le.Uint16(b)
	}
	return 0
}

func (d *decoder) u32(field string) uint32 {
	if b := d.take(field, 4); b != nil {
		return le.Uint32(b)
	}
	return 0
}

func (d *decoder) u64(field string) uint64 {
	if b := d.take(field, 8); b != nil {
		return le.Uint64(b)
	}
	return 0
}

// bytes reads n bytes after checking n against limit, returning a view of
// the input.
func (d *decoder) bytes(field string, n uint64, limit int) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(limit) {
		d.err = errorf(d.what, ErrTooLarge, "%s length %d, limit %d", field, n, limit)
		return nil
	}
	return d.take(field, int(n))
}

func (d *decoder) strBytes(field string) []byte {
	if d.err != nil {
		return nil
	}
	if d.left() < strPrefix {
		d.err = errorf(d.what, ErrTruncated, "%s length needs %d bytes, %d left", field, strPrefix, d.left())
		return nil
	}
	n := le.Uint16(d.b[d.off:])
	d.off += strPrefix
	return d.bytes(field, uint64(n), MaxString)
}

func (d *decoder) str(field string) string {
	return string(d.strBytes(field))
}

// count reads a uint32 entry count, rejecting counts over limit and counts
// whose entries (at least minEntry bytes each) cannot fit in what is left.
func (d *decoder) count(field string, limit, minEntry int) int {
	n := d.u32(field)
	if d.err != nil {
		return 0
	}
	if uint64(n) > uint64(limit) {
		d.err = errorf(d.what, ErrTooLarge, "%s %d, limit %d", field, n, limit)
		return 0
	}
	if need := uint64(n) * uint64(minEntry); need > uint64(d.left()) {
		d.err = errorf(d.what, ErrTruncated, "%s %d needs at least %d bytes, %d left", field, n, need, d.left())
		return 0
	}
	return int(n)
}

// end reports the sticky error, or ErrTrailing if input remains.
func (d *decoder) end() error {
	if d.err != nil {
		return d.err
	}
	if d.left() != 0 {
		return errorf(d.what, ErrTrailing, "%d bytes after the end", d.left())
	}
	return nil
}

func (d *decoder) want() (*Want, error) {
	w := &Want{Request: d.u64("request")}
	n := d.count("chunk count", MaxChunks, 8)
	if d.err != nil {
		return nil, d.err
	}
	if n > 0 {
		w.ChunkBytes = make([]uint64, n)
		b := d.b[d.off : d.off+8*n]
		for i := range w.ChunkBytes {
			c := le.Uint64(b[8*i:])
			if c == 0 {
				return nil, errorf(d.what, ErrMalformed, "chunk_bytes[%d] is 0", i)
			}
			w.ChunkBytes[i] = c
		}
		d.off += 8 * n
	}
	w.Endpoint = d.str("endpoint")
	w.TraceParent = d.str("traceparent")
	w.Tag = d.tag()
	switch form := d.u8("form"); {
	case d.err != nil:
	case form == formBlocks || form == formShaped:
		if n == 0 {
			return nil, errorf(d.what, ErrMalformed, "a cancel carries no blocks")
		}
		w.Blocks = d.wantBlocks(form == formShaped)
	case form != formDescs:
		return nil, errorf(d.what, ErrMalformed, "form %d, want 0 (descriptors), 1 (blocks) or 2 (shaped blocks)", form)
	}
	w.Incarnation = d.u64("incarnation")
	if err := d.end(); err != nil {
		return nil, err
	}
	return w, nil
}

func (d *decoder) grant() (*Grant, error) {
	g := &Grant{Request: d.u64("request")}
	n := d.count("credit count", MaxCredits, creditSize)
	if d.err != nil {
		return nil, d.err
	}
	if n == 0 {
		return nil, errorf(d.what, ErrMalformed, "no credits")
	}
	g.Credits = make([]Credit, n)
	b := d.b[d.off : d.off+creditSize*n]
	for i := range g.Credits {
		c := &g.Credits[i]
		*c = credit(b[creditSize*i:])
		if why := checkCredit(c); why != "" {
			return nil, errorf(d.what, ErrMalformed, "credits[%d]: %s", i, why)
		}
	}
	d.off += creditSize * n
	if err := d.end(); err != nil {
		return nil, err
	}
	return g, nil
}

func (d *decoder) data(out *Data) error {
	out.Request = d.u64("request")
	out.Chunk = d.u32("chunk")
	out.Region = d.u64("region")
	if tp := d.strBytes("traceparent"); string(tp) != out.TraceParent {
		out.TraceParent = string(tp)
	}
	n := d.count("run count", MaxRuns, singleSize)
	if d.err != nil {
		return d.err
	}
	if n == 0 { // the block-table form: a piece range instead of runs
		out.Runs = out.Runs[:0]
		out.Pieces = PieceRange{First: d.u64("first piece"), Count: d.u64("piece count")}
		if d.err != nil {
			return d.err
		}
		if why := out.Pieces.check(); why != "" {
			return errorf(d.what, ErrMalformed, "%s", why)
		}
		return d.end()
	}
	out.Pieces = PieceRange{}
	if cap(out.Runs) >= n {
		out.Runs = out.Runs[:n]
	} else {
		out.Runs = make([]transfer.Run, n)
	}
	b := d.b[d.off:]
	p := 0
	for i := range out.Runs {
		r := &out.Runs[i]
		if p >= len(b) {
			return errorf(d.what, ErrTruncated, "runs[%d] tag needs 1 byte, 0 left", i)
		}
		switch b[p] {
		case runSingle:
			if len(b)-p < singleSize {
				return errorf(d.what, ErrTruncated, "runs[%d] needs %d bytes, %d left", i, singleSize, len(b)-p)
			}
			w := b[p : p+singleSize]
			*r = transfer.Run{RegionOff: le.Uint64(w[1:]), Addr: le.Uint64(w[9:]), Len: le.Uint64(w[17:]), Count: 1}
			p += singleSize
		case runStrided:
			if len(b)-p < stridedSize {
				return errorf(d.what, ErrTruncated, "runs[%d] needs %d bytes, %d left", i, stridedSize, len(b)-p)
			}
			w := b[p : p+stridedSize]
			*r = transfer.Run{
				RegionOff:    le.Uint64(w[1:]),
				Addr:         le.Uint64(w[9:]),
				Len:          le.Uint64(w[17:]),
				Count:        le.Uint64(w[25:]),
				RegionStride: le.Uint64(w[33:]),
				AddrStride:   le.Uint64(w[41:]),
			}
			if isSingle(r) {
				return errorf(d.what, ErrMalformed, "runs[%d]: single copy in strided form (non-canonical)", i)
			}
			p += stridedSize
		default:
			return errorf(d.what, ErrMalformed, "runs[%d]: unknown tag %d", i, b[p])
		}
		if why := checkRun(r); why != "" {
			return errorf(d.what, ErrMalformed, "runs[%d]: %s", i, why)
		}
	}
	d.off += p
	return d.end()
}

func (d *decoder) ack() (*Ack, error) {
	a := &Ack{Request: d.u64("request"), Chunk: d.u32("chunk"), Region: d.u64("region"), ScatterNS: d.u64("scatter ns")}
	if err := d.end(); err != nil {
		return nil, err
	}
	return a, nil
}

func (d *decoder) nack() (*Nack, error) {
	n := &Nack{Request: d.u64("request"), Chunk: d.u32("chunk"), Code: NackCode(d.u16("code"))}
	if d.err == nil && n.Code == 0 {
		return nil, errorf(d.what, ErrMalformed, "code 0")
	}
	n.Reason = d.str("reason")
	if err := d.end(); err != nil {
		return nil, err
	}
	return n, nil
}

func (d *decoder) done() (*Done, error) {
	m := &Done{Request: d.u64("request"), Bytes: d.u64("bytes")}
	m.Endpoint = d.str("endpoint")
	m.Reason = d.str("reason")
	m.TraceParent = d.str("traceparent")
	m.Tag = d.tag()
	if err := d.end(); err != nil {
		return nil, err
	}
	return m, nil
}

// tag reads a caller tag (uint16 length, at most MaxTag bytes); an empty
// one decodes as nil.
func (d *decoder) tag() []byte {
	n := d.u16("tag length")
	t := d.bytes("tag", uint64(n), MaxTag)
	if d.err != nil || n == 0 {
		return nil
	}
	return append([]byte(nil), t...)
}

// appendTag appends a validated caller tag: its uint16 length, then it.
func appendTag(b, tag []byte) []byte {
	b = le.AppendUint16(b, uint16(len(tag)))
	return append(b, tag...)
}
