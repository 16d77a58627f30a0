package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// Wire limits. Every length a peer sends is checked against them before
// anything is allocated or read.
const (
	// MaxFramePayload is the most payload bytes one WRITE frame carries.
	// Larger posts are split into several frames.
	MaxFramePayload = 16 << 20
	// MaxSegments is the most {dst, len} entries in one WRITE frame.
	MaxSegments = 1 << 16
	// MaxNotification is the largest notification payload.
	MaxNotification = 1 << 20
	// MaxNameLen is the longest engine name.
	MaxNameLen = transfer.MaxNameLen
	// MaxAddrLen is the longest advertised address.
	MaxAddrLen = 255
	// MaxRanges is the most registered ranges metadata may carry.
	MaxRanges = 1 << 16
	// MaxMetadata is the largest metadata blob.
	MaxMetadata = metaFixed + MaxNameLen + MaxAddrLen + MaxRanges*16 + 8 // + the incarnation
	// maxNackText bounds the reason text in a NACK.
	maxNackText = 1024
)

// Frame types. Every frame starts with a 16-byte header:
//
//	[0] type  [1] protocol version  [2:4] zero  [4:8] body length (LE)  [8:16] id (LE)
//
// HELLO (id 0): body is the sender's metadata; first frame on a connection.
// WRITE (id = part id): body is count u32 then count × {dst u64, len u64};
// the sum of the lengths in payload bytes follows the body.
// ACK (id = part id): no body; the payload is in place at the receiver.
// NACK (id = part id, or 0 for a rejected HELLO): body is a reason code
// byte followed by reason text; nothing of the part was written.
// NOTIF (id 0): body is the notification payload.
// READ (id = part id, dialer → listener): body is count u32 then count ×
// {src u64, len u64}: the listener's memory the dialer asks to read.
// READ_DATA (id = part id, listener → dialer): no body; the bytes of the
// READ's segments, in order, follow the header. A READ the listener
// refuses is answered with a NACK instead, and nothing of it is sent.
const (
	frameHello    byte = 1
	frameWrite    byte = 2
	frameAck      byte = 3
	frameNack     byte = 4
	frameNotif    byte = 5
	frameRead     byte = 6
	frameReadData byte = 7

	protoVersion = 1
	headerSize   = 16
)

// NACK reason codes, mapped to transfer sentinels on the sender.
const (
	nackOther         byte = 1
	nackOutOfBounds   byte = 2
	nackNotRegistered byte = 3
	nackBadMetadata   byte = 4
	nackForbidden     byte = 5
)

// errProtocol marks a malformed frame; the connection carrying it is closed.
var errProtocol = errors.New("tcp: protocol violation")

type frameHeader struct {
	typ     byte
	bodyLen uint32
	id      uint64
}

// putHeader encodes h into b[:headerSize].
func putHeader(b []byte, h frameHeader) {
	b[0] = h.typ
	b[1] = protoVersion
	b[2], b[3] = 0, 0
	binary.LittleEndian.PutUint32(b[4:8], h.bodyLen)
	binary.LittleEndian.PutUint64(b[8:16], h.id)
}

// maxBody returns the largest body a frame of type typ may declare.
func maxBody(typ byte) (uint32, bool) {
	switch typ {
	case frameHello:
		return MaxMetadata, true
	case frameWrite, frameRead:
		return 4 + 16*MaxSegments, true
	case frameAck, frameReadData:
		return 0, true
	case frameNack:
		return 1 + maxNackText, true
	case frameNotif:
		return MaxNotification, true
	}
	return 0, false
}

// parseHeader decodes and bounds-checks a frame header.
func parseHeader(b []byte) (frameHeader, error) {
	if len(b) != headerSize {
		return frameHeader{}, fmt.Errorf("header of %d bytes, want %d: %w", len(b), headerSize, errProtocol)
	}
	h := frameHeader{typ: b[0], bodyLen: binary.LittleEndian.Uint32(b[4:8]), id: binary.LittleEndian.Uint64(b[8:16])}
	if b[1] != protoVersion {
		return h, fmt.Errorf("protocol version %d, want %d: %w", b[1], protoVersion, errProtocol)
	}
	if b[2] != 0 || b[3] != 0 {
		return h, fmt.Errorf("reserved header bytes not zero: %w", errProtocol)
	}
	limit, ok := maxBody(h.typ)
	if !ok {
		return h, fmt.Errorf("unknown frame type %d: %w", h.typ, errProtocol)
	}
	if h.bodyLen > limit {
		return h, fmt.Errorf("frame type %d body of %d bytes exceeds %d: %w", h.typ, h.bodyLen, limit, errProtocol)
	}
	if (h.typ == frameWrite || h.typ == frameRead) && h.bodyLen < 4 {
		return h, fmt.Errorf("frame type %d body of %d bytes is too short: %w", h.typ, h.bodyLen, errProtocol)
	}
	if h.typ == frameNack && h.bodyLen < 1 {
		return h, fmt.Errorf("nack frame without reason code: %w", errProtocol)
	}
	return h, nil
}

