package workload

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/bouncekv/bounce/transfer"
)

// Conversion is a layout-conversion workload: one request moves Tokens
// tokens of every layer's K and V from a source pool of layout Src (one
// prefill rank) into a destination pool of layout Dst (one decode rank),
// converted on the way; the heads both hold move. A request's pools are
// Layers × KV regions end to end, Tokens / Tokens-per-block blocks each,
// over the request's slice of each side's buffer.
type Conversion struct {
	Name, About string
	Src, Dst    transfer.Layout
	Tokens      uint32
	Fragmented  bool   // block ids in random order (from Seed), else 0, 1, ...
	Seed        uint64 // the pattern's and the ids' seed
}

// llama70b is one Llama-3.1-70B KV layout: 80 layers, K and V, heads of
// 128 bf16 elements.
func llama70b(heads, first, tokens uint32, o transfer.Order) transfer.Layout {
	return transfer.Layout{Layers: 80, KV: 2, Heads: heads, FirstHead: first, HeadDim: 128, Tokens: tokens, Elem: 2, Order: o}
}

// Conversions are the conversion presets, for an 8192-token prompt.
func Conversions() []Conversion {
	return []Conversion{
		{Name: "llama70b-tp8-tp4", About: "Llama-3.1-70B prefill TP=8 rank 1 (head 1) into decode TP=4 rank 0 (heads 0-1), 16-token NHD blocks: 16 interleaved 256 B pieces a block",
			Src: llama70b(1, 1, 16, transfer.NHD), Dst: llama70b(2, 0, 16, transfer.NHD)},
		{Name: "llama70b-b16-b32", About: "Llama-3.1-70B TP=8 (1 head), 16-token blocks into 32-token blocks: two source ids a destination id",
			Src: llama70b(1, 0, 16, transfer.NHD), Dst: llama70b(1, 0, 32, transfer.NHD)},
		{Name: "llama70b-nhd-hnd", About: "Llama-3.1-70B TP=4 (2 heads), 16-token blocks, token-major into head-major",
			Src: llama70b(2, 0, 16, transfer.NHD), Dst: llama70b(2, 0, 16, transfer.HND)},
	}
}

// LookupConversion returns the conversion preset name, fragmented, for an
// 8192-token prompt.
func LookupConversion(name string) (Conversion, error) {
	var names []string
	for _, c := range Conversions() {
		if c.Name == name {
			c.Tokens, c.Fragmented = 8192, true
			return c, nil
		}
		names = append(names, c.Name)
	}
	return Conversion{}, fmt.Errorf("workload: unknown layout preset %q; accepted: %s", name, strings.Join(names, ", "))
}

// Unconverted is c with the source layout on both sides: the same bytes
// moved as whole blocks, no conversion (the baseline a converted transfer
// is measured against).
func (c Conversion) Unconverted() Conversion {
	u := c
	u.Name, u.Dst = c.Name+"-unconverted", c.Src
	return u
}

// Validate reports why c describes no transfer: an invalid layout, or
// Tokens not whole blocks on either side.
func (c Conversion) Validate() error {
	for _, l := range []transfer.Layout{c.Src, c.Dst} {
		if err := l.Validate(); err != nil {
			return fmt.Errorf("workload: conversion %s: %w", c.Name, err)
		}
		if c.Tokens == 0 || c.Tokens%l.Tokens != 0 {
			return fmt.Errorf("workload: conversion %s: %d tokens are not whole blocks of %d", c.Name, c.Tokens, l.Tokens)
		}
	}
	return nil
}

// Blocks is the number of blocks of a request's pool of layout l.
func (c Conversion) Blocks(l transfer.Layout) uint64 { return uint64(c.Tokens / l.Tokens) }

// PoolBytes is the bytes of a request's pool of layout l.
func (c Conversion) PoolBytes(l transfer.Layout) uint64 {
	return uint64(l.Regions()) * c.Blocks(l) * l.BlockLen()
}

// Pool is a request's pool of layout l over a buffer at base: the regions
// end to end.
func (c Conversion) Pool(l transfer.Layout, base transfer.Desc) transfer.Pool {
	n := c.Blocks(l)
	p := transfer.Pool{BlockLen: l.BlockLen(), Stride: l.BlockLen(), Blocks: n, Kind: base.Kind, Device: base.Device}
	for r := range l.Regions() {
		p.Regions = append(p.Regions, base.Addr+uint64(r)*n*l.BlockLen())
	}
	return p
}

// Payload is the bytes a request moves: the heads both layouts hold, of
// every token, layer and K/V.
func (c Conversion) Payload() uint64 {
	h0, h1 := max(c.Src.FirstHead, c.Dst.FirstHead), min(c.Src.FirstHead+c.Src.Heads, c.Dst.FirstHead+c.Dst.Heads)
	if h0 >= h1 {
		return 0
	}
	return uint64(c.Src.Regions()) * uint64(c.Tokens) * uint64(h1-h0) * c.Src.HeadLen()
}

// IDs returns request seed's block ids of each side (a permutation each
// when Fragmented).
func (c Conversion) IDs(seed uint64) (src, dst []uint32) {
	perm := func(n uint64, salt uint64) []uint32 {
		ids := make([]uint32, n)
		for i := range ids {
			ids[i] = uint32(i)
		}
		if c.Fragmented {
			rng := rand.New(rand.NewPCG(seed, seed^salt))
			rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		}
		return ids
	}
	return perm(c.Blocks(c.Src), 0x5851f42d4c957f2d), perm(c.Blocks(c.Dst), 0x14057b7ef767814f)
}

// kv is l's pool of a request laid over b (address 0 is b[0]).
func (c Conversion) kv(l transfer.Layout, b []byte) KVPool {
	return KVPool{Pool: c.Pool(l, transfer.Desc{Kind: transfer.Host}), Layout: l, Mem: b}
}

// Fill writes request seed's source pool into b (PoolBytes(Src) bytes):
// every element's bytes encode its (layer, K/V, token, head, element).
func (c Conversion) Fill(b []byte, seed uint64) error {
	if uint64(len(b)) != c.PoolBytes(c.Src) {
		return fmt.Errorf("workload: conversion %s: source of %d bytes, want %d", c.Name, len(b), c.PoolBytes(c.Src))
	}
	ids, _ := c.IDs(seed)
	c.kv(c.Src, b).Put(seed, ids, 0, 0)
	return nil
}

// Verify checks request seed's destination pool in b (PoolBytes(Dst)
// bytes): every element of the heads the request moved is where the
// destination layout puts it, the error naming the first that is not.
func (c Conversion) Verify(b []byte, seed uint64) error {
	if uint64(len(b)) != c.PoolBytes(c.Dst) {
		return fmt.Errorf("workload: conversion %s: destination of %d bytes, want %d", c.Name, len(b), c.PoolBytes(c.Dst))
	}
	_, ids := c.IDs(seed)
	return c.kv(c.Dst, b).Check(seed, ids, c.Src.FirstHead, c.Src.FirstHead+c.Src.Heads)
}
