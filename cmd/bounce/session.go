package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/bouncekv/bounce/benchreport"
	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/driver"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/transfer"
	"github.com/bouncekv/bounce/workload"
)

// session is the two agents of the main job or a benchmark sweep: the
// receiver child process and the sender node with its source buffer.
type session struct {
	recv *receiver
	n    *node.Node
	d    *driver.Driver
	tgt  driver.Target
	// bulk and bulkTgt are the host buffers of the bulk route on device
	// KV (the receiver served --host-bulk-buffer): one bulk write of the
	// same bytes from host memory into host memory. Nil otherwise.
	bulk    *driver.Driver
	bulkTgt driver.Target
	// peer is the receiver followed through discovery (bench --peer NAME
	// with discovery.kind etcd); nil otherwise.
	peer *peerSource
}

// route returns the driver and target route r moves with, and the
// receiver buffer its clear and verify commands name.
func (s *session) route(r string) (*driver.Driver, driver.Target, string) {
	if r == benchreport.RouteBulk && s.bulk != nil {
		return s.bulk, s.bulkTgt, "bulk"
	}
	return s.d, s.tgt, ""
}

// startSession starts the receiver child and the sender node and introduces
// them to each other.
// The sender's source buffer lives where memory says.
func startSession(cmd *cobra.Command, cfg config.Config, childArgs []string, capacity uint64, memory memoryFlag) (*session, error) {
	f := factories()
	var recv *receiver
	var err error
	if inProcess(cfg.Engine) {
		fmt.Fprintf(cmd.ErrOrStderr(), "engine %s connects agents of one process only: the receiver runs in this process\n", cfg.Engine.Kind)
		recv, err = startLocalReceiver(f, childArgs, cmd.ErrOrStderr(), 60*time.Second)
	} else {
		recv, err = startReceiver(childArgs, cmd.ErrOrStderr(), 60*time.Second)
	}
	if err != nil {
		return nil, runtime(err)
	}
	s := &session{recv: recv, tgt: driver.Target{Peer: recv.hello.Name, Buffer: recv.hello.buffer()}}
	fail := func(wrap func(error) error, err error) (*session, error) {
		s.close()
		return nil, wrap(err)
	}
	if s.n, err = node.Build(cfg, f, logger(cmd, cfg.Log)); err != nil {
		return fail(func(err error) error { return classify(err, usage) }, err)
	}
	if _, err := s.n.Agent.LoadPeer(recv.blob); err != nil {
		return fail(failed, fmt.Errorf("load receiver: %w", err))
	}
	own, err := s.n.Agent.Descriptor()
	if err != nil {
		return fail(runtime, err)
	}
	if _, err := recv.call(command{Op: "load", Descriptor: base64.StdEncoding.EncodeToString(own)}, 30*time.Second); err != nil {
		return fail(runtime, err)
	}
	src, err := memory.alloc(f, cfg, capacity)
	if err != nil {
		return fail(runtime, fmt.Errorf("source buffer of %s: %w", benchreport.FormatSize(capacity), err))
	}
	if s.d, err = driver.NewOn(s.n.Agent, src); err != nil {
		return fail(runtime, fmt.Errorf("source buffer of %s: %w", benchreport.FormatSize(capacity), err))
	}
	if h := recv.hello; h.BulkLen > 0 {
		hsrc, err := driver.AllocHost(capacity)
		if err == nil {
			s.bulk, err = driver.NewOn(s.n.Agent, hsrc)
		}
		if err != nil {
			return fail(runtime, fmt.Errorf("host bulk source buffer of %s: %w", benchreport.FormatSize(capacity), err))
		}
		s.bulkTgt = driver.Target{Peer: h.Name, Buffer: transfer.Desc{Addr: h.BulkAddr, Len: h.BulkLen, Kind: transfer.Host}}
	}
	return s, nil
}

