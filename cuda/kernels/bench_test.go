package kernels_test

import (
	"fmt"
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
