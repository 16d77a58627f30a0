package nixl

import (
	"encoding/binary"
	"fmt"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// The metadata envelope, little-endian:
//
//	magic "BNXL" | version u8 (1) | name length u8 | name
//	| range count u32 | count × (addr u64, len u64) | NIXL MD length u32 | NIXL MD
//
// Ranges are host memory registered with the engine, sorted by address,
// non-empty, non-wrapping and non-overlapping. The NIXL MD is getLocalMD's
// blob, passed to loadRemoteMD unchanged.
const (
	mdMagic   = "BNXL"
	mdVersion = 1
	// maxMDLen bounds NIXL's own metadata blob.
	maxMDLen = 64 << 20
)

// metadata is a decoded envelope.
type metadata struct {
	name   string
	ranges []transfer.Desc
	nixlMD []byte
}

func encodeMetadata(m metadata) []byte {
	b := make([]byte, 0, 4+2+len(m.name)+4+16*len(m.ranges)+4+len(m.nixlMD))
	b = append(b, mdMagic...)
	b = append(b, mdVersion, byte(len(m.name)))
	b = append(b, m.name...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.ranges)))
	for _, r := range m.ranges {
		b = binary.LittleEndian.AppendUint64(b, r.Addr)
		b = binary.LittleEndian.AppendUint64(b, r.Len)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.nixlMD)))
	return append(b, m.nixlMD...)
}

// decodeMetadata parses and validates an envelope. Every failure wraps
// transfer.ErrBadMetadata.
func decodeMetadata(b []byte) (metadata, error) {
	bad := func(format string, args ...any) (metadata, error) {
		return metadata{}, fmt.Errorf("nixl: metadata: %s: %w", fmt.Sprintf(format, args...), transfer.ErrBadMetadata)
	}
	if len(b) < 6 || string(b[:4]) != mdMagic {
		return bad("not a bounce NIXL envelope (%d bytes)", len(b))
	}
	if b[4] != mdVersion {
		return bad("version %d, want %d", b[4], mdVersion)
	}
	nl := int(b[5])
	b = b[6:]
	if len(b) < nl+4 {
		return bad("truncated name")
	}
	var m metadata
	m.name = string(b[:nl])
	if err := checkName(m.name); err != nil {
		return bad("agent name: %v", err)
	}
	b = b[nl:]
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	if uint64(n) > uint64(len(b))/16 {
		return bad("%d ranges in %d bytes", n, len(b))
	}
	m.ranges = make([]transfer.Desc, n)
	for i := range m.ranges {
		m.ranges[i] = transfer.Desc{Addr: binary.LittleEndian.Uint64(b), Len: binary.LittleEndian.Uint64(b[8:]), Kind: transfer.Host}
		b = b[16:]
	}
	if err := mem.CheckRanges(m.ranges); err != nil {
		return bad("%v", err)
	}
	if len(b) < 4 {
		return bad("truncated NIXL metadata length")
	}
	ml := binary.LittleEndian.Uint32(b)
	b = b[4:]
	switch {
	case ml == 0:
		return bad("empty NIXL metadata")
	case ml > maxMDLen:
		return bad("NIXL metadata of %d bytes exceeds %d", ml, maxMDLen)
	case uint64(ml) != uint64(len(b)):
		return bad("NIXL metadata length %d, %d bytes follow", ml, len(b))
	}
	m.nixlMD = append([]byte(nil), b...)
	return m, nil
}
