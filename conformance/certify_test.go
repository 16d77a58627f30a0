package conformance_test

import (
	"testing"
	"time"

	"github.com/bouncekv/bounce/certify"
	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/controlplane/inproc"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/transfer"
)

// The fixtures come from package certify (what CI certifies every built-in
// with); this file drives them through the testing.T entry points.

func builtin() node.Factories { return node.Builtin() }

// loopbackPair is the EngineFactory of the in-tree loopback engine.
func loopbackPair() (conformance.EnginePair, error) {
	return certify.EngineFactory(builtin().Engines["loopback"], certify.Options{})()
}

// inprocSet is the ControlFactory of the in-tree inproc control channel.
func inprocSet() (conformance.ControlSet, error) {
	n := inproc.NewNetwork()
	var chans [3]transfer.ControlChannel
	for i, name := range []string{"a", "b", "c"} {
		ch, err := n.NewChannel(name, inproc.Options{})
		if err != nil {
			return conformance.ControlSet{}, err
		}
		chans[i] = ch
	}
	return conformance.ControlSet{
		A: chans[0], B: chans[1], C: chans[2],
		BadEndpoints: []string{"inproc://", "inproc://no-such-channel", "tcp://127.0.0.1:5555"},
	}, nil
}

func hostGatherer() (conformance.GathererFixture, error) {
	return certify.GathererFactory(builtin().Gatherers["host"], certify.Options{})()
}

func hostScatterer() (conformance.ScattererFixture, error) {
	return certify.ScattererFactory(builtin().Scatterers["host"], certify.Options{})()
}

// loopbackWriter is stages/write over a pair of loopback engines.
func loopbackWriter() (conformance.WriterFixture, error) {
	return certify.WriterFactory(builtin().Engines["loopback"], certify.Options{})()
}

// certConfig is the configuration of the certification runs: a fixed
// seed, and bounds generous enough for a loaded machine under -race (a
// passing rule waits out neither; a call that blocks or an op that never
// completes still fails them).
func certConfig() conformance.Config {
	return conformance.Config{Seed: 1, CallTimeout: 10 * time.Second, OpTimeout: 30 * time.Second}
}

func TestLoopbackEngine(t *testing.T) { conformance.Engine(t, loopbackPair, certConfig()) }

func TestInprocControlChannel(t *testing.T) { conformance.ControlChannel(t, inprocSet, certConfig()) }

func TestHostGatherer(t *testing.T) { conformance.Gatherer(t, hostGatherer, certConfig()) }

func TestHostScatterer(t *testing.T) { conformance.Scatterer(t, hostScatterer, certConfig()) }

func TestWriteStage(t *testing.T) { conformance.Writer(t, loopbackWriter, certConfig()) }