// remoteSession builds the sender node against a receiver that runs
// elsewhere ('bounce serve' on another host): its descriptor line h/blob is
// all it knows of it, so nothing is verified or cleared on that side.
//
// With discovery.kind etcd, peer is the receiver's agent name, resolved
// through discovery as 'bounce send' does (this agent publishes its own
// record, so a receiver started with 'serve --follow' admits it); otherwise
// h and blob are the descriptor line already read from the --peer file.
func remoteSession(cmd *cobra.Command, cfg config.Config, peer string, h hello, blob []byte, capacity uint64, memory memoryFlag) (*session, error) {
	tooSmall := func(h hello) error {
		if capacity <= h.BufferLen {
			return nil
		}
		return usage(fmt.Errorf("--peer: the receiver's buffer is %s, the largest cell needs %s: start 'bounce serve' with a larger --buffer-size or lower --max-bytes",
			benchreport.FormatSize(h.BufferLen), benchreport.FormatSize(capacity)))
	}
	etcd := cfg.Discovery.Kind == "etcd"
	if !etcd {
		if err := tooSmall(h); err != nil {
			return nil, err
		}
	}
	s := &session{}
	var err error
	f := factories()
	log := logger(cmd, cfg.Log)
	if s.n, err = node.Build(cfg, f, log); err != nil {
		return nil, classify(err, usage)
	}
	if etcd {
		if s.peer, err = openPeer(cmd.Context(), nil, cfg, s.n, log, peer); err != nil {
			s.close()
			return nil, err
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
		h, err = s.peer.current(ctx)
		cancel()
		if err == nil {
			err = tooSmall(h)
		}
		if err != nil {
			s.close()
			return nil, classify(err, failed)
		}
	} else if _, err := s.n.Agent.LoadPeer(blob); err != nil {
		s.close()
		return nil, failed(fmt.Errorf("load receiver %q: %w", h.Name, err))
	}
	s.tgt = driver.Target{Peer: h.Name, Buffer: h.buffer()}
	src, err := memory.alloc(f, cfg, capacity)
	if err == nil {
		s.d, err = driver.NewOn(s.n.Agent, src)
	}
	if err != nil {
		s.close()
		return nil, runtime(fmt.Errorf("source buffer of %s: %w", benchreport.FormatSize(capacity), err))
	}
	return s, nil
}

// close tears the session down: the source buffer, the sender, the receiver.
func (s *session) close() error {
	var errs []error
	if s.d != nil {
		errs = append(errs, s.d.Close())
	}
	if s.bulk != nil {
		errs = append(errs, s.bulk.Close())
	}
	if s.peer != nil {
		s.peer.close()
	}
	if s.n != nil {
		errs = append(errs, s.n.Close(context.Background()))
	}
	if s.recv != nil {
		errs = append(errs, s.recv.close())
	}
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// verifyCommand asks the receiver to verify requests requests of spec (the
// i-th with seed spec.Seed+i), laid out back to back in its buffer.
func verifyCommand(spec workload.Spec, requests int) command {
	return command{Op: "verify", DescSize: spec.DescSize, Count: spec.Count, Fragmented: spec.Fragmented, Seed: spec.Seed, Regions: spec.Regions, Requests: requests}
}

// pools has the receiver register a block pool over each of requests
// request slices of its buffer in spec's block-table layout (replacing the
// previous ones) and loads its new descriptor, so requests in the block
// form can name them (driver.DstPool).
func (s *session) pools(spec workload.Spec, requests int) error {
	return s.loadPools("the block-table form", command{Op: "pools", DescSize: spec.DescSize, Count: spec.Count, Regions: spec.Regions, Requests: requests})
}

// loadPools sends the receiver this command started the pools command
// pools (what needs them names the error when there is none: --peer) and
// loads the descriptor it answers with.
func (s *session) loadPools(what string, pools command) error {
	if s.recv == nil {
		return fmt.Errorf("%s needs a receiver this command started (not --peer): it registers the destination pools", what)
	}
	rep, err := s.recv.call(pools, 2*time.Minute)
	if err != nil {
		return err
	}
	blob, err := base64.StdEncoding.DecodeString(rep.Descriptor)
	if err != nil {
		return fmt.Errorf("receiver descriptor after pools: %w", err)
	}
	if _, err := s.n.Agent.LoadPeer(blob); err != nil {
		return fmt.Errorf("load receiver after pools: %w", err)
	}
	return nil
}

// warmMove is one unrecorded move of session.warmUp, named for errors.
type warmMove struct {
	route string
	opts  driver.Options
}

// warmUp makes each move once, unrecorded, so connection setup, first-touch
// faults and heap growth land in no measurement.
func (s *session) warmUp(ctx context.Context, moves ...warmMove) error {
	for _, m := range moves {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		d, tgt, _ := s.route(m.route)
		if m.opts.Blocks {
			if err := s.pools(m.opts.Spec, m.opts.Requests); err != nil {
				cancel()
				return fmt.Errorf("warm-up on %s (block form): %w", m.route, err)
			}
		}
		res, err := d.Run(wctx, tgt, m.opts)
		cancel()
		if err == nil && res.Failed > 0 {
			err = res.FirstErr
		}
		if err != nil {
			return fmt.Errorf("warm-up on %s: %w", m.route, err)
		}
	}
	return nil
}
