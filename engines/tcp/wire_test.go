package tcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/transfer"
)

func genMetadata() *rapid.Generator[metadata] {
	return rapid.Custom(func(t *rapid.T) metadata {
		m := metadata{
			name: rapid.StringMatching(`[a-zA-Z0-9._-]{1,40}`).Draw(t, "name"),
			addr: rapid.SampledFrom([]string{"127.0.0.1:1", "[::1]:65535", "localhost:4242"}).Draw(t, "addr"),
		}
		next := rapid.Uint64Range(0, 1<<40).Draw(t, "base")
		for range rapid.IntRange(0, 20).Draw(t, "count") {
			n := rapid.Uint64Range(1, 1<<30).Draw(t, "len")
			m.ranges = append(m.ranges, transfer.Desc{Addr: next, Len: n, Kind: transfer.Host})
			next += n + rapid.Uint64Range(0, 1<<20).Draw(t, "gap")
		}
		return m
	})
}

func TestMetadataRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := genMetadata().Draw(t, "m")
		got, err := decodeMetadata(encodeMetadata(m))
		if err != nil {
			t.Fatal(err)
		}
		if got.name != m.name || got.addr != m.addr || len(got.ranges) != len(m.ranges) {
			t.Fatalf("round trip %+v -> %+v", m, got)
		}
		for i := range m.ranges {
			if got.ranges[i] != m.ranges[i] {
				t.Fatalf("range %d: %v -> %v", i, m.ranges[i], got.ranges[i])
			}
		}
	})
}

func TestMetadataRejectsEveryTruncation(t *testing.T) {
	md := encodeMetadata(metadata{name: "n", addr: "127.0.0.1:5", ranges: []transfer.Desc{{Addr: 4096, Len: 10}}})
	for i := range md {
		if _, err := decodeMetadata(md[:i]); !errors.Is(err, transfer.ErrBadMetadata) {
			t.Fatalf("prefix of %d bytes: %v", i, err)
		}
	}
}

func TestWriteBodyRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 300).Draw(t, "n")
		segs := make([]segment, n)
		body := binary.LittleEndian.AppendUint32(nil, uint32(n))
		var total uint64
		for i := range segs {
			segs[i] = segment{rapid.Uint64Range(0, 1<<62).Draw(t, "addr"), rapid.Uint64Range(1, MaxFramePayload/300).Draw(t, "len")}
			body = appendSegment(body, segs[i].addr, segs[i].n)
			total += segs[i].n
		}
		got, gotTotal, err := parseWriteBody(body, nil)
		if err != nil || gotTotal != total || len(got) != n {
			t.Fatalf("parse: %v total %d/%d", err, gotTotal, total)
		}
		for i := range segs {
			if got[i] != segs[i] {
				t.Fatalf("segment %d: %v -> %v", i, segs[i], got[i])
			}
		}
	})
}

func TestHeaderRoundTrip(t *testing.T) {
	for _, typ := range []byte{frameHello, frameWrite, frameAck, frameNack, frameNotif} {
		limit, _ := maxBody(typ)
		n := min(limit, 4)
		if typ == frameAck {
			n = 0
		}
		var b [headerSize]byte
		putHeader(b[:], frameHeader{typ: typ, bodyLen: n, id: 77})
		h, err := parseHeader(b[:])
		if err != nil || h.typ != typ || h.bodyLen != n || h.id != 77 {
			t.Fatalf("type %d: %+v %v", typ, h, err)
		}
		putHeader(b[:], frameHeader{typ: typ, bodyLen: limit + 1})
		if _, err := parseHeader(b[:]); !errors.Is(err, errProtocol) {
			t.Fatalf("type %d body over the limit: %v", typ, err)
		}
	}
}

// FuzzDecodeMetadata: any input decodes to valid metadata that re-encodes
// to the same bytes, or is rejected with ErrBadMetadata; never a panic.
func FuzzDecodeMetadata(f *testing.F) {
	f.Add(encodeMetadata(metadata{name: "prefill-0", addr: "127.0.0.1:7000", ranges: []transfer.Desc{{Addr: 4096, Len: 1 << 20}}}))
	f.Add(encodeMetadata(metadata{name: "prefill-0", addr: "127.0.0.1:7000", ranges: []transfer.Desc{{Addr: 4096, Len: 1 << 20}}, inc: 0x9e3779b97f4a7c15}))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMetadata(b)
		if err != nil {
			if !errors.Is(err, transfer.ErrBadMetadata) {
				t.Fatalf("error %v does not wrap ErrBadMetadata", err)
			}
			return
		}
		if !bytes.Equal(encodeMetadata(m), b) {
			t.Fatalf("accepted non-canonical metadata %x", b)
		}
		for i, r := range m.ranges {
			if r.Len == 0 || r.End() < r.Addr || i > 0 && m.ranges[i-1].End() > r.Addr {
				t.Fatalf("accepted bad range %d %v", i, r)
			}
		}
	})
}

// FuzzDecodeFrame: a header plus body is rejected or decodes within the
// wire limits; accepted WRITE bodies declare a bounded, non-wrapping payload.
func FuzzDecodeFrame(f *testing.F) {
	f.Add(writeFrameBytes(1, []segment{{4096, 10}, {1 << 30, 4}}))
	f.Add(encodeNack(3, nackOutOfBounds, "no"))
	f.Add(encodeFrame(frameAck, 9, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < headerSize {
			if _, err := parseHeader(b); err == nil {
				t.Fatal("short header accepted")
			}
			return
		}
		h, err := parseHeader(b[:headerSize])
		if err != nil {
			return
		}
		if limit, _ := maxBody(h.typ); h.bodyLen > limit {
			t.Fatalf("body %d over limit %d accepted", h.bodyLen, limit)
		}
		body := b[headerSize:]
		if uint32(len(body)) > h.bodyLen {
			body = body[:h.bodyLen]
		}
		switch h.typ {
		case frameWrite:
			segs, total, err := parseWriteBody(body, nil)
			if err != nil {
				return
			}
			var sum uint64
			for _, s := range segs {
				if s.n == 0 || s.addr+s.n < s.addr {
					t.Fatalf("accepted bad segment %+v", s)
				}
				sum += s.n
			}
			if sum != total || total > MaxFramePayload {
				t.Fatalf("payload %d (sum %d) accepted", total, sum)
			}
		case frameNack:
			code, text, err := parseNack(body)
			if err == nil && !bytes.Equal(encodeNack(h.id, code, text)[headerSize:], body) {
				t.Fatalf("accepted NACK body %x does not re-encode to itself", body)
			}
		case frameHello:
			decodeMetadata(body)
		}
	})
}
