package ucx

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

func sampleInfo() peerInfo {
	return peerInfo{
		Name: "prefill-0",
		Addr: []byte("worker-address-bytes"),
		Ranges: []remoteRange{
			{Addr: 0x1000, Len: 4096, RKey: []byte{1, 2, 3}},
			{Addr: 0x3000, Len: 1 << 20, RKey: []byte{4, 5, 6, 7}},
		},
	}
}

func TestMetadataRoundTrip(t *testing.T) {
	for _, info := range []peerInfo{sampleInfo(), {Name: "x", Addr: []byte{9}}} {
		b := encodeMetadata(info)
		got, err := decodeMetadata(b)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(encodeMetadata(got), b) {
			t.Fatalf("round trip changed the blob: %+v -> %+v", info, got)
		}
	}
}

func TestMetadataRejects(t *testing.T) {
	mod := func(f func(*peerInfo)) []byte { i := sampleInfo(); f(&i); return encodeMetadata(i) }
	cases := map[string][]byte{
		"empty name":     mod(func(i *peerInfo) { i.Name = "" }),
		"bad utf8 name":  mod(func(i *peerInfo) { i.Name = "\xff" }),
		"no address":     mod(func(i *peerInfo) { i.Addr = nil }),
		"empty range":    mod(func(i *peerInfo) { i.Ranges[0].Len = 0 }),
		"wrapping range": mod(func(i *peerInfo) { i.Ranges[1].Addr = ^uint64(0) - 10 }),
		"overlap":        mod(func(i *peerInfo) { i.Ranges[1].Addr = 0x1800 }),
		"unsorted":       mod(func(i *peerInfo) { i.Ranges[0], i.Ranges[1] = i.Ranges[1], i.Ranges[0] }),
		"empty rkey":     mod(func(i *peerInfo) { i.Ranges[0].RKey = nil }),
		"bad magic":      append([]byte("XXXX"), encodeMetadata(sampleInfo())[4:]...),
	}
	v2 := encodeMetadata(sampleInfo())
	v2[4] = 2
	cases["version 2"] = v2
	for name, b := range cases {
		if _, err := decodeMetadata(b); !errors.Is(err, transfer.ErrBadMetadata) {
			t.Errorf("%s: %v, want ErrBadMetadata", name, err)
		}
	}
	if _, err := decodeMetadata(v2); err == nil || !strings.Contains(err.Error(), "version 2") {
		t.Errorf("version error does not name the version: %v", err)
	}
}

func TestAMHeader(t *testing.T) {
	h := encodeAMHeader(amKindMsg, "decode-3")
	kind, name, err := decodeAMHeader(h)
	if err != nil || kind != amKindMsg || name != "decode-3" {
		t.Fatalf("got %d %q %v", kind, name, err)
	}
	for _, k := range []byte{amKindHello, amKindBye, amKindByeAck} {
		if kind, name, err := decodeAMHeader(encodeAMHeader(k, "send-1")); err != nil || kind != k || name != "send-1" {
			t.Fatalf("kind %d: got %d %q %v", k, kind, name, err)
		}
	}
	for _, b := range [][]byte{nil, h[:4], append(bytes.Clone(h), 'x'), {'b', 'n', 1, 9, 1, 'a'}, {'b', 'n', 1, 0, 1, 'a'}, {'b', 'n', 1, 5, 1, 'a'}, {'b', 'n', 2, 2, 1, 'a'}, {'x', 'n', 1, 2, 1, 'a'}, {'b', 'n', 1, 2, 0}} {
		if _, _, err := decodeAMHeader(b); err == nil {
			t.Errorf("header %q accepted", b)
		}
	}
}

func FuzzDecodeMetadata(f *testing.F) {
	f.Add(encodeMetadata(sampleInfo()))
	f.Add(encodeMetadata(peerInfo{Name: "x", Addr: []byte{1}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		info, err := decodeMetadata(b)
		if err != nil {
			if !errors.Is(err, transfer.ErrBadMetadata) {
				t.Fatalf("error %v does not wrap ErrBadMetadata", err)
			}
			return
		}
		if !bytes.Equal(encodeMetadata(info), b) {
			t.Fatal("accepted blob is not canonical")
		}
	})
}

func FuzzDecodeAMHeader(f *testing.F) {
	f.Add(encodeAMHeader(amKindMsg, "a"))
	f.Add(encodeAMHeader(amKindHello, "prefill-0"))
	f.Add(encodeAMHeader(amKindBye, "decode-1"))
	f.Add(encodeAMHeader(amKindByeAck, "decode-1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		kind, name, err := decodeAMHeader(b)
		if err != nil {
			return
		}
		if !bytes.Equal(encodeAMHeader(kind, name), b) {
			t.Fatal("accepted header is not canonical")
		}
	})
}

// FuzzDecodeMetadataBody fuzzes the structure behind the checksum: the
// input gets a valid CRC appended before decoding.
func FuzzDecodeMetadataBody(f *testing.F) {
	good := encodeMetadata(sampleInfo())
	f.Add(good[:len(good)-4])
	f.Add(encodeMetadata(peerInfo{Name: "x", Addr: []byte{1}})[:mdFixedHead+7])
	f.Fuzz(func(t *testing.T, body []byte) {
		b := binary.LittleEndian.AppendUint32(bytes.Clone(body), checksum(body))
		info, err := decodeMetadata(b)
		if err != nil {
			if !errors.Is(err, transfer.ErrBadMetadata) {
				t.Fatalf("error %v does not wrap ErrBadMetadata", err)
			}
			return
		}
		if !bytes.Equal(encodeMetadata(info), b) {
			t.Fatal("accepted blob is not canonical")
		}
	})
}
