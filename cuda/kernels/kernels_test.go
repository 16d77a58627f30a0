package kernels_test

import (
	"bytes"
	"encoding/binary"
	"testing"
	"unsafe"

	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/cuda/kernels"
	"github.com/bouncekv/bounce/transfer"
)

// TestPiecesMoveTheSameBytes: cutting runs into pieces changes neither the
// bytes moved nor where they go, and no piece exceeds the limit.
func TestPiecesMoveTheSameBytes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := cudatest.RandomPlan(rapid.Uint64().Draw(t, "seed"), cudatest.PlanOptions{
			Runs:     rapid.IntRange(1, 40).Draw(t, "runs"),
			MaxLen:   rapid.Uint64Range(1, 9000).Draw(t, "maxlen"),
			Aligned:  rapid.Bool().Draw(t, "aligned"),
			Strided:  rapid.Bool().Draw(t, "strided"),
			Shuffled: rapid.Bool().Draw(t, "shuffled"),
		})
		max := rapid.Uint64Range(1, 20000).Draw(t, "max")
		pieces := kernels.Pieces(nil, p.Runs, max)
		var n uint64
		for i, pc := range pieces {
			if pc.Len*pc.Count > max && pc.Count > 1 || pc.Len > max {
				t.Fatalf("piece %d %+v exceeds %d bytes", i, pc, max)
			}
			n += pc.Bytes()
		}
		if n != p.Bytes() {
			t.Fatalf("pieces move %d bytes, runs %d", n, p.Bytes())
		}
		pool := make([]byte, p.PoolSize)
		for i := range pool {
			pool[i] = byte(i*31 + 7)
		}
		want := make([]byte, p.RegionSize)
		got := make([]byte, p.RegionSize)
		p.Apply(true, want, pool)
		cudatest.Plan{Runs: pieces, RegionSize: p.RegionSize, PoolSize: p.PoolSize}.Apply(true, got, pool)
		if !bytes.Equal(got, want) {
			t.Fatalf("pieces gather differently from runs: %s", cudatest.Diff(got, want))
		}
	})
}

// TestViewIsTheEncodedTable: pieces appended into a View of a table buffer
// are byte for byte what Encode writes, PieceCount counts them exactly,
// and appending within PieceCount never leaves the buffer.
func TestViewIsTheEncodedTable(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := cudatest.RandomPlan(rapid.Uint64().Draw(t, "seed"), cudatest.PlanOptions{
			Runs:    rapid.IntRange(1, 40).Draw(t, "runs"),
			MaxLen:  rapid.Uint64Range(1, 20000).Draw(t, "maxlen"),
			Strided: rapid.Bool().Draw(t, "strided"),
		})
		max := rapid.Uint64Range(1, 20000).Draw(t, "max")
		var count uint64
		for _, r := range p.Runs {
			k := kernels.PieceCount(r, max)
			if got := uint64(len(kernels.AppendPieces(nil, r, max))); got != k {
				t.Fatalf("run %+v: PieceCount %d, AppendPieces made %d", r, k, got)
			}
			count += k
		}
		want := kernels.Pieces(nil, p.Runs, max)
		enc := make([]byte, len(want)*kernels.PieceSize)
		if err := kernels.Encode(enc, want); err != nil {
			t.Fatal(err)
		}
		backing := make([]uint64, count*kernels.PieceSize/8+1) // 8-byte aligned
		buf := unsafe.Slice((*byte)(unsafe.Pointer(&backing[0])), count*kernels.PieceSize)
		view := kernels.View(buf)
		if len(buf) > 0 && (view == nil || uint64(cap(view)) != count) {
			t.Fatalf("view of %d bytes: cap %d, want %d", len(buf), cap(view), count)
		}
		for _, r := range p.Runs {
			view = kernels.AppendPieces(view, r, max)
		}
		if len(view) > 0 && unsafe.Pointer(&view[0]) != unsafe.Pointer(&buf[0]) {
			t.Fatal("appending within PieceCount reallocated the view")
		}
		if !bytes.Equal(buf, enc) {
			t.Fatalf("view bytes differ from Encode's: %s", cudatest.Diff(buf, enc))
		}
	})
}

func TestViewRefusesMisalignedBuffers(t *testing.T) {
	backing := make([]uint64, 13)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&backing[0])), 104)
	if kernels.View(b[1:]) != nil || kernels.View(b[:kernels.PieceSize-1]) != nil {
		t.Fatal("View accepted a misaligned or too short buffer")
	}
	if v := kernels.View(b); cap(v) != 2 || len(v) != 0 {
		t.Fatalf("View of 104 bytes: len %d cap %d, want 0 and 2", len(v), cap(v))
	}
}

