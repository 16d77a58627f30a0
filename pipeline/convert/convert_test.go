package convert_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/pipeline/convert"
	"github.com/bouncekv/bounce/transfer"
)

// pat is the model's byte of element (layer, kv, token, head, dim), byte e.
func pat(layer, kv, tok, head, dim, e uint32) byte {
	x := uint64(layer)*0x9e3779b97f4a7c15 ^ uint64(kv)*0xbf58476d1ce4e5b9 ^ uint64(tok)*0x94d049bb133111eb ^
		uint64(head)*0x2545f4914f6cdd1d ^ uint64(dim)*0x5851f42d4c957f2d ^ uint64(e)*0x14057b7ef767814f
	x ^= x >> 29
	x *= 0xbf58476d1ce4e5b9
	return byte(x ^ x>>32)
}

// side is one pool of the model: its layout, geometry and bytes (addresses
// are offsets into mem).
type side struct {
	l    transfer.Layout
	pool transfer.Pool
	mem  []byte
}

func newSide(l transfer.Layout, blocks uint64, pad uint64, fill byte) *side {
	bl := l.BlockLen()
	s := &side{l: l, pool: transfer.Pool{BlockLen: bl, Stride: bl + pad, Blocks: blocks, Kind: transfer.Host}}
	ext := (blocks-1)*(bl+pad) + bl
	for r := range l.Regions() {
		s.pool.Regions = append(s.pool.Regions, uint64(r)*ext)
	}
	s.mem = bytes.Repeat([]byte{fill}, int(ext)*l.Regions())
	return s
}

// put writes the model's bytes of token tok (of the request) at token t of
// block id, for every head l holds, into mem (or into want).
func (s *side) put(mem []byte, id, t, tok uint32, heads [2]uint32) {
	hl := s.l.HeadLen()
	for r, base := range s.pool.Regions {
		layer, kv := uint32(r)/s.l.KV, uint32(r)%s.l.KV
		for h := heads[0]; h < heads[1]; h++ {
			off := base + uint64(id)*s.pool.Stride + s.l.Offset(t, h)
			for d := range s.l.HeadDim {
				for e := range s.l.Elem {
					mem[off+uint64(d*s.l.Elem+e)] = pat(layer, kv, tok, h, d, e)
				}
			}
		}
		_ = hl
	}
}

// move carries c out the way a pipeline does: units cut into chunks, each
// gathered by the source shape's runs into its own staging region and
// scattered by the destination shape's.
func move(t *rapid.T, c *convert.Conversion, src *side, sids []uint32, dst *side, dids []uint32, cuts []uint64) {
	groups, err := c.Groups(len(sids), len(dids))
	if err != nil {
		t.Fatalf("groups: %v", err)
	}
	units := groups * uint64(len(src.pool.Regions))
	for first := uint64(0); first < units; {
		n := units - first
		if len(cuts) > 0 {
			n = min(n, max(cuts[0], 1))
			cuts = cuts[1:]
		}
		staging := make([]byte, n*c.UnitLen())
		g := transfer.ShapedCopy{BlockCopy: transfer.BlockCopy{Blocks: transfer.Blocks{Pool: src.pool, IDs: sids}, First: first, Count: n}, Shape: c.Src}
		if err := g.Check(uint64(len(staging))); err != nil {
			t.Fatalf("gather check: %v", err)
		}
		g.Runs(func(addr, off, k uint64) bool { copy(staging[off:off+k], src.mem[addr:addr+k]); return true })
		sc := transfer.ShapedCopy{BlockCopy: transfer.BlockCopy{Blocks: transfer.Blocks{Pool: dst.pool, IDs: dids}, First: first, Count: n}, Shape: c.Dst}
		if err := sc.Check(uint64(len(staging))); err != nil {
			t.Fatalf("scatter check: %v", err)
		}
		sc.Runs(func(addr, off, k uint64) bool { copy(dst.mem[addr:addr+k], staging[off:off+k]); return true })
		first += n
	}
}

func genLayout(t *rapid.T, name string, base transfer.Layout, total uint32) transfer.Layout {
	l := base
	l.Heads = rapid.Uint32Range(1, total).Draw(t, name+"heads")
	l.FirstHead = rapid.Uint32Range(0, total-l.Heads).Draw(t, name+"first")
	l.Tokens = rapid.SampledFrom([]uint32{1, 2, 3, 4, 6, 8, 16}).Draw(t, name+"tokens")
	l.Order = rapid.SampledFrom([]transfer.Order{transfer.NHD, transfer.HND}).Draw(t, name+"order")
	return l
}

