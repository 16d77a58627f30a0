package loopback

import (
	"bytes"
	"errors"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

// FuzzDecodeMetadata checks that the decoder never panics, reports every
// rejection as ErrBadMetadata, and accepts only canonical encodings.
func FuzzDecodeMetadata(f *testing.F) {
	f.Add(encodeMetadata(metadata{fabric: 1, incarnation: 2, name: "agentA"}))
	f.Add(encodeMetadata(metadata{fabric: 7, incarnation: 1, name: "b", ranges: []transfer.Desc{
		{Addr: 0x1000, Len: 0x1000, Kind: transfer.Host},
		{Addr: 0x4000, Len: 16, Kind: transfer.Host},
	}}))
	f.Add([]byte("BLMD"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMetadata(b)
		if err != nil {
			if !errors.Is(err, transfer.ErrBadMetadata) {
				t.Fatalf("error %v does not wrap ErrBadMetadata", err)
			}
			return
		}
		if got := encodeMetadata(m); !bytes.Equal(got, b) {
			t.Fatalf("re-encoding differs:\n in  %x\n out %x", b, got)
		}
	})
}
