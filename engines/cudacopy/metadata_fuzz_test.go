package cudacopy

import (
	"bytes"
	"errors"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

// FuzzDecodeMetadata: the decoder never panics, fails only with
// ErrBadMetadata, and what it accepts re-encodes to the same bytes.
func FuzzDecodeMetadata(f *testing.F) {
	f.Add(encodeMetadata(1, 2, "agent-a"))
	f.Add([]byte("BCMD\x01"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		fab, inc, name, err := decodeMetadata(b)
		if err != nil {
			if !errors.Is(err, transfer.ErrBadMetadata) {
				t.Fatalf("error %v does not wrap ErrBadMetadata", err)
			}
			return
		}
		if re := encodeMetadata(fab, inc, name); !bytes.Equal(re, b) {
			t.Fatalf("re-encoding %x gives %x", b, re)
		}
	})
}
