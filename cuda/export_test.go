package cuda

// NewArgsAt lays out a parameter block in memory at base (tests use Go
// memory to check the packing without a GPU).
func NewArgsAt(base uintptr, n int) *Args {
	return newArgsAt(nil, HostMem{Host: base, Len: uint64(16 * n)}, n)
}
