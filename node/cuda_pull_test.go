package node

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/transfer"
)

// TestGPUPullByteExact: the receiver pulls device KV (pipeline.Agent.Pull)
// — block tables and descriptor lists — from the holder's device pools, on
// one GPU with cudacopy (device arenas) and over tcp with pinned-host
// arenas (device KV over a host engine); every named block lands and no
// other destination byte changes. A pull of a pool the holder registered
// for another peer is refused and changes nothing. Skipped without
// libcuda.so.1 (docs/bench/device/issue29/run.sh runs it on the GPU
// machine).
func TestGPUPullByteExact(t *testing.T) {
	c := cudatest.Context(t)
	f := gpuFactories(t)
	for _, engine := range []struct{ kind, control string }{{"cudacopy", "inproc"}, {"tcp", "zmq"}} {
		t.Run(engine.kind, func(t *testing.T) {
			cfg := func(name string) (cc config.Config) {
				cc = gpuConfig(name)
				cc.Engine.Kind, cc.ControlPlane.Kind = engine.kind, engine.control
				return cc
			}
			a, b := build(t, cfg("a"), f), build(t, cfg("b"), f) // b holds, a pulls
			const regions, blocks, blockLen, ids = 4, 2048, 4096, 1500
			src := newGPUPool(t, c, regions, blocks, blockLen, blockLen, 5)
			dst := newGPUPool(t, c, regions, blocks, blockLen, blockLen+64, 3)
			secret := newGPUPool(t, c, regions, 16, blockLen, blockLen, 0) // kv-in's geometry: refused by the holder, not by the puller's checks
			if err := b.Agent.RegisterMemory(src.buf); err != nil {
				t.Fatal(err)
			}
			if err := b.Agent.RegisterMemoryFor(secret.buf, "someone-else"); err != nil {
				t.Fatal(err)
			}
			if err := a.Agent.RegisterMemory(dst.buf); err != nil {
				t.Fatal(err)
			}
			for _, p := range []struct {
				n    *Node
				name string
				pool transfer.Pool
			}{{b, "kv", src.pool}, {b, "secret", secret.pool}, {a, "kv-in", dst.pool}} {
				if err := p.n.Agent.RegisterPool(p.name, p.pool); err != nil {
					t.Fatal(err)
				}
			}
			connect(t, a, b)
			rng := rand.New(rand.NewPCG(29, 1))
			srcIDs, dstIDs := idsOf(rng.Perm(blocks)[:ids]), idsOf(rng.Perm(blocks)[:ids])
			srcB := cudatest.Fill(t, c, src.buf, 1)
			dstB := cudatest.Fill(t, c, dst.buf, 2)
			pull := func(req pipeline.PullRequest) error {
				req.Peer = "b"
				bt, err := a.Agent.Pull(req)
				if err != nil {
					return err
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				err = bt.Wait(ctx)
				if retired, quiet := bt.Retirement(); !retired || !quiet {
					t.Fatalf("retired %v quiescent %v", retired, quiet)
				}
				return err
			}
			if err := pull(pipeline.PullRequest{Blocks: &pipeline.BlockRequest{SrcPool: "kv", SrcIDs: srcIDs, DstPool: "kv-in", DstIDs: dstIDs}}); err != nil {
				t.Fatal(err)
			}
			for r := range regions {
				for k := range srcIDs {
					so := src.pool.Regions[r] - src.buf.Addr + uint64(srcIDs[k])*src.pool.Stride
					do := dst.pool.Regions[r] - dst.buf.Addr + uint64(dstIDs[k])*dst.pool.Stride
					copy(dstB[do:do+blockLen], srcB[so:so+blockLen])
				}
			}
			if d := cudatest.Diff(cudatest.Read(t, c, dst.buf), dstB); d != "" {
				t.Fatalf("blocks: %s", d)
			}
			// Descriptors: block k of region 0 to the destination's last
			// region, in reverse order.
			var s, d []transfer.Desc
			for k := range 300 {
				s = append(s, src.pool.Piece(0, uint32(k)))
				d = append(d, dst.pool.Piece(regions-1, uint32(blocks-1-k)))
				so := src.pool.Regions[0] - src.buf.Addr + uint64(k)*src.pool.Stride
				do := dst.pool.Regions[regions-1] - dst.buf.Addr + uint64(blocks-1-k)*dst.pool.Stride
				copy(dstB[do:do+blockLen], srcB[so:so+blockLen])
			}
			if err := pull(pipeline.PullRequest{Src: s, Dst: d}); err != nil {
				t.Fatal(err)
			}
			if d := cudatest.Diff(cudatest.Read(t, c, dst.buf), dstB); d != "" {
				t.Fatalf("descriptors: %s", d)
			}
			if n := b.Agent.Stats().PullReadOffers; n != 0 {
				t.Fatalf("the holder offered %d chunks to read: a pull into device memory is written", n)
			}
			err := pull(pipeline.PullRequest{Blocks: &pipeline.BlockRequest{SrcPool: "secret", SrcIDs: []uint32{0, 1}, DstPool: "kv-in", DstIDs: []uint32{0, 1}}})
			if err == nil || !errors.Is(err, transfer.ErrForbidden) {
				t.Fatalf("pull of a pool registered for another peer: %v, want refused (forbidden)", err)
			}
			if d := cudatest.Diff(cudatest.Read(t, c, dst.buf), dstB); d != "" {
				t.Fatalf("a refused pull changed the destination: %s", d)
			}
			t.Logf("%s: pulled %d blocks x %d regions and 300 descriptors byte-exact; arena memory %s", engine.kind, ids, regions, a.ArenaMemory)
		})
	}
}
