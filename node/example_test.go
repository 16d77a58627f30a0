package node_test

import (
	"bytes"
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

// Example embeds two agents in one process — a prefill server that sends
// KV blocks and a decode server that receives them — over the in-process
// engine and control plane (set engine.kind tcp and control_plane.kind zmq,
// the defaults, between processes and hosts). The decode side learns that
// a request landed from its Received channel, by the tag the sender gave.
func Example() {
	if err := embed(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// decode-0 received "req-42" from prefill-0: 4194304 bytes by bounce
	// every block in place
}

func embed() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// KV memory on both sides. The deferred frees run after the nodes
	// closed (defers run in reverse), never while an agent may touch it.
	const blocks, blockSize = 1024, 4 << 10
	src, err := mem.Alloc(blocks * blockSize)
	if err != nil {
		return err
	}
	defer src.Free()
	dst, err := mem.Alloc(blocks * blockSize)
	if err != nil {
		return err
	}
	defer dst.Free()

	// One factory table for both nodes: in-process engines and control
	// channels only reach each other through the table that made them.
	factories := node.Builtin()
	cfg := config.Default()
	cfg.Engine.Kind, cfg.ControlPlane.Kind = "loopback", "inproc"
	// In one process the loopback engine's direct path is a memcpy, so route
	// auto's cost model would take it; this example shows the bounce path.
	cfg.Bounce.Route = "bounce"

	// The decode server: a node whose completion events arrive on a
	// buffered channel (a full channel drops and counts, never blocks).
	received := make(chan pipeline.Received, 64)
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

	// Register the memory with each agent: sources on the sender,
	// destinations (which peers write) on the receiver.
	if err := prefill.Agent.RegisterMemory(src.Desc()); err != nil {
		return err
	}
	if err := decode.Agent.RegisterMemory(dst.Desc()); err != nil {
		return err
	}

	// Peers exchange descriptors out of band (a file, etcd, an RPC). Each
	// descriptor carries the agent's public key: the prefill side loads
	// decode's to reach it, and decode loads prefill's to admit it (with
	// security.allowed_peers "loaded", the default, only loaded peers may
	// write).
	blob, err := decode.Agent.Descriptor()
	if err != nil {
		return err
	}
	peer, err := prefill.Agent.LoadPeer(blob)
	if err != nil {
		return err
	}
	sender, err := prefill.Agent.Descriptor()
	if err != nil {
		return err
	}
	if _, err := decode.Agent.LoadPeer(sender); err != nil {
		return err
	}

	// One request: block i of the source goes to block blocks-1-i of the
	// destination (scattered, as KV blocks are).
	var s, d []transfer.Desc
	for i := range blocks {
		copy(src.Bytes()[i*blockSize:], bytes.Repeat([]byte{byte(i)}, blockSize))
		s = append(s, transfer.Desc{Addr: src.Desc().Addr + uint64(i*blockSize), Len: blockSize, Kind: transfer.Host})
		d = append(d, transfer.Desc{Addr: dst.Desc().Addr + uint64((blocks-1-i)*blockSize), Len: blockSize, Kind: transfer.Host})
	}
	b, err := prefill.Agent.Submit(pipeline.Request{Peer: peer, Src: s, Dst: d, Tag: []byte("req-42")})
	if err != nil {
		return err // bad arguments, an unknown peer, or a required route it cannot take
	}
	if err := b.Wait(ctx); err != nil { // every batch resolves: it never hangs
		return err
	}
	if err := b.Release(); err != nil {
		return err // not quiescent: a transport may still touch src; keep it
	}

	// The decode side: the event says the bytes are in place.
	select {
	case ev := <-received:
		if ev.Err != nil {
			return ev.Err // cancelled, expired, peer lost, ...: never silence
		}
		fmt.Printf("%s received %q from %s: %d bytes by %s\n", decode.Agent.Name(), ev.Tag, ev.Peer, ev.Bytes, ev.Route)
	case <-ctx.Done():
		return ctx.Err()
	}
	for i := range blocks {
		if got := dst.Bytes()[(blocks-1-i)*blockSize]; got != byte(i) {
			return fmt.Errorf("block %d: got %d", i, got)
		}
	}
	fmt.Println("every block in place")
	return nil
}
