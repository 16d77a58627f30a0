package wire

import (
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/transfer"
)

// TestSizesMatchEncoding: the exported sizes senders plan with are the
// codec's own, for any DATA and GRANT.
func TestSizesMatchEncoding(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		runs := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) transfer.Run {
			if rapid.Bool().Draw(t, "single") {
				return transfer.Run{RegionOff: 64, Addr: 1 << 20, Len: 4096, Count: 1}
			}
			return transfer.Run{RegionOff: 0, Addr: 1 << 20, Len: 4096, Count: 3, RegionStride: 4096, AddrStride: 8192}
		}), 1, 50).Draw(t, "runs")
		tp := rapid.StringN(0, 100, 100).Draw(t, "traceparent")
		d := &Data{Request: 1, Chunk: 2, Region: 3, Runs: runs, TraceParent: tp}
		want := DataOverhead(len(tp))
		for _, r := range runs {
			want += RunSize(r)
		}
		b, err := Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != want {
			t.Fatalf("DATA encodes to %d bytes, sizes say %d", len(b), want)
		}
		n := rapid.IntRange(1, 20).Draw(t, "credits")
		g := &Grant{Request: 1, Credits: make([]Credit, n)}
		for i := range g.Credits {
			g.Credits[i] = Credit{Chunk: uint32(i), Region: 0, Addr: 4096, Len: 4096}
		}
		if b, err := Marshal(g); err != nil || len(b) != GrantOverhead+n*CreditSize {
			t.Fatalf("GRANT of %d credits encodes to %d bytes (%v), sizes say %d", n, len(b), err, GrantOverhead+n*CreditSize)
		}
	})
}

// TestPullDescsRoundTrip: any descriptor PULL — lengths, devices and
// kinds changing or not, addresses near or far apart (4- and 8-byte
// offsets) — decodes to itself, and EncodedLen is its encoding's length.
func TestPullDescsRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		spread := rapid.SampledFrom([]uint64{1 << 20, 1 << 32, 1 << 40, 1 << 62}).Draw(t, "spread")
		src := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) transfer.Desc {
			return transfer.Desc{
				Addr:   rapid.Uint64Range(0, spread).Draw(t, "addr"),
				Len:    rapid.SampledFrom([]uint64{2048, 4096, 1}).Draw(t, "len"),
				Device: int32(rapid.IntRange(0, 1).Draw(t, "device")),
				Kind:   transfer.MemKind(rapid.IntRange(0, 1).Draw(t, "kind")),
			}
		}), 1, 200).Draw(t, "src")
		p := &Pull{Request: 9, ChunkBytes: []uint64{1 << 20}, Src: src}
		b, err := Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := EncodedLen(p); err != nil || n != len(b) {
			t.Fatalf("EncodedLen %d (%v), encoding %d bytes", n, err, len(b))
		}
		m, err := Unmarshal(b)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := m.(*Pull)
		if !ok || !slices.Equal(got.Src, src) {
			t.Fatalf("decoded %+v, want the sources %v", m, src)
		}
	})
}
