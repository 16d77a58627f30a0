//go:build race

package pipeline

// raceBuild is true under the race detector, which slows the simulation
// about tenfold; TestSim runs fewer seeds by default then.
const raceBuild = true
