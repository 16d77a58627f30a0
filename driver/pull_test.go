package driver

import (
	"context"
	"testing"
	"time"

	"github.com/bouncekv/bounce/workload"
)

// A pull run moves each request from the peer's slice (filled by
// FillBuffer) into the driver's own, byte-exact, in both forms.
func TestRunPull(t *testing.T) {
	const requests = 3
	for _, blocks := range []bool{false, true} {
		spec := workload.Spec{DescSize: 4096, Count: 8 * 96, Regions: 8, Fragmented: true, Seed: 9}
		a, b, held, d := driverPair(t, requests*spec.Bytes())
		hb := hostBuffer{held}
		if err := FillBuffer(hb, spec, requests); err != nil {
			t.Fatal(err)
		}
		if blocks {
			pools, err := RegisterPools(b.Agent, held.Desc(), spec, requests, DstPool)
			if err != nil {
				t.Fatal(err)
			}
			defer pools.Release()
			blob, err := b.Agent.Descriptor()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.Agent.LoadPeer(blob); err != nil {
				t.Fatal(err)
			}
		}
		if err := VerifyBuffer(d.Buffer(), spec, 1); err == nil {
			t.Fatal("an empty destination verified")
		}
		res, err := d.Run(context.Background(), Target{Peer: "b", Buffer: held.Desc()}, Options{Spec: spec, Requests: requests, Pull: true, Blocks: blocks})
		if err != nil {
			t.Fatal(err)
		}
		if res.Failed != 0 || res.Bytes != requests*spec.Bytes() || res.Route != "pull" {
			t.Fatalf("blocks %v: %+v (first error %v)", blocks, res, res.FirstErr)
		}
		if err := VerifyBuffer(d.Buffer(), spec, requests); err != nil {
			t.Fatalf("blocks %v: %v", blocks, err)
		}
		// The holder counts a pull served once it handled its last ACK,
		// which may come after the puller's batch resolved.
		for deadline := time.Now().Add(30 * time.Second); b.Agent.Stats().PullsServed != requests; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("blocks %v: the holder served %d pulls, want %d", blocks, b.Agent.Stats().PullsServed, requests)
			}
		}
	}
}
