// Package workload describes KV-cache-shaped transfers: the presets of one
// rank's KV cache for an 8192-token prompt (model × TP × block size), the
// descriptor layout (contiguous or fragmented block ids, reproducible from a
// seed), the block-table layout of the same bytes (Spec.Regions: one region
// per layer and K/V, Count/Regions block ids per request, as inference
// servers hold KV), and a byte pattern unique to every (seed, piece) so
// verification catches cross-talk as well as corruption.
package workload

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"

	"github.com/bouncekv/bounce/transfer"
)

// Preset is one row of the sizing table: Count descriptors of DescSize
// bytes, which are also Layers × {K, V} regions of Count/(2 × Layers) blocks
// (the block ids of one request).
type Preset struct {
	Name     string
	Model    string
	TP       int
	Block    int
	DescSize uint64
	Count    int
	Layers   int
}

// Bytes returns the preset's payload.
func (p Preset) Bytes() uint64 { return p.DescSize * uint64(p.Count) }

// Regions is the number of pool regions of the block-table form: K and V of
// every layer.
func (p Preset) Regions() int { return 2 * p.Layers }

// IDs is the number of block ids one request names on each side: 8192
// tokens over the block size.
func (p Preset) IDs() int { return p.Count / p.Regions() }

// Presets returns the sizing table: Llama-3.1-70B (80 layers) at TP=8 and
// TP=1 and gpt-oss-120b (36 layers) at TP=8, each at block sizes 16, 32 and
// 64 (bf16, no merging). A Llama-3.1-70B TP=8 b16 request is 160 regions ×
// 512 ids of 4 KiB (81,920 pieces); gpt-oss-120b's is 72 × 512 of 2 KiB.
func Presets() []Preset {
	var out []Preset
	add := func(model, short string, tp int, base uint64, count, layers int) {
		for i, block := range []int{16, 32, 64} {
			out = append(out, Preset{
				Name:     fmt.Sprintf("%s-tp%d-b%d", short, tp, block),
				Model:    model,
				TP:       tp,
				Block:    block,
				DescSize: base << i,
				Count:    count >> i,
				Layers:   layers,
			})
		}
	}
	add("Llama-3.1-70B", "llama70b", 8, 4<<10, 81920, 80)
	add("Llama-3.1-70B", "llama70b", 1, 32<<10, 81920, 80)
	add("gpt-oss-120b", "gptoss120b", 8, 2<<10, 36864, 36)
	return out
}

// Lookup finds a preset by name.
func Lookup(name string) (Preset, error) {
	var names []string
	for _, p := range Presets() {
		if p.Name == name {
			return p, nil
		}
		names = append(names, p.Name)
	}
	sort.Strings(names)
	return Preset{}, fmt.Errorf("workload: unknown preset %q; accepted: %s", name, strings.Join(names, ", "))
}

// Spec is one transfer: Count blocks of DescSize bytes moved from the source
// buffer's block slots to the destination buffer's block slots. Fragmented
// shuffles both sides' slots (random block ids); otherwise block i sits in
// slot i on both sides. Seed fixes the shuffle and the bytes.
//
// With Regions set, each buffer is a pool of Regions regions laid end to
// end, each Count/Regions blocks of DescSize (stride DescSize), and the
// transfer is a block table on each side (Blocks): piece q — the Count
// pieces numbered region-major, as transfer.Blocks numbers them — is block
// IDs[q % n] of region q / n. Fragmented draws each side's ids as a random
// permutation; otherwise they are 0..n-1. Descs then lists the very same
// pieces as descriptors, so both forms move the same bytes between the same
// places and verify alike.
type Spec struct {
	DescSize   uint64
	Count      int
	Fragmented bool
	Seed       uint64
	Regions    int
}

// Validate reports a spec that describes no transfer.
func (s Spec) Validate() error {
	if s.DescSize == 0 || s.Count <= 0 {
		return fmt.Errorf("workload: spec needs a positive descriptor size and count (got %d x %d)", s.Count, s.DescSize)
	}
	if s.Regions < 0 || s.Regions > transfer.MaxPoolRegions || (s.Regions > 0 && s.Count%s.Regions != 0) {
		return fmt.Errorf("workload: %d regions do not divide %d pieces (0 to %d regions accepted)", s.Regions, s.Count, transfer.MaxPoolRegions)
	}
	return nil
}

// IDs returns the block ids of each side's table (Regions set): n =
// Count/Regions ids, a permutation each when Fragmented.
func (s Spec) IDs() (src, dst []uint32) {
	n := s.Count / max(1, s.Regions)
	src, dst = make([]uint32, n), make([]uint32, n)
	for i := range src {
		src[i], dst[i] = uint32(i), uint32(i)
	}
	if s.Fragmented {
		rng := rand.New(rand.NewPCG(s.Seed, s.Seed^0x5851f42d4c957f2d))
		rng.Shuffle(n, func(i, j int) { src[i], src[j] = src[j], src[i] })
		rng.Shuffle(n, func(i, j int) { dst[i], dst[j] = dst[j], dst[i] })
	}
	return src, dst
}

