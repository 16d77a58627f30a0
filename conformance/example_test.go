package conformance_test

import (
	"fmt"

	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/controlplane/inproc"
)

// CheckControlChannel certifies a control channel outside go test; the
// report can then be written as text, JSON or JUnit XML.
func ExampleCheckControlChannel() {
	rep := conformance.CheckControlChannel(func() (conformance.ControlSet, error) {
		n := inproc.NewNetwork()
		a, err := n.NewChannel("a", inproc.Options{})
		if err != nil {
			return conformance.ControlSet{}, err
		}
		b, err := n.NewChannel("b", inproc.Options{})
		if err != nil {
			return conformance.ControlSet{}, err
		}
		c, err := n.NewChannel("c", inproc.Options{})
		if err != nil {
			return conformance.ControlSet{}, err
		}
		return conformance.ControlSet{A: a, B: b, C: c}, nil
	}, conformance.Config{})
	fmt.Println(rep.Kind, rep.Subject, rep.Passed(), len(rep.Failures()))
	// Output: control inproc true 0
}
