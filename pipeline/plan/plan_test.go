package plan

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

const (
	srcBase = uint64(0x1000_0000)
	dstBase = uint64(0x9000_0000)
)

func host(addr, n uint64) transfer.Desc {
	return transfer.Desc{Addr: addr, Len: n, Kind: transfer.Host}
}

func cuda(dev int32, addr, n uint64) transfer.Desc {
	return transfer.Desc{Addr: addr, Len: n, Device: dev, Kind: transfer.CUDA}
}

// pairs builds back-to-back host descriptors of the given lengths with gap
// bytes between destinations.
func pairs(lens []uint64, dstGap uint64) (src, dst []transfer.Desc) {
	s, d := srcBase, dstBase
	for _, n := range lens {
		src = append(src, host(s, n))
		dst = append(dst, host(d, n))
		s += n
		d += n + dstGap
	}
	return src, dst
}

func mustBuild(t *testing.T, src, dst []transfer.Desc, opt Options) *Plan {
	t.Helper()
	p, err := Build(src, dst, opt)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if err := verifyPlan(p, src, dst, opt); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBuildRejectsBadInput(t *testing.T) {
	ok := []transfer.Desc{host(srcBase, 10), host(srcBase+10, 10)}
	for _, tc := range []struct {
		name     string
		src, dst []transfer.Desc
		opt      Options
		want     string
	}{
		{"length mismatch", ok, ok[:1], Options{MaxChunk: 64}, "2 source descriptors but 1"},
		{"pair length", ok, []transfer.Desc{host(dstBase, 10), host(dstBase+10, 11)}, Options{MaxChunk: 64}, "descriptor 1"},
		{"zero MaxChunk", ok, ok, Options{}, "MaxChunk"},
		{"align not power of two", ok, ok, Options{MaxChunk: 64, Align: 48}, "Align 48"},
		{"source wraps", []transfer.Desc{host(1, 1), host(^uint64(0)-5, 10)}, []transfer.Desc{host(1, 1), host(0, 10)}, Options{MaxChunk: 64}, "descriptor 1: source"},
		{"too many pieces", []transfer.Desc{host(0, 1<<40)}, []transfer.Desc{host(0, 1<<40)}, Options{MaxChunk: 4096}, "more than"},
		{"destination wraps", []transfer.Desc{host(0, 10)}, []transfer.Desc{host(^uint64(0), 10)}, Options{MaxChunk: 64}, "descriptor 0: destination"},
	} {
		p, err := Build(tc.src, tc.dst, tc.opt)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Build = %v, %v; want error containing %q", tc.name, p, err, tc.want)
		}
	}
	if p, err := Build(nil, nil, Options{MaxChunk: 1}); err != nil || len(p.Chunks) != 0 || p.Descs != 0 {
		t.Errorf("empty Build = %+v, %v", p, err)
	}
}

// layout summarises a plan as chunk sizes and piece offsets.
type layout struct {
	Bytes   []uint64
	Offsets [][]uint64
}

func layoutOf(p *Plan) layout {
	var l layout
	for _, c := range p.Chunks {
		l.Bytes = append(l.Bytes, c.Bytes)
		var offs []uint64
		for _, r := range c.Gather {
			offs = append(offs, r.RegionOff)
		}
		l.Offsets = append(l.Offsets, offs)
	}
	return l
}