func distinctIDs(r *rand.Rand, n int, blocks uint64) []uint32 {
	perm := r.Perm(int(blocks))
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(perm[i])
	}
	return ids
}

// TestConversionPlacesEveryElement: for random layouts of one model (a
// head slice each, any block size and order), every element the two sides
// share lands where the destination layout says, and no other byte of the
// destination pool changes.
func TestConversionPlacesEveryElement(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		total := rapid.Uint32Range(1, 8).Draw(t, "total heads")
		base := transfer.Layout{
			Layers:  rapid.Uint32Range(1, 3).Draw(t, "layers"),
			KV:      rapid.Uint32Range(1, 2).Draw(t, "kv"),
			HeadDim: rapid.Uint32Range(1, 4).Draw(t, "headdim"),
			Elem:    rapid.SampledFrom([]uint32{1, 2, 4}).Draw(t, "elem"),
		}
		sl, dl := genLayout(t, "src ", base, total), genLayout(t, "dst ", base, total)
		c, err := convert.Plan(sl, dl, rapid.SampledFrom([]convert.Side{convert.Auto, convert.Receiver, convert.Sender}).Draw(t, "side"))
		h0, h1 := max(sl.FirstHead, dl.FirstHead), min(sl.FirstHead+sl.Heads, dl.FirstHead+dl.Heads)
		if h0 >= h1 {
			if !errors.Is(err, convert.ErrIncompatible) {
				t.Fatalf("disjoint heads planned: %v", err)
			}
			return
		}
		if err != nil {
			t.Fatalf("plan: %v", err)
		}
		checkShapes(t, c, sl, dl)
		groups := rapid.IntRange(1, 4).Draw(t, "groups")
		ns, nd := groups*int(c.Src.Group), groups*int(c.Dst.Group)
		r := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 1))
		src := newSide(sl, uint64(ns+rapid.IntRange(0, 3).Draw(t, "src spare")), uint64(rapid.IntRange(0, 2).Draw(t, "src pad")), 0x5a)
		dst := newSide(dl, uint64(nd+rapid.IntRange(0, 3).Draw(t, "dst spare")), uint64(rapid.IntRange(0, 2).Draw(t, "dst pad")), 0xa5)
		for i := range dst.mem {
			dst.mem[i] = byte(r.Uint32())
		}
		sids, dids := distinctIDs(r, ns, src.pool.Blocks), distinctIDs(r, nd, dst.pool.Blocks)
		want := bytes.Clone(dst.mem)
		for tok := uint32(0); tok < uint32(groups)*c.Tokens; tok++ {
			src.put(src.mem, sids[tok/sl.Tokens], tok%sl.Tokens, tok, [2]uint32{sl.FirstHead, sl.FirstHead + sl.Heads})
			dst.put(want, dids[tok/dl.Tokens], tok%dl.Tokens, tok, [2]uint32{h0, h1})
		}
		cuts := rapid.SliceOfN(rapid.Uint64Range(1, 8), 0, 8).Draw(t, "chunks")
		move(t, c, src, sids, dst, dids, cuts)
		if !bytes.Equal(dst.mem, want) {
			i := 0
			for dst.mem[i] == want[i] {
				i++
			}
			t.Fatalf("destination byte %d is %#x, want %#x (%d segments, %v)", i, dst.mem[i], want[i], len(c.Src.Segs), c.Rearranger)
		}
	})
}

