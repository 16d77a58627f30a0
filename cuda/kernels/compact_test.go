package kernels_test

import (
	"bytes"
	"testing"

	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/cuda/kernels"
	"github.com/bouncekv/bounce/transfer"
)

// fromCompact decodes compact pieces back into runs.
func fromCompact(ps []kernels.CompactPiece) []transfer.Run {
	var runs []transfer.Run
	for _, p := range ps {
		l := p.OffLen & 0xffff
		runs = append(runs, transfer.Run{RegionOff: p.OffLen >> 16, Addr: p.Addr, Len: l, Count: 1, RegionStride: l, AddrStride: l})
	}
	return runs
}

// TestCompactMovesTheSameBytes: compact pieces of compactable runs move
// exactly the runs' bytes to the same places, PieceCount of them, none
// longer than the limit, and a compact View appends in place.
func TestCompactMovesTheSameBytes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := cudatest.RandomPlan(rapid.Uint64().Draw(t, "seed"), cudatest.PlanOptions{
			Runs:     rapid.IntRange(1, 40).Draw(t, "runs"),
			MaxLen:   rapid.Uint64Range(1, 30000).Draw(t, "maxlen"),
			Aligned:  rapid.Bool().Draw(t, "aligned"),
			Shuffled: rapid.Bool().Draw(t, "shuffled"),
		})
		max := rapid.Uint64Range(1, kernels.CompactMax).Draw(t, "max")
		buf := make([]byte, 1<<20)
		view := kernels.ViewCompact(buf)
		var ps []kernels.CompactPiece
		var want uint64
		for _, r := range p.Runs {
			if !kernels.Compactable(r) {
				t.Fatalf("run %+v of an unstrided plan is not compactable", r)
			}
			ps = kernels.AppendCompact(ps, r, max)
			view = kernels.AppendCompact(view, r, max)
			want += kernels.PieceCount(r, max)
		}
		if uint64(len(ps)) != want {
			t.Fatalf("%d compact pieces, PieceCount says %d", len(ps), want)
		}
		for i, pc := range ps {
			if pc.OffLen&0xffff > max || pc.OffLen&0xffff == 0 {
				t.Fatalf("piece %d length %d outside [1, %d]", i, pc.OffLen&0xffff, max)
			}
			if view[i] != pc {
				t.Fatalf("view piece %d %+v, appended %+v", i, view[i], pc)
			}
		}
		pool := make([]byte, p.PoolSize)
		for i := range pool {
			pool[i] = byte(i*13 + 5)
		}
		got := make([]byte, p.RegionSize)
		wantB := make([]byte, p.RegionSize)
		p.Apply(true, wantB, pool)
		cudatest.Plan{Runs: fromCompact(ps), RegionSize: p.RegionSize, PoolSize: p.PoolSize}.Apply(true, got, pool)
		if !bytes.Equal(got, wantB) {
			t.Fatalf("compact pieces gather differently: %s", cudatest.Diff(got, wantB))
		}
	})
}

// TestCompactKernelsByteExact launches the compact kernels over random
// unstrided plans (unaligned and aligned bases, lengths to 40 KiB cut at
// CompactMax) and compares every byte of both buffers with the host.
func TestCompactKernelsByteExact(t *testing.T) {
	c := cudatest.Context(t)
	m, err := kernels.Load(c, cudatest.PTX(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unload()
	if !m.HasCompact() {
		t.Skip("the module has no compact kernels")
	}
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	args, err := kernels.NewArgs(c)
	if err != nil {
		t.Fatal(err)
	}
	defer args.Free()
	cases := []cudatest.PlanOptions{
		{Runs: 1, MaxLen: 1},
		{Runs: 300, MaxLen: 64},
		{Runs: 400, MaxLen: 5000, Shuffled: true},
		{Runs: 500, MaxLen: 4096, Aligned: true, Shuffled: true},
		{Runs: 100, MaxLen: 40000, Aligned: true, Shuffled: true},
	}
	for i, o := range cases {
		for _, gather := range []bool{true, false} {
			p := cudatest.RandomPlan(uint64(i*7+3), o)
			region := cudatest.Device(t, c, p.RegionSize+64)
			pool := cudatest.Device(t, c, p.PoolSize+64)
			skew := uint64(i % 2 * 3)
			rbase, pbase := region.Addr+skew, pool.Addr+skew
			regionB := cudatest.Fill(t, c, region, uint64(i)+10)
			poolB := cudatest.Fill(t, c, pool, uint64(i)+20)
			var ps []kernels.CompactPiece
			for _, r := range p.At(pbase) {
				ps = kernels.AppendCompact(ps, r, kernels.CompactMax)
			}
			table, host := cudatest.Pinned(t, c, uint64(len(ps))*kernels.CompactSize+16)
			copy(host, compactBytes(ps))
			if err := m.LaunchCompact(gather, s, args, cuda.DevicePtr(rbase), cuda.DevicePtr(table.Addr), uint64(len(ps))); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			p.Apply(gather, regionB[rbase-region.Addr:], poolB[pbase-pool.Addr:])
			if d := cudatest.Diff(cudatest.Read(t, c, region), regionB); d != "" {
				t.Errorf("case %d gather=%v: region %s", i, gather, d)
			}
			if d := cudatest.Diff(cudatest.Read(t, c, pool), poolB); d != "" {
				t.Errorf("case %d gather=%v: pool %s", i, gather, d)
			}
		}
	}
}

func compactBytes(ps []kernels.CompactPiece) []byte {
	b := make([]byte, 0, len(ps)*kernels.CompactSize)
	for _, p := range ps {
		b = appendU64(appendU64(b, p.Addr), p.OffLen)
	}
	return b
}

func appendU64(b []byte, v uint64) []byte {
	for i := range 8 {
		b = append(b, byte(v>>(8*i)))
	}
	return b
}