// segment is one destination range of a WRITE frame (one source range
// of a READ: the same encoding).
type segment struct{ addr, n uint64 }

// parseWriteBody decodes a WRITE (or READ) body into segs (reused when
// large enough) and returns the payload length that follows (is asked for). Every segment is non-empty,
// does not wrap, and the total is at most MaxFramePayload.
func parseWriteBody(body []byte, segs []segment) ([]segment, uint64, error) {
	if len(body) < 4 {
		return nil, 0, fmt.Errorf("write body of %d bytes is too short: %w", len(body), errProtocol)
	}
	count := binary.LittleEndian.Uint32(body)
	if count == 0 || count > MaxSegments {
		return nil, 0, fmt.Errorf("write frame with %d segments (want 1..%d): %w", count, MaxSegments, errProtocol)
	}
	if uint64(len(body)) != 4+16*uint64(count) {
		return nil, 0, fmt.Errorf("write body of %d bytes does not hold %d segments: %w", len(body), count, errProtocol)
	}
	segs = segs[:0]
	var total uint64
	for i := range int(count) {
		b := body[4+16*i:]
		s := segment{addr: binary.LittleEndian.Uint64(b), n: binary.LittleEndian.Uint64(b[8:])}
		if s.n == 0 || s.n > MaxFramePayload || s.addr+s.n < s.addr {
			return nil, 0, fmt.Errorf("segment %d [%#x+%d] is empty, too long or wraps: %w", i, s.addr, s.n, errProtocol)
		}
		total += s.n
		if total > MaxFramePayload {
			return nil, 0, fmt.Errorf("write frame payload exceeds %d bytes: %w", MaxFramePayload, errProtocol)
		}
		segs = append(segs, s)
	}
	return segs, total, nil
}

// appendSegment appends one encoded segment to a WRITE body.
func appendSegment(b []byte, addr, n uint64) []byte {
	b = binary.LittleEndian.AppendUint64(b, addr)
	return binary.LittleEndian.AppendUint64(b, n)
}

// encodeFrame returns a complete frame with a body (for small frames).
func encodeFrame(typ byte, id uint64, body []byte) []byte {
	b := make([]byte, headerSize+len(body))
	putHeader(b, frameHeader{typ: typ, bodyLen: uint32(len(body)), id: id})
	copy(b[headerSize:], body)
	return b
}

// encodeNack returns a NACK frame for part id with a reason.
func encodeNack(id uint64, code byte, text string) []byte {
	if len(text) > maxNackText {
		text = text[:maxNackText]
	}
	return encodeFrame(frameNack, id, append([]byte{code}, text...))
}

// parseNack decodes a NACK body into the error it reports.
func parseNack(body []byte) (code byte, text string, err error) {
	if len(body) < 1 || len(body) > 1+maxNackText {
		return 0, "", fmt.Errorf("nack body of %d bytes: %w", len(body), errProtocol)
	}
	return body[0], string(body[1:]), nil
}

// nackSentinel maps a NACK code to the transfer sentinel it reports.
func nackSentinel(code byte) error {
	switch code {
	case nackForbidden:
		return transfer.ErrForbidden
	case nackOutOfBounds:
		return transfer.ErrOutOfBounds
	case nackNotRegistered:
		return transfer.ErrNotRegistered
	case nackBadMetadata:
		return transfer.ErrBadMetadata
	}
	return errRemote
}

// nackCode maps a local validation error to a NACK code.
func nackCode(err error) byte {
	switch {
	case errors.Is(err, transfer.ErrForbidden):
		return nackForbidden
	case errors.Is(err, transfer.ErrOutOfBounds):
		return nackOutOfBounds
	case errors.Is(err, transfer.ErrNotRegistered):
		return nackNotRegistered
	case errors.Is(err, transfer.ErrBadMetadata):
		return nackBadMetadata
	}
	return nackOther
}

