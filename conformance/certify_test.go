package conformance_test

import (
	"testing"

	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/controlplane/inproc"
	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/mem"
	gatherhost "github.com/bouncekv/bounce/stages/gather/host"
	scatterhost "github.com/bouncekv/bounce/stages/scatter/host"
	"github.com/bouncekv/bounce/stages/write"
	"github.com/bouncekv/bounce/transfer"
)

// loopbackPair is the EngineFactory of the in-tree loopback engine.
func loopbackPair() (conformance.EnginePair, error) {
	fab := loopback.NewFabric()
	a, err := fab.NewEngine("a")
	if err != nil {
		return conformance.EnginePair{}, err
	}
	b, err := fab.NewEngine("b")
	if err != nil {
		a.Close()
		return conformance.EnginePair{}, err
	}
	return conformance.EnginePair{
		A:       a,
		B:       b,
		KillB:   func() { b.Close() },
		Cleanup: func() { a.Close(); b.Close() },
	}, nil
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
	reg := &mem.Registry{}
	g, err := gatherhost.New(gatherhost.Settings{Registry: reg})
	if err != nil {
		return conformance.GathererFixture{}, err
	}
	return conformance.GathererFixture{Gatherer: g, Register: reg.Add}, nil
}

func hostScatterer() (conformance.ScattererFixture, error) {
	reg := &mem.Registry{}
	s, err := scatterhost.New(scatterhost.Settings{Registry: reg})
	if err != nil {
		return conformance.ScattererFixture{}, err
	}
	return conformance.ScattererFixture{Scatterer: s, Register: reg.Add}, nil
}

// loopbackWriter is stages/write over a pair of loopback engines.
func loopbackWriter() (conformance.WriterFixture, error) {
	p, err := loopbackPair()
	if err != nil {
		return conformance.WriterFixture{}, err
	}
	grant := func(d transfer.Desc) error {
		if err := p.B.RegisterMemory(d); err != nil {
			return err
		}
		md, err := p.B.Metadata()
		if err != nil {
			return err
		}
		_, err = p.A.LoadPeer(md)
		return err
	}
	md, err := p.B.Metadata()
	if err != nil {
		return conformance.WriterFixture{}, err
	}
	peer, err := p.A.LoadPeer(md)
	if err != nil {
		return conformance.WriterFixture{}, err
	}
	return conformance.WriterFixture{
		Writer:         write.New(p.A),
		Peer:           peer,
		RegisterSource: p.A.RegisterMemory,
		Grant:          grant,
		Cleanup:        p.Cleanup,
	}, nil
}

// certify is the configuration of the certification runs: every default,
// with a fixed seed.
func certify() conformance.Config { return conformance.Config{Seed: 1} }

func TestLoopbackEngine(t *testing.T) { conformance.Engine(t, loopbackPair, certify()) }

func TestInprocControlChannel(t *testing.T) { conformance.ControlChannel(t, inprocSet, certify()) }

func TestHostGatherer(t *testing.T) { conformance.Gatherer(t, hostGatherer, certify()) }

func TestHostScatterer(t *testing.T) { conformance.Scatterer(t, hostScatterer, certify()) }

func TestWriteStage(t *testing.T) { conformance.Writer(t, loopbackWriter, certify()) }
