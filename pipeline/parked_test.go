package pipeline

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestParkQueueMatchesFIFO: any sequence of push and remove leaves the
// queue holding exactly the pushed-and-not-removed requests in the order
// they were first pushed (a repeated push keeps the original place).
func TestParkQueueMatchesFIFO(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		reqs := make([]*sendReq, 8)
		for i := range reqs {
			reqs[i] = &sendReq{id: uint64(i)}
		}
		var p parkQueue
		var model []uint64
		for _, op := range rapid.SliceOf(rapid.IntRange(0, 2*len(reqs)-1)).Draw(t, "ops") {
			q := reqs[op%len(reqs)]
			if op < len(reqs) {
				p.push(q)
				if !slices.Contains(model, q.id) {
					model = append(model, q.id)
				}
			} else {
				p.remove(q)
				if i := slices.Index(model, q.id); i >= 0 {
					model = slices.Delete(model, i, i+1)
				}
			}
			var got []uint64
			for _, r := range p.appendTo(nil) {
				got = append(got, r.id)
			}
			if !slices.Equal(got, model) || p.len() != len(model) {
				t.Fatalf("queue %v (len %d), want %v", got, p.len(), model)
			}
			for _, r := range reqs {
				if p.has(r) != slices.Contains(model, r.id) {
					t.Fatalf("has(%d) = %v, model %v", r.id, p.has(r), model)
				}
			}
		}
	})
}
