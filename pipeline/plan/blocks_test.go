package plan

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/transfer"
)

// TestLayoutBlocksProperties checks the block-table plan: the chunks are
// consecutive piece ranges that cover every piece exactly once, in order;
// each chunk's bytes are its pieces' and within MaxChunk; each holds as
// many whole pieces as its cap allows; and nothing is stored per piece.
func TestLayoutBlocksProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		blen := rapid.Uint64Range(1, 1<<16).Draw(rt, "blockLen")
		regions := rapid.IntRange(1, 8).Draw(rt, "regions")
		ids := rapid.IntRange(0, 3000).Draw(rt, "ids")
		maxChunk := blen * rapid.Uint64Range(1, 64).Draw(rt, "perChunk")
		maxChunk += rapid.Uint64Range(0, blen-1).Draw(rt, "slack")
		var minChunk uint64
		if rapid.Bool().Draw(rt, "ramp") {
			minChunk = rapid.Uint64Range(1, maxChunk).Draw(rt, "minChunk")
		}
		pool := transfer.Pool{BlockLen: blen, Stride: blen, Blocks: uint64(max(ids, 1)), Kind: transfer.Host}
		for r := range regions {
			pool.Regions = append(pool.Regions, uint64(r+1)<<40)
		}
		idv := make([]uint32, ids)
		src := transfer.Blocks{Pool: pool, IDs: idv}
		dst := transfer.Blocks{Pool: pool, IDs: idv}
		p, err := LayoutBlocks(src, dst, Options{MaxChunk: maxChunk, MinChunk: minChunk})
		if err != nil {
			rt.Fatal(err)
		}
		total := src.Len()
		next := uint64(0)
		for k, c := range p.Chunks {
			if c.Index != k || c.First != next || c.Count == 0 {
				rt.Fatalf("chunk %d: index %d, pieces [%d, +%d), want from %d", k, c.Index, c.First, c.Count, next)
			}
			if c.Bytes != c.Count*blen || c.Payload != c.Bytes || c.Bytes > maxChunk {
				rt.Fatalf("chunk %d: %d bytes for %d pieces of %d (max chunk %d)", k, c.Bytes, c.Count, blen, maxChunk)
			}
			if c.Gather != nil || c.Scatter != nil || !p.Filled(k) {
				rt.Fatalf("chunk %d carries runs", k)
			}
			if minChunk == 0 && next+c.Count < total && c.Bytes+blen <= maxChunk {
				rt.Fatalf("chunk %d of %d bytes has room for another piece under %d", k, c.Bytes, maxChunk)
			}
			next += c.Count
		}
		if next != total || p.Payload != total*blen || p.Descs != int(total) {
			rt.Fatalf("chunks cover %d of %d pieces (payload %d, descs %d)", next, total, p.Payload, p.Descs)
		}
		if s, d, ok := p.BlockTables(); !ok || len(s.IDs) != ids || len(d.IDs) != ids {
			rt.Fatal("plan lost its tables")
		}
	})
}

func TestLayoutBlocksRefuses(t *testing.T) {
	pool := transfer.Pool{Regions: []uint64{1 << 40}, BlockLen: 4096, Stride: 4096, Blocks: 8}
	two := pool
	two.Regions = []uint64{1 << 40, 2 << 40}
	wide := pool
	wide.BlockLen, wide.Stride = 8192, 8192
	ids := []uint32{1, 2}
	for _, c := range []struct {
		name     string
		src, dst transfer.Blocks
		max      uint64
	}{
		{"id counts", transfer.Blocks{Pool: pool, IDs: ids}, transfer.Blocks{Pool: pool, IDs: ids[:1]}, 1 << 20},
		{"block lengths", transfer.Blocks{Pool: pool, IDs: ids}, transfer.Blocks{Pool: wide, IDs: ids}, 1 << 20},
		{"region counts", transfer.Blocks{Pool: pool, IDs: ids}, transfer.Blocks{Pool: two, IDs: ids}, 1 << 20},
		{"block over max chunk", transfer.Blocks{Pool: pool, IDs: ids}, transfer.Blocks{Pool: pool, IDs: ids}, 4095},
		{"no max chunk", transfer.Blocks{Pool: pool, IDs: ids}, transfer.Blocks{Pool: pool, IDs: ids}, 0},
	} {
		if _, err := LayoutBlocks(c.src, c.dst, Options{MaxChunk: c.max}); err == nil {
			t.Fatalf("%s: planned", c.name)
		}
	}
}

// TestLayoutBlocksChunkLimit checks the chunk limit against the plan made
// without one, the MinChunk ramp included: a plan of at most the limit's
// chunks is made unchanged, a longer one is refused, and no chunk of a
// plan made exceeds MaxChunk.
func TestLayoutBlocksChunkLimit(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		blen := rapid.Uint64Range(1, 1<<12).Draw(rt, "blockLen")
		ids := rapid.IntRange(1, 2000).Draw(rt, "ids")
		maxChunk := blen*rapid.Uint64Range(1, 64).Draw(rt, "perChunk") + rapid.Uint64Range(0, blen-1).Draw(rt, "slack")
		var minChunk uint64
		if rapid.Bool().Draw(rt, "ramp") {
			minChunk = rapid.Uint64Range(1, maxChunk).Draw(rt, "minChunk")
		}
		pool := transfer.Pool{Regions: []uint64{1 << 40}, BlockLen: blen, Stride: blen, Blocks: uint64(ids), Kind: transfer.Host}
		tab := transfer.Blocks{Pool: pool, IDs: make([]uint32, ids)}
		opt := Options{MaxChunk: maxChunk, MinChunk: minChunk}
		whole, err := layoutBlocks(tab, tab, opt, ^uint64(0))
		if err != nil {
			rt.Fatal(err)
		}
		limit := rapid.Uint64Range(1, uint64(len(whole.Chunks))+2).Draw(rt, "limit")
		p, err := layoutBlocks(tab, tab, opt, limit)
		if uint64(len(whole.Chunks)) > limit {
			if err == nil {
				rt.Fatalf("a plan of %d chunks was made under a limit of %d", len(p.Chunks), limit)
			}
			return
		}
		if err != nil {
			rt.Fatalf("a plan of %d chunks was refused under a limit of %d: %v", len(whole.Chunks), limit, err)
		}
		if len(p.Chunks) != len(whole.Chunks) {
			rt.Fatalf("%d chunks under the limit, %d without", len(p.Chunks), len(whole.Chunks))
		}
		for k, c := range p.Chunks {
			if w := whole.Chunks[k]; c.First != w.First || c.Count != w.Count || c.Bytes > maxChunk {
				rt.Fatalf("chunk %d: %+v (without the limit %+v, max chunk %d)", k, c, whole.Chunks[k], maxChunk)
			}
		}
	})
}
