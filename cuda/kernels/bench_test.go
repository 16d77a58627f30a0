package kernels_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/cuda/kernels"
	"github.com/bouncekv/bounce/transfer"
	"github.com/bouncekv/bounce/workload"
)

// BenchmarkGatherKernel times one gather launch over a whole fragmented
// workload (every descriptor gathered once into one region) against one
// contiguous device copy of the same bytes, both on one stream and timed
// by CUDA events in the same iteration, and reports both rates and their
// ratio. It runs with the piece table staged in device memory and read
// zero-copy from pinned host memory, into a device region and into a
// pinned host region (the PCIe path; there the copy is one DtoH), with
// the general kernels and with the wide ones (where the module has them;
// Launch picks the wide ones for pieces of 4 KiB and more on average).
//
//	go test -run '^$' -bench GatherKernel -benchtime 20x ./cuda/kernels/
func BenchmarkGatherKernel(b *testing.B) {
	c := cudatest.Context(b)
	m, err := kernels.Load(c, cudatest.PTX(b))
	if err != nil {
		b.Fatal(err)
	}
	defer m.Unload()
	s, err := c.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Destroy()
	args, err := kernels.NewArgs(c)
	if err != nil {
		b.Fatal(err)
	}
	defer args.Free()
	var ev [3]*cuda.Event
	for i := range ev {
		if ev[i], err = c.NewEvent(true); err != nil {
			b.Fatal(err)
		}
		defer ev[i].Destroy()
	}
	type family struct{ wide, wave bool }
	families := []family{{}}
	if m.HasWide() {
		families = append(families, family{wide: true}, family{wide: true, wave: true})
	}
	for _, w := range []struct {
		size  uint64
		count int
	}{{4096, 16384}, {4096, 81920}, {2048, 36864}, {512, 131072}} {
		spec := workload.Spec{DescSize: w.size, Count: w.count, Fragmented: true, Seed: 1}
		src := cudatest.Device(b, c, spec.Bytes())
		devRegion := cudatest.Device(b, c, spec.Bytes())
		for _, into := range []string{"device", "pinned-host"} {
			region := devRegion
			if into == "pinned-host" {
				if w.count != 81920 {
					continue
				}
				region, _ = cudatest.Pinned(b, c, spec.Bytes())
			}
			sd, _ := spec.Descs(src, region)
			runs := make([]transfer.Run, len(sd))
			for i, d := range sd {
				runs[i] = transfer.Run{RegionOff: uint64(i) * w.size, Addr: d.Addr, Len: d.Len, Count: 1}
			}
			pieces := kernels.Pieces(nil, runs, kernels.PieceBytes)
			table, host := cudatest.Pinned(b, c, uint64(len(pieces))*kernels.PieceSize)
			if err := kernels.Encode(host, pieces); err != nil {
				b.Fatal(err)
			}
			staged := cudatest.Device(b, c, table.Len)
			if err := c.CopyHtoD(cuda.DevicePtr(staged.Addr), host); err != nil {
				b.Fatal(err)
			}
			for _, tableAt := range []struct {
				name string
				p    uint64
			}{{"staged", staged.Addr}, {"zero-copy", table.Addr}} {
				for _, fam := range families {
					name := fmt.Sprintf("%dx%s/into-%s/table-%s/kernel-%s", w.count, sizeName(w.size), into, tableAt.name, familyName(fam.wide, fam.wave))
					b.Run(name, func(b *testing.B) {
						var kms, cms float64
						run := func() {
							must(b, ev[0].Record(s))
							launch := m.LaunchAs
							if fam.wave {
								launch = m.LaunchOneWave
							}
							must(b, launch(true, fam.wide, s, args, cuda.DevicePtr(region.Addr), cuda.DevicePtr(tableAt.p), uint64(len(pieces))))
							must(b, ev[1].Record(s))
							if into == "device" {
								must(b, s.CopyDtoD(cuda.DevicePtr(region.Addr), cuda.DevicePtr(src.Addr), spec.Bytes()))
							} else {
								must(b, s.CopyDtoH(uintptr(region.Addr), cuda.DevicePtr(src.Addr), spec.Bytes()))
							}
							must(b, ev[2].Record(s))
							must(b, ev[2].Synchronize())
						}
						run() // warm-up: JIT, first touch
						b.ResetTimer()
						for range b.N {
							run()
							k, err := ev[1].Elapsed(ev[0])
							must(b, err)
							cp, err := ev[2].Elapsed(ev[1])
							must(b, err)
							kms += float64(k)
							cms += float64(cp)
						}
						bytes := float64(spec.Bytes()) * float64(b.N)
						b.ReportMetric(bytes/kms/1e6, "kernel-GB/s")
						b.ReportMetric(bytes/cms/1e6, "copy-GB/s")
						b.ReportMetric(cms/kms, "kernel/copy")
					})
				}
			}
		}
	}
}

func familyName(wide, wave bool) string {
	switch {
	case wide && wave:
		return "wide-onewave"
	case wide:
		return "wide"
	}
	return "general"
}

