package node_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/transfer"
)

// Example_blockTable sends KV the way inference servers hold it: each side
// registers its KV pool once (here 2 layers × K and V: 4 regions of 256
// blocks of 4 KiB), peers learn the pools from the descriptors, and a
// request names blocks by id on each side — its cost is its ids, not one
// descriptor per block per region.
func Example_blockTable() {
	if err := blockTable(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// decode-0 received "seq-7" from prefill-0: 65536 bytes by bounce
	// 16 pieces in place
}

func blockTable() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const regions, blocks, blockLen = 4, 256, 4 << 10
	// One allocation per side holds every region of its pool.
	src, err := mem.Alloc(regions * blocks * blockLen)
	if err != nil {
		return err
	}
	defer src.Free()
	dst, err := mem.Alloc(regions * blocks * blockLen)
	if err != nil {
		return err
	}
	defer dst.Free()

	factories := node.Builtin()
	cfg := config.Default()
	cfg.Engine.Kind, cfg.ControlPlane.Kind = "loopback", "inproc"
	cfg.Bounce.Route = "bounce" // in one process route auto would take the memcpy
	received := make(chan pipeline.Received, 8)
	cfg.Agent.Name = "decode-0"
	decode, err := node.BuildWith(cfg, factories, node.Options{Received: received})
	if err != nil {
		return err
	}
	defer decode.Close(ctx)
	cfg.Agent.Name = "prefill-0"
	prefill, err := node.Build(cfg, factories, nil)
	if err != nil {
		return err
	}
	defer prefill.Close(ctx)

	// Register the memory, then the pool in it, on each side.
	pool := func(m *mem.Buffer) transfer.Pool {
		p := transfer.Pool{BlockLen: blockLen, Stride: blockLen, Blocks: blocks, Kind: transfer.Host}
		for r := range regions {
			p.Regions = append(p.Regions, m.Desc().Addr+uint64(r*blocks*blockLen))
		}
		return p
	}
	for _, side := range []struct {
		a *pipeline.Agent
		m *mem.Buffer
	}{{prefill.Agent, src}, {decode.Agent, dst}} {
		if err := side.a.RegisterMemory(side.m.Desc()); err != nil {
			return err
		}
		if err := side.a.RegisterPool("kv", pool(side.m)); err != nil {
			return err
		}
	}

	// Descriptors carry the pools: exchange them after registering.
	blob, err := decode.Agent.Descriptor()
	if err != nil {
		return err
	}
	peer, err := prefill.Agent.LoadPeer(blob)
	if err != nil {
		return err
	}
	if blob, err = prefill.Agent.Descriptor(); err != nil {
		return err
	}
	if _, err := decode.Agent.LoadPeer(blob); err != nil {
		return err
	}

	// A sequence's 4 blocks on the prefill side go to the 4 free blocks the
	// decode side allocated for it, in every region.
	srcIDs, dstIDs := []uint32{3, 4, 5, 9}, []uint32{200, 17, 18, 64}
	for r := range regions {
		for i, id := range srcIDs {
			src.Bytes()[(r*blocks+int(id))*blockLen] = byte(10*r + i + 1)
		}
	}
	b, err := prefill.Agent.Submit(pipeline.Request{Peer: peer, Tag: []byte("seq-7"),
		Blocks: &pipeline.BlockRequest{SrcPool: "kv", SrcIDs: srcIDs, DstPool: "kv", DstIDs: dstIDs}})
	if err != nil {
		return err // an unknown pool, an id out of range, a destination id twice, ...
	}
	if err := b.Wait(ctx); err != nil {
		return err
	}
	if err := b.Release(); err != nil {
		return err
	}
	select {
	case ev := <-received:
		if ev.Err != nil {
			return ev.Err
		}
		fmt.Printf("%s received %q from %s: %d bytes by %s\n", decode.Agent.Name(), ev.Tag, ev.Peer, ev.Bytes, ev.Route)
	case <-ctx.Done():
		return ctx.Err()
	}
	n := 0
	for r := range regions {
		for i, id := range dstIDs {
			if dst.Bytes()[(r*blocks+int(id))*blockLen] == byte(10*r+i+1) {
				n++
			}
		}
	}
	fmt.Printf("%d pieces in place\n", n)
	return nil
}