func TestBuildBoundaries(t *testing.T) {
	const k = 4096
	for _, tc := range []struct {
		name string
		lens []uint64
		max  uint64
		want layout
	}{
		{"exactly MaxChunk", []uint64{k, k, k, k}, 4 * k,
			layout{[]uint64{4 * k}, [][]uint64{{0, k, 2 * k, 3 * k}}}},
		{"one byte over", []uint64{k, k, k, k, 1}, 4 * k,
			layout{[]uint64{4 * k, 1}, [][]uint64{{0, k, 2 * k, 3 * k}, {0}}}},
		{"one byte over in the last piece", []uint64{k, k, k, k + 1}, 4 * k,
			layout{[]uint64{3 * k, k + 1}, [][]uint64{{0, k, 2 * k}, {0}}}},
		{"alignment padding counts", []uint64{100, 100, 100}, 256,
			layout{[]uint64{228, 100}, [][]uint64{{0, 128}, {0}}}},
		{"padding never exceeds MaxChunk", []uint64{1, 1}, 40,
			layout{[]uint64{33}, [][]uint64{{0, 32}}}},
		{"zero lengths skipped", []uint64{0, 10, 0, 0, 20, 0}, 64,
			layout{[]uint64{52}, [][]uint64{{0, 32}}}},
		{"all zero", []uint64{0, 0}, 64, layout{}},
		{"split larger than MaxChunk", []uint64{10, 5*k/2 + 3, 7}, k, // pieces k, k, k/2+3
			layout{[]uint64{10, k, k, 2080 + 7}, [][]uint64{{0}, {0}, {0}, {0, 2080}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, dst := pairs(tc.lens, 0)
			p := mustBuild(t, src, dst, Options{MaxChunk: tc.max, NoMerge: true})
			if got := layoutOf(p); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("layout %+v, want %+v", got, tc.want)
			}
			var payload uint64
			descs := 0
			for _, n := range tc.lens {
				payload += n
				if n > 0 {
					descs++
				}
			}
			if p.Payload != payload || p.Descs != descs {
				t.Fatalf("plan Payload %d Descs %d, want %d %d", p.Payload, p.Descs, payload, descs)
			}
		})
	}
}

func TestBuildSplitsLargeDescriptor(t *testing.T) {
	const max = 4096
	src := []transfer.Desc{host(srcBase, 10), host(srcBase+100, 2*max+500), host(srcBase+20000, 7)}
	dst := []transfer.Desc{host(dstBase, 10), host(dstBase+100, 2*max+500), host(dstBase+20000, 7)}
	p := mustBuild(t, src, dst, Options{MaxChunk: max})
	if len(p.Chunks) != 4 || p.Descs != 3 {
		t.Fatalf("%d chunks, %d descs; want 4, 3", len(p.Chunks), p.Descs)
	}
	want := []struct {
		bytes, payload uint64
		descs          int
		gather         transfer.Run
	}{
		{10, 10, 1, transfer.Run{RegionOff: 0, Addr: srcBase, Len: 10, Count: 1}},
		{max, max, 1, transfer.Run{RegionOff: 0, Addr: srcBase + 100, Len: max, Count: 1}},
		{max, max, 1, transfer.Run{RegionOff: 0, Addr: srcBase + 100 + max, Len: max, Count: 1}},
		{512 + 7, 507, 2, transfer.Run{RegionOff: 0, Addr: srcBase + 100 + 2*max, Len: 500, Count: 1}},
	}
	for i, w := range want {
		c := p.Chunks[i]
		if c.Index != i || c.Bytes != w.bytes || c.Payload != w.payload || c.Descs != w.descs || c.Gather[0] != w.gather {
			t.Errorf("chunk %d = {Bytes %d Payload %d Descs %d Gather[0] %+v}, want %+v", i, c.Bytes, c.Payload, c.Descs, c.Gather[0], w)
		}
	}
	if last := p.Chunks[3].Scatter[1]; last.RegionOff != 512 || last.Addr != dstBase+20000 {
		t.Errorf("tail descriptor placed at %+v, want region offset 512", last)
	}
}