// errRemote is reported for a NACK without a known sentinel.
var errRemote = errors.New("tcp: remote error")

// Metadata layout (little-endian), version 1:
//
//	"BKVT" u16 version, u16 nameLen, name, u16 addrLen, addr,
//	u32 count, count × {addr u64, len u64} (sorted, non-overlapping)
const (
	metaMagic   = "BKVT"
	metaVersion = 1
	metaFixed   = 4 + 2 + 2 + 2 + 4
)

// metadata is what an engine advertises: how to reach it and what memory a
// peer may write.
type metadata struct {
	name   string
	addr   string
	ranges []transfer.Desc
	// inc is the engine's incarnation: a random number per engine (per
	// process), so a fence refuses a lost process and not its restart
	// under the same name. Zero: unknown (a peer that sends none).
	inc uint64
}

// encodeMetadata encodes m; m must satisfy the limits decodeMetadata checks.
func encodeMetadata(m metadata) []byte {
	b := make([]byte, 0, metaFixed+len(m.name)+len(m.addr)+16*len(m.ranges)+8)
	b = append(b, metaMagic...)
	b = binary.LittleEndian.AppendUint16(b, metaVersion)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.name)))
	b = append(b, m.name...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.addr)))
	b = append(b, m.addr...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.ranges)))
	for _, r := range m.ranges {
		b = appendSegment(b, r.Addr, r.Len)
	}
	if m.inc != 0 {
		b = binary.LittleEndian.AppendUint64(b, m.inc) // optional: older peers send none
	}
	return b
}

// decodeMetadata decodes and validates a metadata blob. Errors wrap
// ErrBadMetadata and say what is wrong.
func decodeMetadata(b []byte) (metadata, error) {
	bad := func(format string, args ...any) (metadata, error) {
		return metadata{}, fmt.Errorf("tcp: metadata: "+format+": %w", append(args, transfer.ErrBadMetadata)...)
	}
	if len(b) > MaxMetadata {
		return bad("%d bytes exceeds %d", len(b), MaxMetadata)
	}
	if len(b) < 6 || string(b[:4]) != metaMagic {
		return bad("missing %q magic", metaMagic)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != metaVersion {
		return bad("unsupported version %d (want %d)", v, metaVersion)
	}
	rest := b[6:]
	str := func(limit int) (string, bool) {
		if len(rest) < 2 {
			return "", false
		}
		n := int(binary.LittleEndian.Uint16(rest))
		if n > limit || len(rest) < 2+n {
			return "", false
		}
		s := string(rest[2 : 2+n])
		rest = rest[2+n:]
		return s, true
	}
	name, ok := str(MaxNameLen)
	if !ok {
		return bad("truncated or oversized name")
	}
	if err := transfer.CheckName(name); err != nil {
		return bad("name: %v", err)
	}
	addr, ok := str(MaxAddrLen)
	if !ok {
		return bad("truncated or oversized address")
	}
	if err := validAddr(addr); err != nil {
		return bad("%v", err)
	}
	if len(rest) < 4 {
		return bad("truncated range count")
	}
	count := binary.LittleEndian.Uint32(rest)
	rest = rest[4:]
	if count > MaxRanges {
		return bad("%d ranges exceeds %d", count, MaxRanges)
	}
	var inc uint64
	if uint64(len(rest)) == 16*uint64(count)+8 { // the optional incarnation
		inc = binary.LittleEndian.Uint64(rest[16*count:])
		rest = rest[:16*count]
		if inc == 0 {
			return bad("incarnation 0 (an unknown incarnation is sent as none)")
		}
	}
	if uint64(len(rest)) != 16*uint64(count) {
		return bad("%d range bytes do not hold %d ranges", len(rest), count)
	}
	m := metadata{name: name, addr: addr, ranges: make([]transfer.Desc, count), inc: inc}
	for i := range m.ranges {
		m.ranges[i] = transfer.Desc{Addr: binary.LittleEndian.Uint64(rest[16*i:]), Len: binary.LittleEndian.Uint64(rest[16*i+8:]), Kind: transfer.Host}
	}
	if err := mem.CheckRanges(m.ranges); err != nil {
		return bad("%v", err)
	}
	return m, nil
}
