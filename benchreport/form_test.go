package benchreport

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// The block form's cells are their own groups, named with the form, and
// get a per-route ratio over the descriptor form's cells of the same
// iteration; bulk gets none.
func TestFormRatios(t *testing.T) {
	d := Group{Workload: "llama70b-tp8-b16", DescSize: 4096, Count: 81920, Layout: "fragmented", Form: FormDescs, Concurrency: 1}
	b := d
	b.Form = FormBlocks
	var cells []Cell
	for it, x := range []float64{2, 3} {
		cells = append(cells,
			cell(d, RouteBounce, it, 1), cell(d, RouteBulk, it, 4),
			cell(b, RouteBounce, it, x), cell(b, RouteBulk, it, 4))
	}
	var got []Ratio
	for _, r := range ComputeRatios(cells) {
		if r.Group == b && strings.Contains(r.Name(), "[") {
			got = append(got, r)
		}
	}
	if len(got) != 1 || got[0].Name() != "bounce[blocks]/bounce[descs]" || math.Abs(got[0].Median-2.5) > 1e-9 {
		t.Fatalf("form ratios %+v; want one bounce[blocks]/bounce[descs] of median 2.5", got)
	}
	if !strings.Contains(b.String(), "fragmented blocks c1") || !strings.Contains(d.String(), "fragmented descs c1") {
		t.Fatalf("group names %q, %q", b, d)
	}
	rep := &Report{Cells: cells, Ratios: ComputeRatios(cells)}
	var tab bytes.Buffer
	if err := WriteTable(&tab, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tab.String(), "bounce[blocks]/bounce[descs]") || !strings.Contains(tab.String(), "2.50x [2.00 3.00]") {
		t.Fatalf("table lacks the form ratio:\n%s", tab.String())
	}
	js, err := json.Marshal(cells[2])
	if err != nil || !strings.Contains(string(js), `"form":"blocks"`) {
		t.Fatalf("cell JSON %s (%v) lacks the form", js, err)
	}
	old := d
	old.Form = ""
	if js, _ := json.Marshal(old); strings.Contains(string(js), "form") {
		t.Fatalf("a group without a form writes one: %s", js)
	}
}
