package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// Metadata is what a peer passes to LoadPeer: how to reach this engine and
// the memory registered with it.
//
//	"SOCK" | version 1 | name (u16 length, bytes) | listen address (u16, bytes)
//	| range count u32 | count × (addr u64, len u64)
//
// Integers are big-endian. Ranges are in ascending address order.
type metadata struct {
	name, addr string
	ranges     []transfer.Desc
}

const (
	magic       = "SOCK"
	wireVersion = 1
	maxName     = 255
)

func (m metadata) encode() []byte {
	b := append([]byte(magic), wireVersion)
	b = appendString(b, m.name)
	b = appendString(b, m.addr)
	b = binary.BigEndian.AppendUint32(b, uint32(len(m.ranges)))
	for _, r := range m.ranges {
		b = binary.BigEndian.AppendUint64(b, r.Addr)
		b = binary.BigEndian.AppendUint64(b, r.Len)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	return append(binary.BigEndian.AppendUint16(b, uint16(len(s))), s...)
}

// decodeMetadata parses a peer's metadata, which is untrusted input: any
// defect is an error wrapping transfer.ErrBadMetadata.
func decodeMetadata(b []byte) (metadata, error) {
	var m metadata
	bad := func(format string, args ...any) (metadata, error) {
		return metadata{}, fmt.Errorf("sockengine: metadata: %s: %w", fmt.Sprintf(format, args...), transfer.ErrBadMetadata)
	}
	if len(b) < len(magic)+1 || string(b[:len(magic)]) != magic {
		return bad("not sockengine metadata (%d bytes)", len(b))
	}
	if v := b[len(magic)]; v != wireVersion {
		return bad("version %d, want %d", v, wireVersion)
	}
	r := reader{b: b[len(magic)+1:]}
	m.name, m.addr = r.string(), r.string()
	n := r.u32()
	if r.err != nil {
		return bad("truncated")
	}
	if m.name == "" || len(m.name) > maxName {
		return bad("peer name of %d bytes, want 1..%d", len(m.name), maxName)
	}
	if _, _, err := net.SplitHostPort(m.addr); err != nil {
		return bad("listen address %q: %v", m.addr, err)
	}
	if uint64(n)*16 != uint64(len(r.b)) {
		return bad("%d ranges in %d bytes", n, len(r.b))
	}
	m.ranges = make([]transfer.Desc, n)
	for i := range m.ranges {
		m.ranges[i] = transfer.Desc{Addr: r.u64(), Len: r.u64()}
	}
	if err := mem.CheckRanges(m.ranges); err != nil {
		return bad("%v", err)
	}
	return m, nil
}

// reader consumes big-endian fields; a short read sets err.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil || len(r.b) < n {
		r.err = errors.New("short")
		return make([]byte, n)
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) u16() uint16 { return binary.BigEndian.Uint16(r.take(2)) }
func (r *reader) u32() uint32 { return binary.BigEndian.Uint32(r.take(4)) }
func (r *reader) u64() uint64 { return binary.BigEndian.Uint64(r.take(8)) }
func (r *reader) string() string {
	return string(r.take(int(r.u16())))
}

// On a connection the writing engine sends its name (u16 length, bytes),
// then frames; the target answers acks.
//
//	frame: op id u64 | destination address u64 | length u32 | last u8 | payload
//	ack:   op id u64 | code u8 | message (u16 length, bytes)
//
// The target acks an op once: after its last frame landed (code 0), or at
// its first frame that could not land (the code names the sentinel).
const (
	frameHeader = 8 + 8 + 4 + 1
	ackHeader   = 8 + 1 + 2
)

// Ack codes: the sentinels a refused frame's error wraps.
const (
	codeOK uint8 = iota
	codeNotRegistered
	codeOutOfBounds
	codePeerLost
	codeOther
)

func codeOf(err error) uint8 {
	switch {
	case err == nil:
		return codeOK
	case errors.Is(err, transfer.ErrNotRegistered):
		return codeNotRegistered
	case errors.Is(err, transfer.ErrOutOfBounds):
		return codeOutOfBounds
	case errors.Is(err, transfer.ErrPeerLost):
		return codePeerLost
	}
	return codeOther
}

// ackError is the error of an op whose ack carried code and msg.
func ackError(code uint8, msg string) error {
	var s error
	switch code {
	case codeNotRegistered:
		s = transfer.ErrNotRegistered
	case codeOutOfBounds:
		s = transfer.ErrOutOfBounds
	case codePeerLost:
		s = transfer.ErrPeerLost
	default:
		return fmt.Errorf("sockengine: the target refused the write: %s", msg)
	}
	return fmt.Errorf("sockengine: the target refused the write: %s: %w", msg, s)
}
