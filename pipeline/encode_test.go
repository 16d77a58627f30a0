package pipeline

import (
	"bytes"
	"testing"

	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// sampleData is a DATA of n single-copy runs, as a fragmented chunk sends.
func sampleData(n int) *wire.Data {
	runs := make([]transfer.Run, n)
	for i := range runs {
		runs[i] = transfer.Run{RegionOff: uint64(i) * 4096, Addr: 0x7f0000000000 + uint64(i*7919%n)*16384, Len: 4096, Count: 1}
	}
	return &wire.Data{Request: 1, Chunk: 3, Region: 64 << 20, Runs: runs}
}

// TestEncoderReusesItsBuffer: the reactor's encoder encodes each message
// exactly as wire.Marshal does, into one buffer it reuses (no allocation
// per message once it has grown), and drops a buffer grown past
// maxKeptEncoding.
func TestEncoderReusesItsBuffer(t *testing.T) {
	var e encoder
	small, big := sampleData(64), sampleData(int(maxKeptEncoding/32)+1)
	for _, m := range []wire.Message{small, &wire.Ack{Request: 9, Chunk: 1, Region: 4096}, small} {
		want, err := wire.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.encode(m)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("encode %T = %x, %v; want %x", m, got, err, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = e.encode(small) }); n != 0 {
		t.Fatalf("encoding a DATA allocated %v times per message, want 0", n)
	}
	if _, err := e.encode(big); err != nil {
		t.Fatal(err)
	}
	if cap(e.buf) > maxKeptEncoding {
		t.Fatalf("kept a %d-byte buffer, more than %d", cap(e.buf), maxKeptEncoding)
	}
	if _, err := e.encode(&wire.Data{Request: 1, Runs: []transfer.Run{{Len: 0, Count: 1}}}); err == nil {
		t.Fatal("an invalid DATA was encoded")
	}
}

// BenchmarkEncodeData encodes a 64-run DATA per op, as the reactor did
// (wire.Marshal: a new buffer per message) and does (its encoder's reused
// buffer), side by side; allocs/op tells them apart.
func BenchmarkEncodeData(b *testing.B) {
	m := sampleData(64)
	b.Run("marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := wire.Marshal(m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reused", func(b *testing.B) {
		b.ReportAllocs()
		var e encoder
		for b.Loop() {
			if _, err := e.encode(m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
