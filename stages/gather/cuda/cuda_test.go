package cuda_test

import (
	"bytes"
	"testing"

	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/cuda/kernels"
	"github.com/bouncekv/bounce/mem"
	stage "github.com/bouncekv/bounce/stages/gather/cuda"
	"github.com/bouncekv/bounce/transfer"
)

// TestCapabilitiesFollowTheModule: the stage claims the block form and the
// shaped form only where its kernel module has those kernels (a module
// without them left the stage claiming the block form, every chunk then
// failing ErrUnsupported instead of falling back to runs); without them
// it still moves runs.
func TestCapabilitiesFollowTheModule(t *testing.T) {
	c := cudatest.Context(t)
	full := cudatest.PTX(t)
	if full == nil {
		full = kernels.PTX
	}
	hasShaped := bytes.Contains(full, []byte(".entry "+kernels.GatherShapedKernel+"("))
	for _, cs := range []struct {
		name          string
		ptx           []byte
		blocks, shape bool
	}{
		{"full module", full, true, hasShaped},
		{"no shaped kernels", cudatest.WithoutKernels(full, "_shaped"), true, false},
		{"no block kernels", cudatest.WithoutKernels(full, "_blocks"), false, false},
		{"neither", cudatest.WithoutKernels(full, "_blocks", "_shaped"), false, false},
	} {
		reg := &mem.Registry{}
		x, err := stage.New(stage.Settings{Context: c, Registry: reg, PTX: cs.ptx, Contexts: 1})
		if err != nil {
			t.Fatalf("%s: %v", cs.name, err)
		}
		_, b := x.(transfer.BlockGatherer)
		_, s := x.(transfer.ShapedGatherer)
		if b != cs.blocks || s != cs.shape {
			t.Errorf("%s: claims the block form %v and the shaped form %v, want %v and %v", cs.name, b, s, cs.blocks, cs.shape)
		}
		// The runs a pipeline falls back to still move.
		src := cudatest.Device(t, c, 1<<16)
		dst := cudatest.Device(t, c, 1<<16)
		for _, d := range []transfer.Desc{src, dst} {
			if err := reg.Add(d); err != nil {
				t.Fatal(err)
			}
		}
		region, pool := dst, src // gather: the region is written
		want := cudatest.Fill(t, c, src, 5)
		cudatest.Fill(t, c, dst, 6)
		runs := []transfer.Run{{RegionOff: 0, Addr: pool.Addr, Len: 1 << 16, Count: 1, RegionStride: 1 << 16, AddrStride: 1 << 16}}
		op, err := x.Gather(region, runs)
		if err != nil {
			t.Fatalf("%s: runs: %v", cs.name, err)
		}
		cudatest.Finish(t, op)
		if d := cudatest.Diff(cudatest.Read(t, c, dst), want); d != "" {
			t.Errorf("%s: runs: %s", cs.name, d)
		}
		if err := x.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
