package ucx

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"unicode/utf8"

	"github.com/bouncekv/bounce/transfer"
)

// Metadata blob layout (little-endian), version 1:
//
//	magic "BKVU" | version u16 | flags u16 (0)
//	nameLen u8 | name
//	addrLen u32 | UCX worker address
//	nRanges u32 | nRanges × { addr u64 | len u64 | rkeyLen u16 | packed rkey }
//	crc32c u32 over everything before it
//
// Ranges are sorted by address, non-empty, non-wrapping and non-overlapping.
const (
	mdMagic   = "BKVU"
	mdVersion = 1

	maxNameLen  = 255
	maxAddrLen  = 64 << 10
	maxRanges   = 1 << 16
	maxRKeyLen  = 4 << 10
	mdFixedHead = 4 + 2 + 2
)

// checksum is the CRC-32C of b (the standard library caches the table).
func checksum(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }

// remoteRange is one memory range a peer registered, with its packed rkey.
type remoteRange struct {
	Addr, Len uint64
	RKey      []byte
}

// peerInfo is the decoded content of a metadata blob.
type peerInfo struct {
	Name   string
	Addr   []byte
	Ranges []remoteRange
}

// checkName reports whether name is usable as an engine or peer name.
func checkName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("name is empty")
	case len(name) > maxNameLen:
		return fmt.Errorf("name is %d bytes, at most %d accepted", len(name), maxNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("name %q is not valid UTF-8", name)
	}
	return nil
}

// encodeMetadata serializes info. The caller guarantees the limits.
func encodeMetadata(info peerInfo) []byte {
	n := mdFixedHead + 1 + len(info.Name) + 4 + len(info.Addr) + 4 + 4
	for _, r := range info.Ranges {
		n += 8 + 8 + 2 + len(r.RKey)
	}
	b := make([]byte, 0, n)
	b = append(b, mdMagic...)
	b = binary.LittleEndian.AppendUint16(b, mdVersion)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = append(b, byte(len(info.Name)))
	b = append(b, info.Name...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(info.Addr)))
	b = append(b, info.Addr...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(info.Ranges)))
	for _, r := range info.Ranges {
		b = binary.LittleEndian.AppendUint64(b, r.Addr)
		b = binary.LittleEndian.AppendUint64(b, r.Len)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(r.RKey)))
		b = append(b, r.RKey...)
	}
	return binary.LittleEndian.AppendUint32(b, checksum(b))
}

// reader is a bounds-checked cursor over a byte slice.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) take(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b)-r.off {
		r.err = fmt.Errorf("truncated at byte %d reading %s (%d bytes wanted, %d left)", r.off, what, n, len(r.b)-r.off)
		return nil
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s
}

func (r *reader) u8(what string) uint8 {
	if s := r.take(1, what); s != nil {
		return s[0]
	}
	return 0
}

func (r *reader) u16(what string) uint16 {
	if s := r.take(2, what); s != nil {
		return binary.LittleEndian.Uint16(s)
	}
	return 0
}

func (r *reader) u32(what string) uint32 {
	if s := r.take(4, what); s != nil {
		return binary.LittleEndian.Uint32(s)
	}
	return 0
}

func (r *reader) u64(what string) uint64 {
	if s := r.take(8, what); s != nil {
		return binary.LittleEndian.Uint64(s)
	}
	return 0
}

// decodeMetadata parses and validates a metadata blob. Every error wraps
// transfer.ErrBadMetadata.
func decodeMetadata(b []byte) (peerInfo, error) {
	info, err := decodeMetadataBody(b)
	if err != nil {
		return peerInfo{}, fmt.Errorf("ucx: metadata (%d bytes): %v: %w", len(b), err, transfer.ErrBadMetadata)
	}
	return info, nil
}