// checkShapes: the two shapes are valid for their blocks, pair up segment
// by segment, the destination's are disjoint, and the unit moves the
// shared heads' bytes of a group exactly.
func checkShapes(t *rapid.T, c *convert.Conversion, sl, dl transfer.Layout) {
	if err := c.Src.Validate(sl.BlockLen()); err != nil {
		t.Fatalf("source shape: %v", err)
	}
	if err := c.Dst.Validate(dl.BlockLen()); err != nil {
		t.Fatalf("destination shape: %v", err)
	}
	if err := c.Dst.CheckDisjoint(); err != nil {
		t.Fatalf("destination shape: %v", err)
	}
	if err := c.Src.CheckDisjoint(); err != nil {
		t.Fatalf("source shape: %v", err)
	}
	if len(c.Src.Segs) != len(c.Dst.Segs) {
		t.Fatalf("%d source segments, %d destination", len(c.Src.Segs), len(c.Dst.Segs))
	}
	for i := range c.Src.Segs {
		if c.Src.Segs[i].Len != c.Dst.Segs[i].Len {
			t.Fatalf("segment %d: %d source bytes, %d destination", i, c.Src.Segs[i].Len, c.Dst.Segs[i].Len)
		}
	}
	if want := uint64(c.Tokens) * uint64(c.Heads) * sl.HeadLen(); c.UnitLen() != want {
		t.Fatalf("unit of %d bytes, want %d", c.UnitLen(), want)
	}
	if uint64(c.Src.Group)*uint64(sl.Tokens) != uint64(c.Tokens) || uint64(c.Dst.Group)*uint64(dl.Tokens) != uint64(c.Tokens) {
		t.Fatalf("groups %d x %d and %d x %d tokens, not %d", c.Src.Group, sl.Tokens, c.Dst.Group, dl.Tokens, c.Tokens)
	}
}

// TestMergeFillsSharedBlocks: several source ranks, each holding a slice of
// the heads, convert into the same destination blocks (a TP merge, many to
// one); together they write every byte of them, each its own.
func TestMergeFillsSharedBlocks(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ranks := rapid.SampledFrom([]uint32{2, 4}).Draw(t, "ranks")
		per := rapid.Uint32Range(1, 2).Draw(t, "heads a rank")
		base := transfer.Layout{Layers: 2, KV: 2, HeadDim: rapid.Uint32Range(1, 4).Draw(t, "headdim"), Elem: 2}
		dl := base
		dl.Heads, dl.Tokens = ranks*per, rapid.SampledFrom([]uint32{4, 8}).Draw(t, "dst tokens")
		dl.Order = rapid.SampledFrom([]transfer.Order{transfer.NHD, transfer.HND}).Draw(t, "dst order")
		groups := rapid.IntRange(1, 3).Draw(t, "groups")
		r := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 2))
		stok := rapid.SampledFrom([]uint32{2, 4, 8}).Draw(t, "src tokens")
		var dst *side
		var dids []uint32
		want := []byte(nil)
		for k := range ranks {
			sl := base
			sl.Heads, sl.FirstHead, sl.Tokens = per, k*per, stok
			sl.Order = rapid.SampledFrom([]transfer.Order{transfer.NHD, transfer.HND}).Draw(t, "src order")
			c, err := convert.Plan(sl, dl, convert.Auto)
			if err != nil {
				t.Fatalf("rank %d: %v", k, err)
			}
			if dst == nil {
				dst = newSide(dl, uint64(groups)*uint64(c.Dst.Group)+2, 0, 0)
				for i := range dst.mem {
					dst.mem[i] = byte(r.Uint32())
				}
				want = bytes.Clone(dst.mem)
				dids = distinctIDs(r, groups*int(c.Dst.Group), dst.pool.Blocks)
			}
			ns := groups * int(c.Src.Group)
			src := newSide(sl, uint64(ns), 0, 0)
			sids := distinctIDs(r, ns, src.pool.Blocks)
			for tok := uint32(0); tok < uint32(groups)*c.Tokens; tok++ {
				src.put(src.mem, sids[tok/sl.Tokens], tok%sl.Tokens, tok, [2]uint32{sl.FirstHead, sl.FirstHead + sl.Heads})
				dst.put(want, dids[tok/dl.Tokens], tok%dl.Tokens, tok, [2]uint32{sl.FirstHead, sl.FirstHead + sl.Heads})
			}
			move(t, c, src, sids, dst, dids, nil)
		}
		// Every byte of the named blocks is the model's now.
		for _, id := range dids {
			for _, base := range dst.pool.Regions {
				o := base + uint64(id)*dst.pool.Stride
				if !bytes.Equal(dst.mem[o:o+dst.pool.BlockLen], want[o:o+dst.pool.BlockLen]) {
					t.Fatalf("block %d at %d is not the merged ranks' bytes", id, o)
				}
			}
		}
		if !bytes.Equal(dst.mem, want) {
			t.Fatalf("bytes outside the blocks changed")
		}
	})
}

