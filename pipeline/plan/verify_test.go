package plan

import (
	"fmt"
	"sort"

	"github.com/bouncekv/bounce/transfer"
)

// piece is one expanded copy of a run.
type piece struct{ reg, addr, n uint64 }

// expand lists the single copies of runs, in region order, after checking
// they stay inside [0, limit) and do not overlap in the region.
func expand(runs []transfer.Run, limit uint64) ([]piece, error) {
	var out []piece
	for i, r := range runs {
		if r.Len == 0 || r.Count == 0 {
			return nil, fmt.Errorf("run %d %+v moves nothing", i, r)
		}
		for j := uint64(0); j < r.Count; j++ {
			p := piece{reg: r.RegionOff, addr: r.Addr, n: r.Len}
			if r.Count > 1 {
				p.reg += j * r.RegionStride
				p.addr += j * r.AddrStride
			}
			if p.reg+p.n > limit || p.reg+p.n < p.reg {
				return nil, fmt.Errorf("run %d copy %d [%d,+%d) outside region of %d bytes", i, j, p.reg, p.n, limit)
			}
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].reg < out[j].reg })
	for i := 1; i < len(out); i++ {
		if out[i].reg < out[i-1].reg+out[i-1].n {
			return nil, fmt.Errorf("copies [%d,+%d) and [%d,+%d) overlap in the region", out[i-1].reg, out[i-1].n, out[i].reg, out[i].n)
		}
	}
	return out, nil
}

// segment is a stretch of region bytes with its source and destination.
type segment struct{ reg, src, dst, n uint64 }

// segments pairs a chunk's gather and scatter copies byte for byte; they
// must cover exactly the same region bytes.
func segments(c Chunk) ([]segment, error) {
	g, err := expand(c.Gather, c.Bytes)
	if err != nil {
		return nil, fmt.Errorf("chunk %d gather: %w", c.Index, err)
	}
	s, err := expand(c.Scatter, c.Bytes)
	if err != nil {
		return nil, fmt.Errorf("chunk %d scatter: %w", c.Index, err)
	}
	var out []segment
	i, j, gi, sj := 0, 0, uint64(0), uint64(0)
	for i < len(g) && j < len(s) {
		a, b := g[i], s[j]
		if a.reg+gi != b.reg+sj {
			return nil, fmt.Errorf("chunk %d: gather covers region byte %d where scatter covers %d", c.Index, a.reg+gi, b.reg+sj)
		}
		n := min(a.n-gi, b.n-sj)
		out = append(out, segment{reg: a.reg + gi, src: a.addr + gi, dst: b.addr + sj, n: n})
		gi += n
		sj += n
		if gi == a.n {
			i, gi = i+1, 0
		}
		if sj == b.n {
			j, sj = j+1, 0
		}
	}
	if i != len(g) || j != len(s) {
		return nil, fmt.Errorf("chunk %d: gather and scatter cover different region bytes", c.Index)
	}
	return out, nil
}

// specCaps restates the package documentation's chunk caps from the
// chunks' payloads: MaxChunk, or with MinChunk the smallest of MaxChunk,
// MinChunk doubled once per earlier chunk, and half (rounded up, at least
// MinChunk) of the payload not yet placed — raised to all of it when less
// than MinChunk would be left after the chunk.
func specCaps(p *Plan, opt Options) []uint64 {
	caps := make([]uint64, len(p.Chunks))
	left := p.Payload
	for i, c := range p.Chunks {
		caps[i] = opt.MaxChunk
		if opt.MinChunk > 0 && opt.MinChunk < opt.MaxChunk {
			ramp := opt.MinChunk
			for k := 0; k < i && ramp < opt.MaxChunk; k++ {
				ramp *= 2
			}
			half := (left + 1) / 2
			c := min(opt.MaxChunk, ramp, max(opt.MinChunk, half))
			if left < c+opt.MinChunk {
				c = min(opt.MaxChunk, max(c, left))
			}
			caps[i] = c
		}
		left -= c.Payload
	}
	return caps
}

