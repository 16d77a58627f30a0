package driver

import (
	"context"
	"strings"
	"testing"

	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/workload"
)

// The block-table form moves the same pieces as the descriptor form of
// the spec: every request lands byte-exact in its slice, on the bounce and
// the direct route, with random and with contiguous ids.
func TestRunBlocksLands(t *testing.T) {
	const requests = 3
	for _, frag := range []bool{true, false} {
		spec := workload.Spec{DescSize: 4096, Count: 8 * 96, Regions: 8, Fragmented: frag, Seed: 5}
		a, b, dst, d := driverPair(t, requests*spec.Bytes())
		pools, err := RegisterPools(b.Agent, dst.Desc(), spec, requests, DstPool)
		if err != nil {
			t.Fatal(err)
		}
		blob, err := b.Agent.Descriptor()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Agent.LoadPeer(blob); err != nil {
			t.Fatal(err)
		}
		for _, route := range []pipeline.Route{pipeline.RouteBounce, pipeline.RouteDirect} {
			clear(dst.Bytes())
			o := Options{Spec: spec, Requests: requests, Route: route, Blocks: true}
			res, err := d.Run(context.Background(), Target{Peer: "b", Buffer: dst.Desc()}, o)
			if err != nil {
				t.Fatal(err)
			}
			if res.Failed != 0 || res.Bytes != requests*spec.Bytes() || res.Route != route.String() {
				t.Fatalf("fragmented %v, %v: %+v (first error %v)", frag, route, res, res.FirstErr)
			}
			per := spec.Bytes()
			for i := range requests {
				if err := o.RequestSpec(i).Verify(dst.Bytes()[uint64(i)*per : uint64(i+1)*per]); err != nil {
					t.Fatalf("fragmented %v, %v: request %d: %v", frag, route, i, err)
				}
			}
		}
		if err := pools.Release(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRunBlocksRefusals(t *testing.T) {
	spec := workload.Spec{DescSize: 512, Count: 64}
	_, _, dst, d := driverPair(t, 4*spec.Bytes())
	_, err := d.Run(context.Background(), Target{Peer: "b", Buffer: dst.Desc()}, Options{Spec: spec, Requests: 1, Blocks: true})
	if err == nil || !strings.Contains(err.Error(), "needs a spec with regions") {
		t.Fatalf("blocks without regions: %v", err)
	}
	spec.Regions = 4
	if _, err := RegisterPools(d.agent, d.src.Desc(), spec, MaxBlockRequests+1, SrcPool); err == nil {
		t.Fatal("more requests than pools accepted")
	}
}
