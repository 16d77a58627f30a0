package main

import (
	"errors"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

func TestMetadataRoundTrip(t *testing.T) {
	m := metadata{name: "a", addr: "127.0.0.1:9", ranges: []transfer.Desc{{Addr: 4096, Len: 10}, {Addr: 8192, Len: 1}}}
	got, err := decodeMetadata(m.encode())
	if err != nil || got.name != m.name || got.addr != m.addr || len(got.ranges) != 2 || got.ranges[1] != m.ranges[1] {
		t.Fatalf("decode(encode(%+v)) = %+v, %v", m, got, err)
	}
	for _, bad := range [][]byte{nil, []byte("SOCK"), m.encode()[:9], append(m.encode(), 0)} {
		if _, err := decodeMetadata(bad); !errors.Is(err, transfer.ErrBadMetadata) {
			t.Errorf("decode(%q) = %v, want ErrBadMetadata", bad, err)
		}
	}
}

// FuzzDecodeMetadata: any input is metadata that encodes back to itself,
// or an error wrapping ErrBadMetadata; never a panic.
func FuzzDecodeMetadata(f *testing.F) {
	f.Add(metadata{name: "a", addr: "127.0.0.1:9", ranges: []transfer.Desc{{Addr: 4096, Len: 10}}}.encode())
	f.Add([]byte("SOCK\x01\x00\x01a\x00\x0b127.0.0.1:9\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMetadata(b)
		if err != nil {
			if !errors.Is(err, transfer.ErrBadMetadata) {
				t.Fatalf("error %v does not wrap ErrBadMetadata", err)
			}
			return
		}
		if string(m.encode()) != string(b) {
			t.Fatalf("decoded %+v encodes to %q, not the input %q", m, m.encode(), b)
		}
	})
}
