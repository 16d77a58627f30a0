package credit

import (
	"fmt"
	"strings"
	"testing"
)

// TestPeerCapKeepsRoundRobin: one peer with many flows, capped at half
// the arena (PeerMax, the pipeline's security.max_arena_share default).
// Every grant that reaches the cap takes the peer's flows off the ring and
// every freed region puts them back; the grants must still go round robin
// in arrival order (every flow's chunk 0 in want order, then every chunk 1),
// never skipping a flow for one that wanted later.
func TestPeerCapKeepsRoundRobin(t *testing.T) {
	const unit, flows = 4096, 24
	s := mustNew(t, Config{Capacity: 8 * unit, Granularity: unit, MaxInflight: 8, PeerShare: true, PeerMax: 4 * unit})
	for i := range flows {
		if err := s.Want(key("p", uint64(i)), repeat(2, unit)); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	var held []Grant // oldest first: regions are freed in grant order
	passed := map[uint64]int{}
	for len(got) < 2*flows {
		gs := s.Schedule()
		for _, g := range gs {
			got = append(got, fmt.Sprintf("%d#%d", g.Flow.Request, g.Chunk))
			if err := s.BeginScatter(g.Flow, g.Offset); err != nil {
				t.Fatal(err)
			}
		}
		held = append(held, gs...)
		if len(held) == 0 {
			t.Fatalf("no grant and nothing held after %d grants", len(got))
		}
		if _, _, err := s.EndScatter(held[0].Offset); err != nil {
			t.Fatal(err)
		}
		held = held[1:]
		mustCheck(t, s)
	}
	var want []string
	for c := range 2 {
		for i := range flows {
			want = append(want, fmt.Sprintf("%d#%d", i, c))
		}
	}
	// How often a flow was passed over: grants to flows that wanted
	// later, made while its own next chunk waited.
	for i, g := range got {
		var req, chunk uint64
		fmt.Sscanf(g, "%d#%d", &req, &chunk)
		for _, h := range got[i+1:] {
			var r2, c2 uint64
			fmt.Sscanf(h, "%d#%d", &r2, &c2)
			if c2 == chunk && r2 < req {
				passed[r2]++
			}
		}
	}
	if g, w := strings.Join(got, " "), strings.Join(want, " "); g != w {
		t.Fatalf("grants out of round-robin order (passed over: %v)\n got %s\nwant %s", passed, g, w)
	}
}