func TestPiecesDropEmptyRuns(t *testing.T) {
	got := kernels.Pieces(nil, []transfer.Run{{Len: 0, Count: 5}, {Len: 9, Count: 0}}, 4096)
	if len(got) != 0 {
		t.Fatalf("pieces of empty runs: %+v", got)
	}
}

func TestEncodeLayout(t *testing.T) {
	ps := []transfer.Run{{RegionOff: 1, Addr: 2, Len: 3, Count: 4, RegionStride: 5, AddrStride: 6}, {RegionOff: 7, Addr: 8, Len: 9, Count: 10, RegionStride: 11, AddrStride: 12}}
	buf := make([]byte, 2*kernels.PieceSize)
	if err := kernels.Encode(buf, ps); err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		if v := binary.LittleEndian.Uint64(buf[8*i:]); v != uint64(i+1) {
			t.Fatalf("word %d = %d, want %d", i, v, i+1)
		}
	}
	if err := kernels.Encode(buf[:kernels.PieceSize], ps); err == nil {
		t.Fatal("Encode into a short buffer succeeded")
	}
}

func TestGrid(t *testing.T) {
	for _, c := range []struct {
		n    uint64
		wave int
		want uint32
	}{{0, 528, 1}, {1, 528, 1}, {8, 528, 1}, {9, 528, 2}, {100000, 528, 528}, {5, 0, 1}} {
		if got := kernels.Grid(c.n, c.wave); got != c.want {
			t.Errorf("Grid(%d, %d) = %d, want %d", c.n, c.wave, got, c.want)
		}
	}
}

// TestKernelsByteExact launches both kernels over random plans on device
// memory and compares every byte with the same copies done on the host.
func TestKernelsByteExact(t *testing.T) {
	c := cudatest.Context(t)
	m, err := kernels.Load(c, cudatest.PTX(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unload()
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
		{Runs: 200, MaxLen: 64},
		{Runs: 300, MaxLen: 5000, Shuffled: true},
		{Runs: 100, MaxLen: 40000, Aligned: true, Shuffled: true},
		{Runs: 100, MaxLen: 3000, Strided: true, Shuffled: true},
		{Runs: 50, MaxLen: 9000, Aligned: true, Strided: true},
		// Aligned bases (i%15 == 0): the wide kernels' one-round path.
		7: {}, 14: {}, 15: {Runs: 400, MaxLen: 4096, Aligned: true, Shuffled: true},
		30: {Runs: 300, MaxLen: 6000, Aligned: true, Strided: true, Shuffled: true},
	}
	wides := []bool{false}
	if m.HasWide() {
		wides = append(wides, true)
	} else {
		t.Log("the module has no wide kernels; only the general ones are checked")
	}
	for i, o := range cases {
		if o.Runs == 0 {
			continue
		}
		for _, gather := range []bool{true, false} {
			for _, zero := range []bool{true, false} {
				for _, wide := range wides {
					p := cudatest.RandomPlan(uint64(i*4+1), o)
					region := cudatest.Device(t, c, p.RegionSize+64)
					pool := cudatest.Device(t, c, p.PoolSize+64)
					// Odd base offsets exercise unaligned addresses.
					rbase, pbase := region.Addr+uint64(i%3), pool.Addr+uint64(i%5)
					regionB := cudatest.Fill(t, c, region, uint64(i)+100)
					poolB := cudatest.Fill(t, c, pool, uint64(i)+200)
					pieces := kernels.Pieces(nil, p.At(pbase), kernels.PieceBytes)
					table, hostTable := cudatest.Pinned(t, c, uint64(len(pieces))*kernels.PieceSize+1)
					if err := kernels.Encode(hostTable, pieces); err != nil {
						t.Fatal(err)
					}
					tableAt := cuda.DevicePtr(table.Addr)
					if !zero {
						dt := cudatest.Device(t, c, table.Len)
						if err := c.CopyHtoD(cuda.DevicePtr(dt.Addr), hostTable); err != nil {
							t.Fatal(err)
						}
						tableAt = cuda.DevicePtr(dt.Addr)
					}
					if err := m.LaunchAs(gather, wide, s, args, cuda.DevicePtr(rbase), tableAt, uint64(len(pieces))); err != nil {
						t.Fatal(err)
					}
					if err := s.Synchronize(); err != nil {
						t.Fatal(err)
					}
					p.Apply(gather, regionB[rbase-region.Addr:], poolB[pbase-pool.Addr:])
					if d := cudatest.Diff(cudatest.Read(t, c, region), regionB); d != "" {
						t.Errorf("case %d gather=%v zero-copy=%v wide=%v: region %s", i, gather, zero, wide, d)
					}
					if d := cudatest.Diff(cudatest.Read(t, c, pool), poolB); d != "" {
						t.Errorf("case %d gather=%v zero-copy=%v wide=%v: pool %s", i, gather, zero, wide, d)
					}
				}
			}
		}
	}
}
