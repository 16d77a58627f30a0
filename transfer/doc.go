// Package transfer is the public contract of bounce: memory descriptors, the
// five pluggable interfaces (Engine, ControlChannel, Gatherer, Scatterer,
// Writer) and the sentinel errors they report.
//
// Plugin authors and embedders import this package alone. It has no cgo and no
// dependency beyond the standard library, so a third-party engine can be built
// without pulling in the pipeline.
//
// Addresses are plain integers. Host memory referenced by a descriptor must be
// registered (see package mem) before a stage or engine touches it; every
// implementation checks each access against the memory it was given and
// rejects anything outside it with ErrOutOfBounds.
package transfer