// Pool returns the pool of the block-table layout (Regions set) over a
// buffer starting at base: Regions regions end to end, each Count/Regions
// blocks of DescSize.
func (s Spec) Pool(base transfer.Desc) transfer.Pool {
	n := uint64(s.Count / max(1, s.Regions))
	p := transfer.Pool{BlockLen: s.DescSize, Stride: s.DescSize, Blocks: n, Kind: base.Kind, Device: base.Device}
	p.Regions = make([]uint64, max(1, s.Regions))
	for r := range p.Regions {
		p.Regions[r] = base.Addr + uint64(r)*n*s.DescSize
	}
	return p
}

// Blocks returns the block tables (Regions set) of buffers starting at
// srcBase and dstBase: the same pieces Descs lists.
func (s Spec) Blocks(srcBase, dstBase transfer.Desc) (src, dst transfer.Blocks) {
	si, di := s.IDs()
	return transfer.Blocks{Pool: s.Pool(srcBase), IDs: si}, transfer.Blocks{Pool: s.Pool(dstBase), IDs: di}
}

// Bytes returns the payload (and the size of each buffer).
func (s Spec) Bytes() uint64 { return s.DescSize * uint64(s.Count) }

// slots returns each block's slot on the source and on the destination.
func (s Spec) slots() (src, dst []int) {
	src, dst = make([]int, s.Count), make([]int, s.Count)
	if s.Regions > 0 {
		si, di := s.IDs()
		n := len(si)
		for q := range src {
			r, k := q/n, q%n
			src[q], dst[q] = r*n+int(si[k]), r*n+int(di[k])
		}
		return src, dst
	}
	for i := range src {
		src[i], dst[i] = i, i
	}
	if s.Fragmented {
		rng := rand.New(rand.NewPCG(s.Seed, s.Seed^0x5851f42d4c957f2d))
		rng.Shuffle(len(src), func(i, j int) { src[i], src[j] = src[j], src[i] })
		rng.Shuffle(len(dst), func(i, j int) { dst[i], dst[j] = dst[j], dst[i] })
	}
	return src, dst
}

// Descs returns the descriptor lists for buffers starting at srcBase and
// dstBase (host memory).
func (s Spec) Descs(srcBase, dstBase transfer.Desc) (src, dst []transfer.Desc) {
	ss, ds := s.slots()
	src, dst = make([]transfer.Desc, s.Count), make([]transfer.Desc, s.Count)
	for i := range ss {
		src[i] = transfer.Desc{Addr: srcBase.Addr + uint64(ss[i])*s.DescSize, Len: s.DescSize, Device: srcBase.Device, Kind: srcBase.Kind}
		dst[i] = transfer.Desc{Addr: dstBase.Addr + uint64(ds[i])*s.DescSize, Len: s.DescSize, Device: dstBase.Device, Kind: dstBase.Kind}
	}
	return src, dst
}

// Fill writes every block's pattern into its slot of the source buffer.
func (s Spec) Fill(src []byte) error {
	if uint64(len(src)) < s.Bytes() {
		return fmt.Errorf("workload: source buffer has %d bytes, spec needs %d", len(src), s.Bytes())
	}
	ss, _ := s.slots()
	for i, slot := range ss {
		o := uint64(slot) * s.DescSize
		pattern(src[o:o+s.DescSize], s.Seed, uint64(i))
	}
	return nil
}

// Verify checks every block's pattern in its slot of the destination buffer
// and names the first wrong byte. It allocates nothing per block, so it can
// verify multi-GiB descriptors.
func (s Spec) Verify(dst []byte) error {
	if uint64(len(dst)) < s.Bytes() {
		return fmt.Errorf("workload: destination buffer has %d bytes, spec needs %d", len(dst), s.Bytes())
	}
	_, ds := s.slots()
	for i, slot := range ds {
		o := uint64(slot) * s.DescSize
		if k, got, want, ok := check(dst[o:o+s.DescSize], s.Seed, uint64(i)); !ok {
			return fmt.Errorf("workload: seed %d block %d (slot %d) byte %d = %#02x, want %#02x", s.Seed, i, slot, k, got, want)
		}
	}
	return nil
}

// stream is the xorshift word stream keyed by (seed, block).
type stream uint64

func newStream(seed, block uint64) stream {
	return stream((seed+1)*0x9e3779b97f4a7c15 ^ (block+1)*0xbf58476d1ce4e5b9)
}

func (x *stream) next() uint64 {
	v := uint64(*x)
	v ^= v << 13
	v ^= v >> 7
	v ^= v << 17
	*x = stream(v)
	return v
}

// pattern fills b with the stream of (seed, block), little-endian words.
func pattern(b []byte, seed, block uint64) {
	x := newStream(seed, block)
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], x.next())
	}
	if i < len(b) {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], x.next())
		copy(b[i:], w[:])
	}
}

// check compares b with the pattern of (seed, block) and returns the first
// differing byte's index and values.
func check(b []byte, seed, block uint64) (k int, got, want byte, ok bool) {
	x := newStream(seed, block)
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		v := x.next()
		if i+8 <= len(b) && binary.LittleEndian.Uint64(b[i:]) == v {
			continue
		}
		binary.LittleEndian.PutUint64(w[:], v)
		for j := 0; j < 8 && i+j < len(b); j++ {
			if b[i+j] != w[j] {
				return i + j, b[i+j], w[j], false
			}
		}
	}
	return 0, 0, 0, true
}
