package pipeline

import "testing"

// TestStagesOfASuccessfulRequest: a bounce request reports time in every
// stage it went through, a direct one its write.
func TestStagesOfASuccessfulRequest(t *testing.T) {
	w := newWorld(t)
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	j := simple(t, a, b, 9)
	connect(t, a, b)
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst, Route: RouteBounce})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	s := bt.Stages()
	if s.Plan <= 0 || s.GrantWait <= 0 || s.Gather <= 0 || s.Write <= 0 || s.Data <= 0 || s.AckWait <= 0 {
		t.Fatalf("bounce stages %+v: every stage took time", s)
	}
	bt, err = a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst, Route: RouteDirect})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	if s := bt.Stages(); s.Write <= 0 || s.Gather != 0 || s.AckWait != 0 {
		t.Fatalf("direct stages %+v", s)
	}
	if got := (Stages{Write: 4, Gather: 2}).Add(Stages{Write: 2}).Div(2); got != (Stages{Write: 3, Gather: 1}) {
		t.Fatalf("Add/Div: %+v", got)
	}
}
