// Package conformance certifies implementations of the five public bounce
// interfaces (transfer.Engine, transfer.ControlChannel, transfer.Gatherer,
// transfer.Scatterer and transfer.Writer) against the contracts written in
// package transfer.
//
// Each suite is a function over a fixture factory, in the style of
// golang.org/x/net/nettest.TestConn: the factory returns fresh instances
// wired to reach each other, and every rule runs against its own instances.
// Engine, ControlChannel, Gatherer, Scatterer and Writer run the rules as
// subtests of a *testing.T; CheckEngine, CheckControlChannel, CheckGatherer,
// CheckScatterer and CheckWriter run the very same rules outside go test and
// return a Report that can be written as text, JSON or JUnit XML.
//
// A plugin's test certifies it in a few lines:
//
//	func TestConformance(t *testing.T) {
//		conformance.Engine(t, func() (conformance.EnginePair, error) {
//			a, err := myengine.New("a")
//			...
//			return conformance.EnginePair{A: a, B: b, KillB: func() { b.Close() },
//				Cleanup: func() { a.Close(); b.Close() }}, nil
//		}, conformance.Config{})
//	}
//
// Every rule has an ID such as "engine/byte-exact" (Rules lists them all with
// a one-line summary) and every failure message starts with it in brackets:
//
//	[engine/byte-exact] write of 4097 bytes (src+1 → dst+3): destination byte 17 = 0x3a, want 0x91 (1 byte differs)
//
// The block-table form (transfer.BlockGatherer, transfer.BlockScatterer,
// transfer.BlockPoster) is probed on each fixture and certified by the data
// rules run on block copies and block writes ("gather/blocks-byte-exact",
// "engine/blocks-failure-reported", …) over pools the rule lays out —
// unaligned region bases, gaps between blocks checked as guards, regions
// apart or interleaved, random or contiguous ids, chunks from a random
// First — plus "<kind>/blocks-repeated-ids" and "engine/blocks-geometry";
// see blocks.go for what each checks.
//
// Optional capabilities (transfer.Notifier, transfer.Fencer,
// transfer.WriteGuarded, transfer.Connector, multi-op posts, a way to kill
// a peer or to stall the writer's data path on purpose — the fixture's
// EnginePair.StallWrites, or else the engine's transfer.WriteStaller, a
// test-only capability no engine needs —, ErrBusy backpressure, catching
// an op while it is pending) are probed and their rules skipped with the
// reason, never failed, when absent; a rule an
// implementation documents it cannot keep is listed in Config.Skip with its
// Config.SkipReasons entry. An engine that is never seen pending is
// reported by engine/post-async, not skipped. Whatever Config.Sizes says,
// the data rules always include a write above 1 MiB and one above the
// engine's fragment size (EnginePair.FragmentSize), and each invalid write
// has buffers of its own, so a failure names the case that wrote. Every rule is bounded:
// an operation that never becomes terminal fails after Config.OpTimeout, and
// a rule stuck inside a call to the implementation is abandoned after
// 3×OpTimeout, so a broken implementation cannot hang the suite.
//
// The suite allocates its buffers outside the Go heap (package mem, or the
// fixture's Alloc) and frees them only when the rule passed and every
// operation proved quiescent; memory an implementation may still touch is
// left mapped. After every rule it also looks for goroutines the rule left
// behind (go.uber.org/goleak), so do not run a suite in parallel with other
// tests in the same process.
package conformance