// verifyPlan checks a plan against its input independently of Build: every
// descriptor's bytes appear exactly once, in order, mapped src->dst
// correctly, each piece starting at an aligned region offset of a chunk with
// the descriptor's devices; chunks respect their caps (MaxChunk, or the
// ramp and taper of MinChunk), report their Bytes, Payload and Descs
// truthfully, and a new chunk starts only when needed.
func verifyPlan(p *Plan, src, dst []transfer.Desc, opt Options) error {
	align := opt.Align
	if align == 0 {
		align = DefaultAlign
	}
	caps := specCaps(p, opt)
	segs := make([][]segment, len(p.Chunks))
	var total uint64
	for ci, c := range p.Chunks {
		if c.Index != ci {
			return fmt.Errorf("chunk %d has Index %d", ci, c.Index)
		}
		if c.Bytes == 0 || c.Bytes > caps[ci] || c.Bytes > opt.MaxChunk {
			return fmt.Errorf("chunk %d: Bytes %d, cap %d, MaxChunk %d", ci, c.Bytes, caps[ci], opt.MaxChunk)
		}
		s, err := segments(c)
		if err != nil {
			return err
		}
		var payload, end uint64
		for _, sg := range s {
			payload += sg.n
			end = max(end, sg.reg+sg.n)
		}
		if payload != c.Payload || end != c.Bytes {
			return fmt.Errorf("chunk %d: runs move %d bytes ending at %d; chunk says Payload %d Bytes %d", ci, payload, end, c.Payload, c.Bytes)
		}
		if l := opt.Scatter; l.Bytes > 0 {
			if n := scatterCost(c, l); n > l.Bytes {
				return fmt.Errorf("chunk %d: scatter runs cost %d, limit %d", ci, n, l.Bytes)
			}
		}
		if opt.NoMerge {
			for _, r := range append(append([]transfer.Run(nil), c.Gather...), c.Scatter...) {
				if r.Count != 1 {
					return fmt.Errorf("chunk %d: NoMerge run %+v", ci, r)
				}
			}
			if len(c.Gather) != c.Descs || len(c.Scatter) != c.Descs {
				return fmt.Errorf("chunk %d: NoMerge %d descs but %d/%d runs", ci, c.Descs, len(c.Gather), len(c.Scatter))
			}
		}
		total += payload
		segs[ci] = s
	}
	if total != p.Payload {
		return fmt.Errorf("chunks move %d bytes, plan Payload %d", total, p.Payload)
	}

	pieces := make([]int, len(p.Chunks))
	descs := 0
	ci, si, off := 0, 0, uint64(0)
	for i := range src {
		s, d := src[i], dst[i]
		if s.Len == 0 {
			continue
		}
		descs++
		var parts []uint64 // bytes of this descriptor per chunk touched
		var partChunks []int
		var wantReg uint64 // region offset where the current piece continues
		for pos := uint64(0); pos < s.Len; {
			for ci < len(segs) && si == len(segs[ci]) {
				ci, si, off = ci+1, 0, 0
			}
			if ci == len(segs) {
				return fmt.Errorf("descriptor %d: bytes from %d on are in no chunk", i, pos)
			}
			c, sg := p.Chunks[ci], segs[ci][si]
			reg := sg.reg + off
			starts := pos == 0 || (si == 0 && off == 0)
			if starts {
				pieces[ci]++
				parts = append(parts, 0)
				partChunks = append(partChunks, ci)
				if reg%align != 0 {
					return fmt.Errorf("descriptor %d piece at region offset %d of chunk %d: not %d-aligned", i, reg, ci, align)
				}
				if c.SrcDevice != s.Device || c.SrcKind != s.Kind || c.DstDevice != d.Device || c.DstKind != d.Kind {
					return fmt.Errorf("descriptor %d (%v -> %v) in chunk %d of %s:%d -> %s:%d", i, s, d, ci, c.SrcKind, c.SrcDevice, c.DstKind, c.DstDevice)
				}
				if ci > 0 && reg == 0 && pos == 0 {
					prev := p.Chunks[ci-1]
					sameDev := prev.SrcDevice == s.Device && prev.SrcKind == s.Kind && prev.DstDevice == d.Device && prev.DstKind == d.Kind
					next := (prev.Bytes + align - 1) &^ (align - 1)
					full := opt.Scatter.Bytes > 0 && scatterCost(prev, opt.Scatter)+opt.Scatter.worst() > opt.Scatter.Bytes
					if sameDev && next+s.Len <= caps[ci-1] && !full {
						return fmt.Errorf("descriptor %d opened chunk %d though it fit at offset %d of chunk %d", i, ci, next, ci-1)
					}
				}
			}
			if !starts && reg != wantReg {
				return fmt.Errorf("descriptor %d byte %d continues at region offset %d of chunk %d, want %d", i, pos, reg, ci, wantReg)
			}
			if sg.src+off != s.Addr+pos || sg.dst+off != d.Addr+pos {
				return fmt.Errorf("descriptor %d byte %d: region %d of chunk %d maps %#x -> %#x, want %#x -> %#x",
					i, pos, reg, ci, sg.src+off, sg.dst+off, s.Addr+pos, d.Addr+pos)
			}
			n := min(sg.n-off, s.Len-pos)
			pos += n
			off += n
			parts[len(parts)-1] += n
			wantReg = reg + n
			if off == sg.n {
				si, off = si+1, 0
			}
		}
		if len(parts) > 1 && s.Len <= caps[partChunks[0]] {
			return fmt.Errorf("descriptor %d of %d bytes split into %v though it fits a chunk", i, s.Len, parts)
		}
		for j, n := range parts {
			if j < len(parts)-1 && n != caps[partChunks[j]] {
				return fmt.Errorf("descriptor %d split into pieces %v, want pieces of their chunks' caps %d", i, parts, caps[partChunks[j]])
			}
		}
	}
	for ci < len(segs) && si == len(segs[ci]) {
		ci, si = ci+1, 0
	}
	if ci != len(segs) {
		return fmt.Errorf("chunk %d moves bytes of no descriptor", ci)
	}
	if descs != p.Descs {
		return fmt.Errorf("%d non-empty descriptors, plan Descs %d", descs, p.Descs)
	}
	for ci, c := range p.Chunks {
		if c.Descs != pieces[ci] {
			return fmt.Errorf("chunk %d: Descs %d, holds %d pieces", ci, c.Descs, pieces[ci])
		}
	}
	return nil
}

// scatterCost is the size of c's scatter runs under l.
func scatterCost(c Chunk, l ScatterLimit) int {
	n := 0
	for _, r := range c.Scatter {
		if r.Count == 1 && r.RegionStride == 0 && r.AddrStride == 0 {
			n += l.Single
		} else {
			n += l.Strided
		}
	}
	return n
}