func decodeMetadataBody(b []byte) (peerInfo, error) {
	if len(b) < mdFixedHead+4 {
		return peerInfo{}, fmt.Errorf("too short")
	}
	if string(b[:4]) != mdMagic {
		return peerInfo{}, fmt.Errorf("magic %q, want %q", b[:4], mdMagic)
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if v := binary.LittleEndian.Uint16(b[4:6]); v != mdVersion {
		return peerInfo{}, fmt.Errorf("version %d, only %d accepted", v, mdVersion)
	}
	if got := checksum(body); got != sum {
		return peerInfo{}, fmt.Errorf("checksum %#08x, computed %#08x", sum, got)
	}
	r := &reader{b: body, off: 4 + 2}
	if f := r.u16("flags"); f != 0 {
		return peerInfo{}, fmt.Errorf("unknown flags %#x", f)
	}
	var info peerInfo
	info.Name = string(r.take(int(r.u8("name length")), "name"))
	if r.err == nil {
		if err := checkName(info.Name); err != nil {
			return peerInfo{}, err
		}
	}
	addrLen := r.u32("address length")
	if r.err == nil && (addrLen == 0 || addrLen > maxAddrLen) {
		return peerInfo{}, fmt.Errorf("worker address length %d, want 1..%d", addrLen, maxAddrLen)
	}
	info.Addr = append([]byte(nil), r.take(int(addrLen), "worker address")...)
	n := r.u32("range count")
	if r.err == nil && n > maxRanges {
		return peerInfo{}, fmt.Errorf("%d ranges, at most %d accepted", n, maxRanges)
	}
	for i := uint32(0); i < n && r.err == nil; i++ {
		rr := remoteRange{Addr: r.u64("range address"), Len: r.u64("range length")}
		kl := r.u16("rkey length")
		rr.RKey = append([]byte(nil), r.take(int(kl), "rkey")...)
		if r.err != nil {
			break
		}
		switch {
		case rr.Len == 0:
			return peerInfo{}, fmt.Errorf("range %d [%#x+0] is empty", i, rr.Addr)
		case rr.Addr+rr.Len < rr.Addr:
			return peerInfo{}, fmt.Errorf("range %d [%#x+%d] wraps", i, rr.Addr, rr.Len)
		case kl == 0 || kl > maxRKeyLen:
			return peerInfo{}, fmt.Errorf("range %d rkey length %d, want 1..%d", i, kl, maxRKeyLen)
		}
		if i > 0 {
			prev := info.Ranges[i-1]
			if rr.Addr < prev.Addr+prev.Len {
				return peerInfo{}, fmt.Errorf("range %d [%#x+%d] overlaps or precedes range %d [%#x+%d]", i, rr.Addr, rr.Len, i-1, prev.Addr, prev.Len)
			}
		}
		info.Ranges = append(info.Ranges, rr)
	}
	if r.err != nil {
		return peerInfo{}, r.err
	}
	if r.off != len(body) {
		return peerInfo{}, fmt.Errorf("%d trailing bytes", len(body)-r.off)
	}
	return info, nil
}

// Active-message header: magic "bn" | version u8 | kind u8 | nameLen u8 | name.
// A hello carries the sender's worker address as its data; a notification
// carries the user payload; a bye (no data) says the sender is closing its
// engine, and a bye-ack (no data) that the bye was taken: the closer's
// endpoints failing from then on are its end, not a fault.
const (
	amVersion    = 1
	amKindHello  = 1
	amKindMsg    = 2
	amKindBye    = 3
	amKindByeAck = 4
	amKindLast   = amKindByeAck
)

// encodeAMHeader builds the header of an active message from sender name.
func encodeAMHeader(kind byte, name string) []byte {
	b := make([]byte, 0, 5+len(name))
	b = append(b, 'b', 'n', amVersion, kind, byte(len(name)))
	return append(b, name...)
}

// decodeAMHeader parses an active-message header.
func decodeAMHeader(b []byte) (kind byte, name string, err error) {
	if len(b) < 5 {
		return 0, "", fmt.Errorf("header of %d bytes, want at least 5", len(b))
	}
	if b[0] != 'b' || b[1] != 'n' {
		return 0, "", fmt.Errorf("header magic %q, want \"bn\"", b[:2])
	}
	if b[2] != amVersion {
		return 0, "", fmt.Errorf("header version %d, only %d accepted", b[2], amVersion)
	}
	if b[3] < amKindHello || b[3] > amKindLast {
		return 0, "", fmt.Errorf("unknown message kind %d", b[3])
	}
	if int(b[4]) != len(b)-5 {
		return 0, "", fmt.Errorf("name length %d, header holds %d", b[4], len(b)-5)
	}
	name = string(b[5:])
	if err := checkName(name); err != nil {
		return 0, "", err
	}
	return b[3], name, nil
}