func TestBuildDeviceChangeStartsChunk(t *testing.T) {
	kindOnly := func(k transfer.MemKind, dev int32, addr uint64) transfer.Desc {
		return transfer.Desc{Addr: addr, Len: 64, Device: dev, Kind: k}
	}
	// Every boundary changes one thing: dst device, src device, src kind,
	// dst kind.
	src := []transfer.Desc{cuda(0, srcBase, 64), cuda(0, srcBase+64, 64), cuda(0, srcBase+128, 64), cuda(1, srcBase+192, 64),
		kindOnly(transfer.Host, 1, srcBase+256), kindOnly(transfer.Host, 1, srcBase+320)}
	dst := []transfer.Desc{cuda(2, dstBase, 64), cuda(3, dstBase+64, 64), cuda(3, dstBase+128, 64), cuda(3, dstBase+192, 64),
		cuda(3, dstBase+256, 64), kindOnly(transfer.Host, 3, dstBase+320)}
	p := mustBuild(t, src, dst, Options{MaxChunk: 1 << 20})
	type devs struct {
		sd, dd int32
		sk, dk transfer.MemKind
		n      int
	}
	want := []devs{
		{0, 2, transfer.CUDA, transfer.CUDA, 1},
		{0, 3, transfer.CUDA, transfer.CUDA, 2},
		{1, 3, transfer.CUDA, transfer.CUDA, 1},
		{1, 3, transfer.Host, transfer.CUDA, 1},
		{1, 3, transfer.Host, transfer.Host, 1},
	}
	if len(p.Chunks) != len(want) {
		t.Fatalf("%d chunks, want %d", len(p.Chunks), len(want))
	}
	for i, w := range want {
		c := p.Chunks[i]
		if (devs{c.SrcDevice, c.DstDevice, c.SrcKind, c.DstKind, c.Descs}) != w {
			t.Errorf("chunk %d: src %s:%d dst %s:%d descs %d, want %+v", i, c.SrcKind, c.SrcDevice, c.DstKind, c.DstDevice, c.Descs, w)
		}
	}
}

func TestBuildOffsetsAlignedAndDisjoint(t *testing.T) {
	lens := []uint64{1, 31, 32, 33, 4096, 7, 100, 1000, 64, 65}
	for _, align := range []uint64{0, 1, 8, 32, 256} {
		src, dst := pairs(lens, 3)
		opt := Options{MaxChunk: 2048, Align: align, NoMerge: true}
		p := mustBuild(t, src, dst, opt)
		want := align
		if want == 0 {
			want = DefaultAlign
		}
		for _, c := range p.Chunks {
			end := uint64(0)
			for _, r := range c.Gather {
				if r.RegionOff%want != 0 || r.RegionOff < end {
					t.Fatalf("align %d: chunk %d piece at %d (previous end %d)", align, c.Index, r.RegionOff, end)
				}
				end = r.RegionOff + r.Len
			}
			if end != c.Bytes || c.Bytes > opt.MaxChunk {
				t.Fatalf("align %d: chunk %d Bytes %d, last piece ends at %d", align, c.Index, c.Bytes, end)
			}
		}
	}
}

// TestDenseTransferMerges: 16,384 back-to-back 4 KiB pieces with contiguous
// sources and destinations collapse to one gather and one scatter run per
// chunk.
func TestDenseTransferMerges(t *testing.T) {
	const n, k = 16384, 4096
	lens := make([]uint64, n)
	for i := range lens {
		lens[i] = k
	}
	src, dst := pairs(lens, 0)
	for _, tc := range []struct {
		max    uint64
		chunks int
	}{{32 << 20, 2}, {16 << 20, 4}, {64 << 20, 1}} {
		p := mustBuild(t, src, dst, Options{MaxChunk: tc.max})
		if len(p.Chunks) != tc.chunks || p.Descs != n || p.Payload != n*k {
			t.Fatalf("MaxChunk %d: %d chunks %d descs %d bytes", tc.max, len(p.Chunks), p.Descs, p.Payload)
		}
		gather, scatter := 0, 0
		for _, c := range p.Chunks {
			gather += len(c.Gather)
			scatter += len(c.Scatter)
			want := transfer.Run{RegionOff: 0, Addr: dstBase + uint64(c.Index)*tc.max, Len: tc.max, Count: 1}
			if len(c.Scatter) != 1 || c.Scatter[0] != want {
				t.Fatalf("MaxChunk %d chunk %d scatter runs %+v, want [%+v]", tc.max, c.Index, c.Scatter, want)
			}
		}
		if gather > 4 || scatter > 4 || gather != tc.chunks || scatter != tc.chunks {
			t.Fatalf("MaxChunk %d: %d gather and %d scatter runs, want %d each", tc.max, gather, scatter, tc.chunks)
		}
	}
}

