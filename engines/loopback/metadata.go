package loopback

import (
	"encoding/binary"
	"fmt"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// Metadata layout, little-endian:
//
//	magic       4 bytes  "BLMD"
//	version     1 byte   (mdVersion)
//	fabric      8 bytes  id of the Fabric the engine lives on
//	incarnation 8 bytes  per-fabric id of this engine instance
//	name length 2 bytes, then the name (UTF-8, 1..maxNameLen bytes)
//	range count 4 bytes, then per range: addr 8 bytes, len 8 bytes
//
// Ranges are host memory, strictly ascending and non-overlapping; nothing
// may follow the last range. The encoding is canonical: decoding and
// re-encoding gives back the same bytes.
const (
	mdMagic     = "BLMD"
	mdVersion   = 1
	mdFixed     = 4 + 1 + 8 + 8 + 2
	mdRangeSize = 16
	maxNameLen  = transfer.MaxNameLen
)

type metadata struct {
	fabric      uint64
	incarnation uint64
	name        string
	ranges      []transfer.Desc
}

func encodeMetadata(m metadata) []byte {
	b := make([]byte, 0, mdFixed+len(m.name)+4+mdRangeSize*len(m.ranges))
	b = append(b, mdMagic...)
	b = append(b, mdVersion)
	b = binary.LittleEndian.AppendUint64(b, m.fabric)
	b = binary.LittleEndian.AppendUint64(b, m.incarnation)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.name)))
	b = append(b, m.name...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.ranges)))
	for _, r := range m.ranges {
		b = binary.LittleEndian.AppendUint64(b, r.Addr)
		b = binary.LittleEndian.AppendUint64(b, r.Len)
	}
	return b
}

func decodeMetadata(b []byte) (metadata, error) {
	bad := func(format string, args ...any) (metadata, error) {
		return metadata{}, fmt.Errorf("metadata: "+format+": %w", append(args, transfer.ErrBadMetadata)...)
	}
	if len(b) < mdFixed {
		return bad("%d bytes, shorter than the %d-byte header", len(b), mdFixed)
	}
	if string(b[:4]) != mdMagic {
		return bad("magic %q, want %q", b[:4], mdMagic)
	}
	if b[4] != mdVersion {
		return bad("version %d, want %d", b[4], mdVersion)
	}
	m := metadata{
		fabric:      binary.LittleEndian.Uint64(b[5:]),
		incarnation: binary.LittleEndian.Uint64(b[13:]),
	}
	n := int(binary.LittleEndian.Uint16(b[21:]))
	rest := b[mdFixed:]
	if n > len(rest) {
		return bad("name of %d bytes, only %d left", n, len(rest))
	}
	m.name = string(rest[:n])
	if err := transfer.CheckName(m.name); err != nil {
		return bad("%v", err)
	}
	rest = rest[n:]
	if len(rest) < 4 {
		return bad("range count truncated")
	}
	count := uint64(binary.LittleEndian.Uint32(rest))
	rest = rest[4:]
	if uint64(len(rest)) != count*mdRangeSize {
		return bad("%d ranges need %d bytes, have %d", count, count*mdRangeSize, len(rest))
	}
	m.ranges = make([]transfer.Desc, count)
	for i := range m.ranges {
		m.ranges[i] = transfer.Desc{
			Addr: binary.LittleEndian.Uint64(rest[i*mdRangeSize:]),
			Len:  binary.LittleEndian.Uint64(rest[i*mdRangeSize+8:]),
			Kind: transfer.Host,
		}
	}
	if err := mem.CheckRanges(m.ranges); err != nil {
		return bad("%v", err)
	}
	return m, nil
}
