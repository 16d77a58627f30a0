package kernels

import "github.com/bouncekv/bounce/cuda"

// LaunchFullGrid is LaunchAs with one warp per piece instead of one wave
// of blocks, for the benchmarks.
func (m *Module) LaunchFullGrid(gather, wide bool, s *cuda.Stream, args *cuda.Args, region, table cuda.DevicePtr, n uint64) error {
	return m.launch(gather, wide, true, s, args, region, table, n)
}