// TestFragmentedUniformStride: contiguous sources to destinations spaced by
// a fixed stride (every other 4 KiB block, or 1000-byte pieces every 3000
// bytes) merge to one strided scatter run per chunk.
func TestFragmentedUniformStride(t *testing.T) {
	for _, tc := range []struct {
		n, size, stride  uint64
		regionStride     uint64
		max              uint64
		gatherContiguous bool
	}{
		{4096, 4096, 8192, 4096, 8 << 20, true},
		{1000, 1000, 3000, 1024, 256 << 10, false},
	} {
		lens := make([]uint64, tc.n)
		for i := range lens {
			lens[i] = tc.size
		}
		src, dst := pairs(lens, tc.stride-tc.size)
		p := mustBuild(t, src, dst, Options{MaxChunk: tc.max})
		for _, c := range p.Chunks {
			perChunk := uint64(c.Descs)
			first := dstBase + uint64(c.Index)*uint64(p.Chunks[0].Descs)*tc.stride
			want := transfer.Run{RegionOff: 0, Addr: first, Len: tc.size, Count: perChunk, RegionStride: tc.regionStride, AddrStride: tc.stride}
			if len(c.Scatter) != 1 || c.Scatter[0] != want {
				t.Fatalf("size %d: chunk %d scatter %+v, want [%+v]", tc.size, c.Index, c.Scatter, want)
			}
			if tc.gatherContiguous && (len(c.Gather) != 1 || c.Gather[0].Count != 1 || c.Gather[0].Len != c.Payload) {
				t.Fatalf("chunk %d gather %+v, want one contiguous run", c.Index, c.Gather)
			}
			if !tc.gatherContiguous && (len(c.Gather) != 1 || c.Gather[0].Count != perChunk || c.Gather[0].AddrStride != tc.size) {
				t.Fatalf("chunk %d gather %+v, want one strided run", c.Index, c.Gather)
			}
		}
	}
}

func TestNoMergeOneRunPerPiece(t *testing.T) {
	const n = 1000
	lens := make([]uint64, n)
	for i := range lens {
		lens[i] = 4096
	}
	src, dst := pairs(lens, 0)
	p := mustBuild(t, src, dst, Options{MaxChunk: 1 << 20, NoMerge: true})
	total := 0
	for _, c := range p.Chunks {
		if len(c.Gather) != c.Descs || len(c.Scatter) != c.Descs {
			t.Fatalf("chunk %d: %d descs, %d gather / %d scatter runs", c.Index, c.Descs, len(c.Gather), len(c.Scatter))
		}
		for _, r := range append(append([]transfer.Run(nil), c.Gather...), c.Scatter...) {
			if r.Count != 1 || r.Len != 4096 {
				t.Fatalf("chunk %d run %+v is not a single piece", c.Index, r)
			}
		}
		total += c.Descs
	}
	if total != n {
		t.Fatalf("%d runs, want %d", total, n)
	}
}

