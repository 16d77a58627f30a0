package wire

import (
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
