package kernels

import "github.com/bouncekv/bounce/cuda"

// LaunchOneWave is LaunchAs with one wave of blocks taking pieces
// grid-stride, for the benchmarks (the wide kernels' other grid).
func (m *Module) LaunchOneWave(gather, wide bool, s *cuda.Stream, args *cuda.Args, region, table cuda.DevicePtr, n uint64) error {
	return m.launch(gather, wide, false, s, args, region, table, n)
}