func TestCoalesce(t *testing.T) {
	r := func(reg, addr, n uint64) transfer.Run {
		return transfer.Run{RegionOff: reg, Addr: addr, Len: n, Count: 1}
	}
	for _, tc := range []struct {
		name     string
		in, want []transfer.Run
	}{
		{"empty", nil, nil},
		{"contiguous", []transfer.Run{r(0, 100, 10), r(10, 110, 5), r(15, 115, 1)}, []transfer.Run{r(0, 100, 16)}},
		{"region gap breaks growth but latches a stride",
			[]transfer.Run{r(0, 100, 10), r(32, 110, 10)},
			[]transfer.Run{{RegionOff: 0, Addr: 100, Len: 10, Count: 2, RegionStride: 32, AddrStride: 10}}},
		{"stride extends",
			[]transfer.Run{r(0, 0, 8), r(8, 100, 8), r(16, 200, 8), r(24, 300, 8)},
			[]transfer.Run{{RegionOff: 0, Addr: 0, Len: 8, Count: 4, RegionStride: 8, AddrStride: 100}}},
		{"stride breaks on a different gap",
			[]transfer.Run{r(0, 0, 8), r(8, 100, 8), r(16, 201, 8)},
			[]transfer.Run{{RegionOff: 0, Addr: 0, Len: 8, Count: 2, RegionStride: 8, AddrStride: 100}, r(16, 201, 8)}},
		{"stride breaks on a different length",
			[]transfer.Run{r(0, 0, 8), r(8, 100, 8), r(16, 200, 9)},
			[]transfer.Run{{RegionOff: 0, Addr: 0, Len: 8, Count: 2, RegionStride: 8, AddrStride: 100}, r(16, 200, 9)}},
		{"backwards address never merges", []transfer.Run{r(0, 100, 8), r(8, 50, 8)}, []transfer.Run{r(0, 100, 8), r(8, 50, 8)}},
		{"overlapping address never merges", []transfer.Run{r(0, 100, 8), r(8, 104, 8)}, []transfer.Run{r(0, 100, 8), r(8, 104, 8)}},
		{"unequal lengths with a gap stay apart", []transfer.Run{r(0, 0, 8), r(32, 100, 4)}, []transfer.Run{r(0, 0, 8), r(32, 100, 4)}},
		{"empty runs dropped", []transfer.Run{r(0, 0, 0), r(0, 0, 8), {RegionOff: 8, Addr: 8, Len: 8}}, []transfer.Run{r(0, 0, 8)}},
		{"strided input kept and extended",
			[]transfer.Run{{RegionOff: 0, Addr: 0, Len: 4, Count: 3, RegionStride: 4, AddrStride: 10}, r(12, 30, 4)},
			[]transfer.Run{{RegionOff: 0, Addr: 0, Len: 4, Count: 4, RegionStride: 4, AddrStride: 10}}},
		{"no overflow at the top of the address space",
			[]transfer.Run{r(0, ^uint64(0)-7, 8), r(8, 0, 8)},
			[]transfer.Run{r(0, ^uint64(0)-7, 8), r(8, 0, 8)}},
	} {
		in := append([]transfer.Run(nil), tc.in...)
		got := Coalesce(tc.in)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: Coalesce = %+v, want %+v", tc.name, got, tc.want)
		}
		if !reflect.DeepEqual(in, tc.in) {
			t.Errorf("%s: Coalesce modified its input", tc.name)
		}
	}
}

func TestCheckRuns(t *testing.T) {
	good := []transfer.Run{{RegionOff: 0, Len: 8, Count: 4, RegionStride: 16}, {RegionOff: 64, Len: 36, Count: 1}}
	if n, err := CheckRuns(good, 100); err != nil || n != 68 {
		t.Fatalf("CheckRuns(good) = %d, %v", n, err)
	}
	for _, tc := range []struct {
		name string
		run  transfer.Run
	}{
		{"past the end", transfer.Run{RegionOff: 96, Len: 5, Count: 1}},
		{"strided past the end", transfer.Run{RegionOff: 0, Len: 8, Count: 8, RegionStride: 16}},
		{"overlapping copies", transfer.Run{RegionOff: 0, Len: 8, Count: 2, RegionStride: 4}},
		{"empty", transfer.Run{RegionOff: 0, Len: 0, Count: 1}},
		{"zero count", transfer.Run{RegionOff: 0, Len: 8}},
		{"wrapping", transfer.Run{RegionOff: ^uint64(0) - 1, Len: 8, Count: 1}},
		{"huge count", transfer.Run{RegionOff: 0, Len: 1, Count: 1 << 62, RegionStride: 8}},
		{"address wraps", transfer.Run{RegionOff: 0, Addr: ^uint64(0) - 2, Len: 8, Count: 1}},
	} {
		if _, err := CheckRuns([]transfer.Run{tc.run}, 100); err == nil {
			t.Errorf("%s: CheckRuns accepted %+v", tc.name, tc.run)
		}
	}
}

