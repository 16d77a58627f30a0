package nixl

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

func TestMetadataRoundTrip(t *testing.T) {
	for _, m := range []metadata{
		{name: "a", nixlMD: []byte{1}},
		{name: "gen-0", ranges: []transfer.Desc{{Addr: 0x1000, Len: 16, Kind: transfer.Host}, {Addr: 0x2000, Len: 1 << 20, Kind: transfer.Host}}, nixlMD: bytes.Repeat([]byte{7}, 300)},
	} {
		got, err := decodeMetadata(encodeMetadata(m))
		if err != nil {
			t.Fatalf("decode(encode(%+v)): %v", m, err)
		}
		if got.name != m.name || !bytes.Equal(got.nixlMD, m.nixlMD) || len(got.ranges) != len(m.ranges) ||
			(len(m.ranges) > 0 && !reflect.DeepEqual(got.ranges, m.ranges)) {
			t.Fatalf("round trip: got %+v, want %+v", got, m)
		}
	}
}

func TestMetadataRejects(t *testing.T) {
	good := encodeMetadata(metadata{name: "peer", ranges: []transfer.Desc{{Addr: 0x1000, Len: 16}}, nixlMD: []byte("md")})
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for name, b := range map[string][]byte{
		"empty":          nil,
		"bad magic":      mut(func(b []byte) []byte { b[0] = 'X'; return b }),
		"bad version":    mut(func(b []byte) []byte { b[4] = 9; return b }),
		"empty name":     encodeMetadata(metadata{name: "", nixlMD: []byte("md")}),
		"truncated":      good[:len(good)-1],
		"trailing":       append(append([]byte(nil), good...), 0),
		"empty md":       encodeMetadata(metadata{name: "p"}),
		"empty range":    encodeMetadata(metadata{name: "p", ranges: []transfer.Desc{{Addr: 1}}, nixlMD: []byte("m")}),
		"wrapping range": encodeMetadata(metadata{name: "p", ranges: []transfer.Desc{{Addr: ^uint64(0), Len: 2}}, nixlMD: []byte("m")}),
		"overlap":        encodeMetadata(metadata{name: "p", ranges: []transfer.Desc{{Addr: 0, Len: 8}, {Addr: 4, Len: 8}}, nixlMD: []byte("m")}),
		"unsorted":       encodeMetadata(metadata{name: "p", ranges: []transfer.Desc{{Addr: 16, Len: 8}, {Addr: 0, Len: 8}}, nixlMD: []byte("m")}),
		"count too large": mut(func(b []byte) []byte {
			b[6+4] = 0xff
			return b
		}),
	} {
		if _, err := decodeMetadata(b); !errors.Is(err, transfer.ErrBadMetadata) {
			t.Errorf("%s: decode = %v, want ErrBadMetadata", name, err)
		}
	}
}

// FuzzDecodeMetadata checks that the decoder never panics and that what it
// accepts re-encodes to the same bytes.
func FuzzDecodeMetadata(f *testing.F) {
	f.Add(encodeMetadata(metadata{name: "peer", ranges: []transfer.Desc{{Addr: 0x1000, Len: 16}}, nixlMD: []byte("md")}))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMetadata(b)
		if err != nil {
			if !errors.Is(err, transfer.ErrBadMetadata) {
				t.Fatalf("error %v does not wrap ErrBadMetadata", err)
			}
			return
		}
		if !bytes.Equal(encodeMetadata(m), b) {
			t.Fatalf("accepted %x but re-encodes differently", b)
		}
	})
}
