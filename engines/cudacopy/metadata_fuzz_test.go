package cudacopy

import (
	"bytes"
	"errors"
	"testing"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/transfer"
)

// FuzzDecodeMetadata: the decoder never panics, fails only with
// ErrBadMetadata, and what it accepts re-encodes to the same bytes (both
// versions: in-process, and with CUDA IPC exports).
func FuzzDecodeMetadata(f *testing.F) {
	f.Add(encodeMetadata(1, 2, "agent-a"))
	f.Add([]byte("BCMD\x01"))
	f.Add([]byte{})
	var h cuda.IPCHandle
	h[0], h[63] = 0xab, 0xcd
	f.Add(encodeMetadataIPC(3, 4, "agent-b", [16]byte{1, 2, 3}, 0, []export{
		{d: transfer.Desc{Addr: 1 << 32, Len: 4096, Kind: transfer.CUDA}, base: 1 << 32, handle: h},
		{d: transfer.Desc{Addr: 1<<32 + 8192, Len: 100, Kind: transfer.CUDA}, base: 1 << 32, handle: h},
	}))
	f.Add(encodeMetadataIPC(3, 4, "agent-c", [16]byte{}, 1, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		md, err := decodeMetadata(b)
		if err != nil {
			if !errors.Is(err, transfer.ErrBadMetadata) {
				t.Fatalf("error %v does not wrap ErrBadMetadata", err)
			}
			return
		}
		re := encodeMetadata(md.fabric, md.inc, md.name)
		if md.ipc {
			re = encodeMetadataIPC(md.fabric, md.inc, md.name, md.host, md.device, md.exports)
		}
		if !bytes.Equal(re, b) {
			t.Fatalf("re-encoding %x gives %x", b, re)
		}
	})
}
