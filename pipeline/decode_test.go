package pipeline

import (
	"slices"
	"testing"

	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// TestDataDecodesIntoRecycledRuns checks that a DATA decodes into a run
// array a finished scatter gave back (same backing array, runs equal to
// what was sent), that the array leaves the free list while in use, that a
// malformed DATA returns its array, and that the list stays bounded.
func TestDataDecodesIntoRecycledRuns(t *testing.T) {
	r := &reactor{}
	runs := make([]transfer.Run, 50)
	for i := range runs {
		runs[i] = transfer.Run{RegionOff: uint64(i) * 4096, Addr: 0x10000 + uint64(i*7%50)*8192, Len: 4096, Count: 1}
	}
	enc, err := wire.Marshal(&wire.Data{Request: 9, Chunk: 2, Region: 1 << 20, Runs: runs})
	if err != nil {
		t.Fatal(err)
	}
	spare := make([]transfer.Run, 0, 64)
	r.recycleRuns(spare)
	msg, err := r.decode(enc)
	if err != nil {
		t.Fatal(err)
	}
	d, ok := msg.(*wire.Data)
	if !ok || d.Request != 9 || d.Chunk != 2 || !slices.Equal(d.Runs, runs) {
		t.Fatalf("decoded %+v", msg)
	}
	if &d.Runs[0] != &spare[:1][0] {
		t.Fatal("DATA did not decode into the recycled array")
	}
	if len(r.freeRuns) != 0 {
		t.Fatalf("%d arrays on the free list while one is in use", len(r.freeRuns))
	}
	// With none free, a DATA decodes into a fresh array.
	msg, err = r.decode(enc)
	if err != nil || &msg.(*wire.Data).Runs[0] == &spare[:1][0] {
		t.Fatalf("second decode: %v, shares the array in use", err)
	}
	// A malformed DATA gives its array back.
	r.recycleRuns(d.Runs)
	if _, err := r.decode(enc[:len(enc)-3]); err == nil {
		t.Fatal("truncated DATA decoded")
	}
	if len(r.freeRuns) != 1 {
		t.Fatalf("free list holds %d arrays after a malformed DATA, want 1", len(r.freeRuns))
	}
	for range 2 * maxFreeRuns {
		r.recycleRuns(make([]transfer.Run, 0, 1))
	}
	if len(r.freeRuns) != maxFreeRuns {
		t.Fatalf("free list holds %d arrays, bound %d", len(r.freeRuns), maxFreeRuns)
	}
}