func TestPlanRefuses(t *testing.T) {
	ok := transfer.Layout{Layers: 80, KV: 2, Heads: 1, HeadDim: 128, Tokens: 16, Elem: 2, Order: transfer.NHD}
	for _, tc := range []struct {
		name string
		edit func(l *transfer.Layout)
		want string
	}{
		{"layers", func(l *transfer.Layout) { l.Layers = 40 }, "80 layers against 40"},
		{"kv", func(l *transfer.Layout) { l.KV = 1 }, "2 K/V tensors a layer against 1"},
		{"head size", func(l *transfer.Layout) { l.HeadDim = 64 }, "heads of 128 elements against 64"},
		{"element size", func(l *transfer.Layout) { l.Elem = 1 }, "elements of 2 bytes against 1"},
		{"heads", func(l *transfer.Layout) { l.FirstHead = 1 }, "no head in common"},
		{"group", func(l *transfer.Layout) { l.Tokens = 16 * 1025 }, "at most 1024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dl := ok
			tc.edit(&dl)
			_, err := convert.Plan(ok, dl, convert.Auto)
			if !errors.Is(err, convert.ErrIncompatible) || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
				t.Fatalf("err %v, want ErrIncompatible naming %q", err, tc.want)
			}
		})
	}
	bad := ok
	bad.KV = 3
	if _, err := convert.Plan(ok, bad, convert.Auto); err == nil || errors.Is(err, convert.ErrIncompatible) {
		t.Fatalf("invalid destination layout: %v", err)
	}
	c, err := convert.Plan(ok, ok, convert.Auto)
	if err != nil || !c.Identity() {
		t.Fatalf("same layout: %v, identity %v", err, c != nil && c.Identity())
	}
	if _, err := c.Groups(3, 2); !errors.Is(err, convert.ErrIncompatible) {
		t.Fatalf("3 ids against 2 paired: %v", err)
	}
}

// TestLlamaPresets pins the shapes of the brief's cases: llama70b TP=8 to
// TP=4 (a rank's 1 head into half of a 2-head block: 16 pieces of 256 B
// when token-major, one half when head-major), 16 to 32 tokens (two ids a
// group), NHD to HND.
func TestLlamaPresets(t *testing.T) {
	p8 := transfer.Layout{Layers: 80, KV: 2, Heads: 1, FirstHead: 1, HeadDim: 128, Tokens: 16, Elem: 2, Order: transfer.NHD}
	d4 := p8
	d4.Heads, d4.FirstHead = 2, 0
	c, err := convert.Plan(p8, d4, convert.Auto)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Dst.Segs) != 16 || c.Dst.Segs[0] != (transfer.Segment{Off: 256, Len: 256}) || c.Dst.Segs[1].Off != 768 || c.Rearranger != convert.Sender || c.UnitLen() != 4096 {
		t.Fatalf("TP8->4 NHD: %d segments %v..., %v", len(c.Dst.Segs), c.Dst.Segs[:2], c.Rearranger)
	}
	d4.Order = transfer.HND
	if c, err = convert.Plan(p8, d4, convert.Auto); err != nil || len(c.Dst.Segs) != 1 || c.Dst.Segs[0] != (transfer.Segment{Off: 4096, Len: 4096}) {
		t.Fatalf("TP8->4 NHD->HND: %v %v", err, c.Dst.Segs)
	}
	d4.Order = transfer.NHD
	p8.Order = transfer.HND
	if c, err = convert.Plan(p8, d4, convert.Auto); err != nil || len(c.Dst.Segs) != 16 {
		t.Fatalf("TP8->4 HND->NHD: %v %d", err, len(c.Dst.Segs))
	}
	b32 := p8
	b32.Tokens = 32
	if c, err = convert.Plan(p8, b32, convert.Auto); err != nil || c.Src.Group != 2 || c.Dst.Group != 1 || len(c.Src.Segs) != 2 {
		t.Fatalf("16->32: %v %+v", err, c)
	}
	hnd := p8
	hnd.Order, p8.Order = transfer.HND, transfer.NHD
	p8.Heads, hnd.Heads, hnd.FirstHead = 2, 2, 1
	if _, err = convert.Plan(p8, hnd, convert.Auto); err != nil {
		t.Fatalf("NHD->HND: %v", err)
	}
}