// TestRampAndTaper: with MinChunk the caps ramp up from it and taper off
// toward the end, and the plan still moves every byte once.
func TestRampAndTaper(t *testing.T) {
	const KiB, MiB = 1 << 10, 1 << 20
	descs := func(n int) ([]transfer.Desc, []transfer.Desc) {
		var src, dst []transfer.Desc
		for i := range n {
			src = append(src, transfer.Desc{Addr: 1<<40 + uint64(i)*8*KiB, Len: 4 * KiB})
			dst = append(dst, transfer.Desc{Addr: 1<<41 + uint64(n-1-i)*4*KiB, Len: 4 * KiB})
		}
		return src, dst
	}
	sizes := func(p *Plan) []uint64 {
		var out []uint64
		for _, c := range p.Chunks {
			out = append(out, c.Payload)
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		descs    int
		min, max uint64
		want     []uint64
	}{
		{"16MiB", 4096, 2 * MiB, 8 * MiB, []uint64{2 * MiB, 4 * MiB, 5 * MiB, 2*MiB + 512*KiB, 2*MiB + 512*KiB}},
		{"off", 4096, 0, 8 * MiB, []uint64{8 * MiB, 8 * MiB}},
		{"min at max", 4096, 8 * MiB, 8 * MiB, []uint64{8 * MiB, 8 * MiB}},
		{"smaller than min", 100, 2 * MiB, 8 * MiB, []uint64{400 * KiB}},
		{"3MiB", 768, 2 * MiB, 8 * MiB, []uint64{3 * MiB}},
	} {
		src, dst := descs(tc.descs)
		p, err := Build(src, dst, Options{MaxChunk: tc.max, MinChunk: tc.min})
		if err != nil {
			t.Fatal(err)
		}
		if got := sizes(p); !slices.Equal(got, tc.want) {
			t.Errorf("%s: chunk payloads %v, want %v", tc.name, got, tc.want)
		}
	}
	// 320 MiB: ramps up, runs at MaxChunk, tapers off; never above MaxChunk.
	src, dst := descs(81920)
	p, err := Build(src, dst, Options{MaxChunk: 8 * MiB, MinChunk: 2 * MiB})
	if err != nil {
		t.Fatal(err)
	}
	got := sizes(p)
	n := len(got)
	if got[0] != 2*MiB || got[1] != 4*MiB || got[2] != 8*MiB || !slices.Equal(got[n-4:], []uint64{8 * MiB, 5 * MiB, 2*MiB + 512*KiB, 2*MiB + 512*KiB}) {
		t.Fatalf("320MiB chunk payloads %v", got)
	}
	for i, c := range p.Chunks {
		if c.Bytes > 8*MiB {
			t.Fatalf("chunk %d needs %d bytes, over MaxChunk", i, c.Bytes)
		}
	}
}

// TestRunPoolReuses checks that a stream of plans filled from one RunPool
// and recycled chunk by chunk allocates no run arrays once warm.
func TestRunPoolReuses(t *testing.T) {
	src := make([]transfer.Desc, 512)
	dst := make([]transfer.Desc, 512)
	for i := range src {
		src[i] = transfer.Desc{Addr: srcBase + uint64(i*7919%512)*4096, Len: 4096}
		dst[i] = transfer.Desc{Addr: dstBase + uint64(i*104729%512)*4096, Len: 4096}
	}
	var pool RunPool
	run := func() {
		p, err := Layout(src, dst, Options{MaxChunk: 256 << 10})
		if err != nil {
			t.Fatal(err)
		}
		for k := range p.Chunks {
			p.FillFrom(k, &pool)
			p.RecycleGather(k, &pool)
			p.RecycleScatter(k, &pool)
		}
	}
	run()
	fresh := testing.AllocsPerRun(20, func() {
		p, _ := Layout(src, dst, Options{MaxChunk: 256 << 10})
		p.FillAll()
	})
	pooled := testing.AllocsPerRun(20, run)
	t.Logf("allocations per plan: fresh %.0f, pooled %.0f", fresh, pooled)
	// Layout allocates the chunk list; the fresh fill two arrays per chunk.
	if chunks := 8.0; pooled > fresh-2*chunks+0.5 {
		t.Fatalf("pooled fill allocates %.0f times a plan, fresh %.0f: the pool is not reused", pooled, fresh)
	}
}