func sizeName(n uint64) string {
	if n >= 1024 {
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkBlockKernel times one block-form launch (pieces addressed by
// (base, stride, id), no piece table) over a whole request — every block
// of a fragmented pool once, the ids a random permutation — against one
// contiguous device copy of the same bytes, both on one stream and timed
// by CUDA events in the same iteration, for gather and scatter, each
// block family the module holds, and the ids and bases read staged in
// device memory or zero-copy from pinned host memory. The descriptor-form
// kernel (piece table, Launch's choice of family) runs beside it on the
// same pieces.
//
//	go test -run '^$' -bench BlockKernel -benchtime 20x ./cuda/kernels/
func BenchmarkBlockKernel(b *testing.B) {
	c := cudatest.Context(b)
	m, err := kernels.Load(c, cudatest.PTX(b))
	if err != nil {
		b.Fatal(err)
	}
	defer m.Unload()
	if !m.HasBlocks(kernels.BlockGeneral) {
		b.Skip("the module has no block kernels")
	}
	s, err := c.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Destroy()
	args, err := kernels.NewArgs(c)
	if err != nil {
		b.Fatal(err)
	}
	defer args.Free()
	var ev [3]*cuda.Event
	for i := range ev {
		if ev[i], err = c.NewEvent(true); err != nil {
			b.Fatal(err)
		}
		defer ev[i].Destroy()
	}
	for _, w := range []struct {
		size  uint64
		count int
	}{{4096, 16384}, {4096, 81920}, {2048, 36864}, {512, 131072}} {
		total := w.size * uint64(w.count)
		// A pool of twice the blocks, the request a random half of them.
		poolMem := cudatest.Device(b, c, 2*total)
		region := cudatest.Device(b, c, total)
		other := cudatest.Device(b, c, total)
		perm := rand.New(rand.NewPCG(1, 2)).Perm(2 * w.count)
		ids := make([]uint32, w.count)
		for i := range ids {
			ids[i] = uint32(perm[i])
		}
		buf := make([]byte, 8+4*len(ids))
		binary.LittleEndian.PutUint64(buf, poolMem.Addr)
		for i, id := range ids {
			binary.LittleEndian.PutUint32(buf[8+4*i:], id)
		}
		pinned, host := cudatest.Pinned(b, c, uint64(len(buf)))
		copy(host, buf)
		staged := cudatest.Device(b, c, uint64(len(buf)))
		must(b, c.CopyHtoD(cuda.DevicePtr(staged.Addr), buf))
		// The descriptor form of the same pieces.
		runs := make([]transfer.Run, len(ids))
		for i, id := range ids {
			runs[i] = transfer.Run{RegionOff: uint64(i) * w.size, Addr: poolMem.Addr + uint64(id)*w.size, Len: w.size, Count: 1}
		}
		pieces := kernels.Pieces(nil, runs, kernels.PieceBytes)
		tab := make([]byte, len(pieces)*kernels.PieceSize)
		must(b, kernels.Encode(tab, pieces))
		table := cudatest.Device(b, c, uint64(len(tab)))
		must(b, c.CopyHtoD(cuda.DevicePtr(table.Addr), tab))
		type variant struct {
			name   string
			launch func(gather bool) error
		}
		var vs []variant
		for _, fam := range []kernels.BlockFamily{kernels.BlockGeneral, kernels.BlockVector, kernels.BlockBulk, kernels.BlockBulk2} {
			if !m.HasBlocks(fam) {
				continue
			}
			for _, at := range []struct {
				name string
				p    uint64
			}{{"staged", staged.Addr}, {"zero-copy", pinned.Addr}} {
				job := kernels.BlockJob{
					Region: cuda.DevicePtr(region.Addr), Bases: cuda.DevicePtr(at.p), IDs: cuda.DevicePtr(at.p + 8),
					NIDs: uint64(len(ids)), Count: uint64(len(ids)), Len: w.size, Stride: w.size,
				}
				vs = append(vs, variant{"blocks-" + fam.String() + "/ids-" + at.name, func(gather bool) error {
					return m.LaunchBlocks(gather, fam, s, args, job)
				}})
			}
		}
		vs = append(vs, variant{"descs/table-staged", func(gather bool) error {
			return m.Launch(gather, s, args, cuda.DevicePtr(region.Addr), cuda.DevicePtr(table.Addr), uint64(len(pieces)), total)
		}})
		if m.HasCompact() {
			var cps []kernels.CompactPiece
			for _, r := range runs {
				cps = kernels.AppendCompact(cps, r, kernels.CompactMax)
			}
			ctab := compactBytes(cps)
			ctable := cudatest.Device(b, c, uint64(len(ctab)))
			must(b, c.CopyHtoD(cuda.DevicePtr(ctable.Addr), ctab))
			vs = append(vs, variant{"descs-compact/table-staged", func(gather bool) error {
				return m.LaunchCompact(gather, s, args, cuda.DevicePtr(region.Addr), cuda.DevicePtr(ctable.Addr), uint64(len(cps)))
			}})
		}
		for _, dir := range []string{"gather", "scatter"} {
			gather := dir == "gather"
			for _, v := range vs {
				b.Run(fmt.Sprintf("%dx%s/%s/%s", w.count, sizeName(w.size), dir, v.name), func(b *testing.B) {
					var kms, cms float64
					run := func() {
						must(b, ev[0].Record(s))
						must(b, v.launch(gather))
						must(b, ev[1].Record(s))
						must(b, s.CopyDtoD(cuda.DevicePtr(other.Addr), cuda.DevicePtr(region.Addr), total))
						must(b, ev[2].Record(s))
						must(b, ev[2].Synchronize())
					}
					run()
					b.ResetTimer()
					for range b.N {
						run()
						k, err := ev[1].Elapsed(ev[0])
						must(b, err)
						cp, err := ev[2].Elapsed(ev[1])
						must(b, err)
						kms += float64(k)
						cms += float64(cp)
					}
					bytes := float64(total) * float64(b.N)
					b.ReportMetric(bytes/kms/1e6, "kernel-GB/s")
					b.ReportMetric(bytes/cms/1e6, "copy-GB/s")
					b.ReportMetric(cms/kms, "kernel/copy")
				})
			}
		}
	}
}
