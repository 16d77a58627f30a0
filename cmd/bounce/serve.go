package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/google/renameio/v2"
	"github.com/spf13/cobra"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/driver"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/transfer"
	"github.com/bouncekv/bounce/workload"
)

// hello is what `bounce serve` publishes: everything a sender needs.
type hello struct {
	Name       string `json:"name"`
	Descriptor string `json:"descriptor"` // base64 agent descriptor
	BufferAddr uint64 `json:"buffer_addr"`
	BufferLen  uint64 `json:"buffer_len"`
	// BufferKind is the buffer's memory kind ("cuda"; empty means host)
	// and BufferDevice its CUDA ordinal (--memory device).
	BufferKind   string `json:"buffer_kind,omitempty"`
	BufferDevice int32  `json:"buffer_device,omitempty"`
	Bounce       bool   `json:"bounce"`
	// BulkAddr and BulkLen are a host buffer served beside a device one
	// (--host-bulk-buffer): the bench's bulk route on device KV writes
	// the same bytes into it from host memory.
	BulkAddr uint64 `json:"bulk_addr,omitempty"`
	BulkLen  uint64 `json:"bulk_len,omitempty"`
	// Metrics is the Prometheus endpoint's host:port, when one is served
	// (telemetry.metrics.listen).
	Metrics string `json:"metrics,omitempty"`
}

// command is one line of the stdin control protocol of `serve --stdin-control`.
type command struct {
	Op         string `json:"op"` // verify, fill, clear, load, pools, stats, known, quit
	DescSize   uint64 `json:"desc_size,omitempty"`
	Count      int    `json:"count,omitempty"`
	Fragmented bool   `json:"fragmented,omitempty"`
	Seed       uint64 `json:"seed,omitempty"`
	// Regions is the block-table layout of the spec (workload.Spec.Regions)
	// that verify checks and pools registers.
	Regions    int    `json:"regions,omitempty"`
	Requests   int    `json:"requests,omitempty"`
	Descriptor string `json:"descriptor,omitempty"`
	// Peers are the agent names op known asks about.
	Peers []string `json:"peers,omitempty"`
	// Convert, when set, makes pools register request slices of its
	// destination layout and verify check its byte pattern (a layout
	// conversion, workload.Conversion); the spec fields are then unused.
	Convert *workload.Conversion `json:"convert,omitempty"`
	// Buffer "bulk" makes verify and clear act on the host bulk buffer
	// (--host-bulk-buffer); empty: the destination buffer.
	Buffer string `json:"buffer,omitempty"`
}

type reply struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	Stats any    `json:"stats,omitempty"`
	// Verified is the number of requests a verify checked.
	Verified int `json:"verified,omitempty"`
	// Known are the asked peers that are loaded (op known).
	Known []string `json:"known,omitempty"`
	// Descriptor is the agent's descriptor after op pools (base64), for
	// the sender to load again.
	Descriptor string `json:"descriptor,omitempty"`
}

func newServeCmd() *cobra.Command { return newServeCmdWith(factories) }

// newServeCmdWith is serve building its agent from fs (bounce run shares
// its table with an in-process receiver, so in-process engines meet).
func newServeCmdWith(fs func() node.Factories) *cobra.Command {
	var bufSize string
	var out string
	var stdinControl bool
	var hostBulk bool
	var expect workloadFlags
	var expectOn, hold bool
	var expectWait time.Duration
	var follow []string
	var memory memoryFlag
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a receiver agent that publishes its descriptor and serves transfers",
		Long: `serve builds an agent from the configuration, registers a destination
buffer for incoming KV blocks and publishes one JSON line — its name, its
agent descriptor (base64) and the buffer's address — on stdout or to
--descriptor-out. Pass that line to 'bounce send --peer'. It serves until
interrupted (SIGINT/SIGTERM).

With --expect it verifies the workload a sender is expected to move (the same
--workload, --count, --desc-size, --contiguous, --seed and --requests as the
sender's 'bounce send'): it checks the buffer as bytes land, prints
"verified" and exits 0 once every byte is right, or exits 1 naming the first
wrong byte when --expect-wait runs out.

With --hold it is the holder of that workload instead: it fills the buffer
with the bytes a sender would move, registered for every admitted peer, so
'bounce pull' (the same workload flags) pulls them and verifies each byte
on its side; each pull served is a "pulled" line on stderr.

With discovery.kind etcd the line is also published in etcd under
<discovery.prefix>/agents/<agent.name>, on a lease kept alive while serve
runs (a name a live agent holds is refused), and --follow NAME admits the
sender of that name as soon as it publishes itself (and again when it
restarts).

With --stdin-control it reads JSON commands from stdin instead (used by
'bounce run' and 'bounce bench'): verify, clear, load, pools (register a
block pool over each request's slice of the buffer for the block-table form,
replacing the previous ones, and answer the new descriptor), stats, known,
quit.`,
		Example: `  # host A: its key pair, and its public key line for B (host-a.peer, copied to B)
  bounce key --security.key-file a.key --agent.name host-a --out host-a.peer
  # host B: admits host A's key only
  bounce serve --engine.listen 10.0.0.2:7000 --control-plane.interface eth0 --security.allowed-peers @host-a.peer \
      --descriptor-out recv.json --expect --workload gptoss120b-tp8-b16 --requests 8
  # host A, with recv.json copied over
  bounce send --peer recv.json --engine.listen 10.0.0.1:0 --control-plane.interface eth0 --agent.name host-a \
      --security.key-file a.key --workload gptoss120b-tp8-b16 --requests 8`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			roleService(l, "recv")
			if err := memory.check(); err != nil {
				return err
			}
			memory.apply(&l.Config, cmd.ErrOrStderr())
			// Everything is validated before the descriptor is published:
			// a sender never sees a receiver that then refuses to start.
			var want uint64 // the bytes --expect (or --hold) needs
			if expectOn && hold {
				return usage(fmt.Errorf("--expect and --hold: a serve receives (--expect) or holds a workload for pullers (--hold), not both"))
			}
			if expectOn || hold {
				spec, err := expect.spec()
				if err != nil {
					return err
				}
				want = uint64(expect.requests) * spec.Bytes()
			}
			size := config.Size(want)
			switch {
			case bufSize != "":
				size, err = config.ParseSize(bufSize)
				if err != nil || size == 0 {
					return usage(fmt.Errorf("--buffer-size %q: a positive byte size like 512MiB", bufSize))
				}
				if uint64(size) < want {
					return usage(fmt.Errorf("--buffer-size %v is smaller than the %v --expect needs (%d request(s) x %v); omit --buffer-size to size it from --expect",
						size, config.Size(want), expect.requests, config.Size(want/uint64(expect.requests))))
				}
			case !expectOn && !hold:
				size = config.GiB
			}
			log := logger(cmd, l.Config.Log)
			// A receiver whose bounce path cannot be built (a bad
			// interface, say: exit 2) or started (an arena that cannot be
			// mapped: exit 3) fails here rather than serve direct only.
			opts := node.Options{Logger: log, StrictBounce: true}
			if !stdinControl {
				// Each request a sender finishes (or fails) here is one
				// line on stderr; under --stdin-control the parent reads
				// the counts from stats instead.
				events := make(chan pipeline.Received, 1024)
				printed := make(chan struct{})
				go func() {
					defer close(printed)
					printEvents(cmd.ErrOrStderr(), events)
				}()
				defer func() { close(events); <-printed }() // after n.Close: no sender left
				opts.Received = events
			}
			n, err := node.BuildWith(l.Config, fs(), opts)
			if errors.Is(err, pipeline.ErrBounceUnavailable) {
				return runtime(err) // the arena could not be set up: the environment
			}
			if err != nil {
				return classify(err, usage)
			}
			defer n.Close(context.Background())
			buf, err := memory.alloc(fs(), l.Config, uint64(size))
			if err != nil {
				return runtime(err)
			}
			defer buf.Free()
			defer n.Close(context.Background()) // before the buffer is freed
			if err := n.Agent.RegisterMemory(buf.Desc()); err != nil {
				return runtime(err)
			}
			if hold {
				spec, _ := expect.spec() // validated above
				if err := driver.FillBuffer(buf, spec, expect.requests); err != nil {
					return runtime(fmt.Errorf("--hold: %w", err))
				}
			}
			var bulk driver.Buffer
			if hostBulk {
				if bulk, err = driver.AllocHost(uint64(size)); err != nil {
					return runtime(fmt.Errorf("--host-bulk-buffer: %w", err))
				}
				defer bulk.Free()
				defer n.Close(context.Background()) // before the buffer is freed
				if err := n.Agent.RegisterMemory(bulk.Desc()); err != nil {
					return runtime(fmt.Errorf("--host-bulk-buffer: %w", err))
				}
			}
			blob, err := n.Agent.Descriptor()
			if err != nil {
				return runtime(err)
			}
			on, _ := n.Agent.BounceEnabled()
			bd := buf.Desc()
			hl := hello{Name: n.Agent.Name(), Descriptor: base64.StdEncoding.EncodeToString(blob), BufferAddr: bd.Addr, BufferLen: bd.Len, Bounce: on,
				Metrics: n.Telemetry.MetricsAddr(), BufferKind: kindName(bd), BufferDevice: bd.Device}
			if bulk != nil {
				hl.BulkAddr, hl.BulkLen = bulk.Desc().Addr, bulk.Desc().Len
			}
			line, _ := json.Marshal(hl)
			// With discovery.kind etcd the line is also published under
			// the agent's name, and the senders named by --follow are
			// admitted as they appear.
			in, err := join(cmd.Context(), l.Config, n, log, line, follow)
			if err != nil {
				return err
			}
			defer in.close()
			w := cmd.OutOrStdout()
			if out != "" {
				if err := renameio.WriteFile(out, append(line, '\n'), 0o644); err != nil {
					return runtime(err)
				}
			} else {
				fmt.Fprintf(w, "%s\n", line)
			}
			if stdinControl {
				return controlLoop(cmd.InOrStdin(), w, n, buf, bulk)
			}
			if expectOn {
				return awaitExpected(cmd, buf, expect, expectWait)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "serving as %q; interrupt to stop\n", n.Agent.Name())
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
			defer signal.Stop(sig)
			<-sig
			return nil
		},
	}
	cmd.Flags().StringVar(&bufSize, "buffer-size", "", "size of the registered destination buffer (default: what --expect needs, else 1GiB)")
	cmd.Flags().StringVar(&out, "descriptor-out", "", "write the descriptor line to this file instead of stdout")
	cmd.Flags().StringSliceVar(&follow, "follow", nil, "load these peers (comma-separated or repeated) whenever they publish themselves: agent names with discovery.kind etcd, descriptor files (a puller's --descriptor-out) with kind file")
	cmd.Flags().BoolVar(&stdinControl, "stdin-control", false, "read JSON commands from stdin (for bounce run/bench)")
	cmd.Flags().BoolVar(&hostBulk, "host-bulk-buffer", false, "also register a host buffer of --buffer-size for the bench's bulk route (with --memory device: one bulk write from host memory)")
	_ = cmd.Flags().MarkHidden("host-bulk-buffer")
	cmd.Flags().BoolVar(&expectOn, "expect", false, "verify the workload described by the workload flags as it lands, then exit")
	cmd.Flags().DurationVar(&expectWait, "expect-wait", 5*time.Minute, "with --expect: give up (exit 1) after this long")
	cmd.Flags().BoolVar(&hold, "hold", false, "fill the buffer with the workload described by the workload flags and serve it to pullers ('bounce pull')")
	expect.add(cmd, 1)
	memory.add(cmd)
	configFlags(cmd)
	return cmd
}

// controlLoop serves the stdin protocol until quit or EOF.
// bulk, when not nil, is the host bulk buffer commands with Buffer "bulk"
// act on.
func controlLoop(in io.Reader, out io.Writer, n *node.Node, buf, bulk driver.Buffer) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	enc := json.NewEncoder(out)
	var pools *driver.Pools // op pools: the block pools registered now
	for sc.Scan() {
		var c command
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			enc.Encode(reply{Error: "bad command: " + err.Error()})
			continue
		}
		b := buf
		switch c.Buffer {
		case "":
		case "bulk":
			if bulk == nil {
				enc.Encode(reply{Error: "buffer \"bulk\": no host bulk buffer is served (--host-bulk-buffer)"})
				continue
			}
			b = bulk
		default:
			enc.Encode(reply{Error: fmt.Sprintf("unknown buffer %q; accepted: bulk, or none", c.Buffer)})
			continue
		}
		switch c.Op {
		case "verify":
			enc.Encode(verify(b, c))
		case "fill":
			enc.Encode(fill(b, c))
		case "clear":
			enc.Encode(errReply(b.Clear()))
		case "pools":
			var rep reply
			pools, rep = registerPools(n, b, pools, c)
			enc.Encode(rep)
		case "load":
			blob, err := base64.StdEncoding.DecodeString(c.Descriptor)
			if err == nil {
				_, err = n.Agent.LoadPeer(blob)
			}
			enc.Encode(errReply(err))
		case "stats":
			enc.Encode(reply{OK: true, Stats: n.Agent.Stats()})
		case "known":
			rep := reply{OK: true}
			for _, p := range c.Peers {
				if _, _, ok := n.Agent.PeerRoute(p); ok {
					rep.Known = append(rep.Known, p)
				}
			}
			enc.Encode(rep)
		case "quit":
			enc.Encode(reply{OK: true})
			return nil
		default:
			enc.Encode(reply{Error: fmt.Sprintf("unknown op %q; accepted: verify, fill, clear, load, pools, stats, known, quit", c.Op)})
		}
	}
	return sc.Err()
}

// verify checks every request's blocks in the buffer (device memory is
// copied back to the host one request at a time and checked there).
func verify(b driver.Buffer, c command) reply {
	if c.Convert != nil {
		return verifyConverted(b, c)
	}
	if err := driver.VerifyBuffer(b, c.spec(), c.Requests); err != nil {
		return errReply(err)
	}
	return reply{OK: true, Verified: c.Requests}
}

// fill writes every request's bytes into the buffer as a sender's source
// (driver.FillBuffer): what a puller then pulls and verifies.
func fill(b driver.Buffer, c command) reply {
	return errReply(driver.FillBuffer(b, c.spec(), c.Requests))
}

// spec is the workload a verify or fill command names.
func (c command) spec() workload.Spec {
	return workload.Spec{DescSize: c.DescSize, Count: c.Count, Fragmented: c.Fragmented, Seed: c.Seed, Regions: c.Regions}
}

// registerPools serves op pools: it releases the pools registered before
// (old) and registers one per request slice of b for c's spec
// (driver.DstPool names them), answering the agent's new descriptor.
func registerPools(n *node.Node, b driver.Buffer, old *driver.Pools, c command) (*driver.Pools, reply) {
	// A peer's flow holds its destination pool until the receiver saw it
	// end, a moment after the sender's batch completed: wait for that.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		err := old.Release()
		if err == nil {
			break
		}
		if !errors.Is(err, transfer.ErrInUse) || time.Now().After(deadline) {
			return old, errReply(fmt.Errorf("releasing the previous pools: %w", err))
		}
	}
	var pools *driver.Pools
	var err error
	if cv := c.Convert; cv != nil {
		if err := cv.Validate(); err != nil {
			return nil, errReply(err)
		}
		pools, err = driver.RegisterConvPools(n.Agent, b.Desc(), *cv, cv.Dst, c.Requests, driver.DstPool)
	} else {
		s := workload.Spec{DescSize: c.DescSize, Count: c.Count, Regions: c.Regions}
		if err := s.Validate(); err != nil {
			return nil, errReply(err)
		}
		pools, err = driver.RegisterPools(n.Agent, b.Desc(), s, c.Requests, driver.DstPool)
	}
	if err != nil {
		return nil, errReply(err)
	}
	blob, err := n.Agent.Descriptor()
	if err != nil {
		return pools, errReply(err)
	}
	return pools, reply{OK: true, Descriptor: base64.StdEncoding.EncodeToString(blob)}
}

// kindName is a buffer's kind for the hello line: "" for host memory.
func kindName(d transfer.Desc) string {
	if d.Kind == transfer.Host {
		return ""
	}
	return d.Kind.String()
}

func errReply(err error) reply {
	if err != nil {
		return reply{Error: err.Error()}
	}
	return reply{OK: true}
}

// target converts a hello into the driver's target.
func (h hello) buffer() transfer.Desc {
	d := transfer.Desc{Addr: h.BufferAddr, Len: h.BufferLen, Kind: transfer.Host}
	if h.BufferKind == transfer.CUDA.String() {
		d.Kind, d.Device = transfer.CUDA, h.BufferDevice
	}
	return d
}

// awaitExpected checks the buffer until every request of the expected
// workload verifies, or the wait runs out (the first wrong byte is named).
func awaitExpected(cmd *cobra.Command, buf driver.Buffer, wf workloadFlags, wait time.Duration) error {
	spec, err := wf.spec()
	if err != nil {
		return err
	}
	c := verifyCommand(spec, wf.requests)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	deadline := time.After(wait)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		rep := verify(buf, c)
		if rep.OK {
			fmt.Fprintf(cmd.OutOrStdout(), "verified: %d request(s), %d bytes, every byte right\n", wf.requests, uint64(wf.requests)*spec.Bytes())
			return nil
		}
		select {
		case <-tick.C:
		case <-sig:
			return failed(fmt.Errorf("interrupted before the expected workload arrived: %s", rep.Error))
		case <-deadline:
			return failed(fmt.Errorf("expected workload not complete after %v: %s", wait, rep.Error))
		}
	}
}

// printEvents writes one line per receiver completion event until events is
// closed: "received" with the peer, request, tag, bytes and route, or
// "receive failed" with the error as well.
func printEvents(w io.Writer, events <-chan pipeline.Received) {
	for ev := range events {
		if ev.Pull {
			if ev.Err != nil {
				fmt.Fprintf(w, "pull failed: peer=%s request=%d tag=%q bytes=%d quiescent=%v err=%q\n", ev.Peer, ev.Request, ev.Tag, ev.Bytes, ev.Quiescent, ev.Err)
				continue
			}
			fmt.Fprintf(w, "pulled: peer=%s request=%d tag=%q bytes=%d\n", ev.Peer, ev.Request, ev.Tag, ev.Bytes)
			continue
		}
		if ev.Err != nil {
			fmt.Fprintf(w, "receive failed: peer=%s request=%d tag=%q bytes=%d route=%s err=%q\n", ev.Peer, ev.Request, ev.Tag, ev.Bytes, ev.Route, ev.Err)
			continue
		}
		fmt.Fprintf(w, "received: peer=%s request=%d tag=%q bytes=%d route=%s\n", ev.Peer, ev.Request, ev.Tag, ev.Bytes, ev.Route)
	}
}

// verifyConverted is verify for a layout conversion: request i's slice of
// the buffer is its destination pool, checked element by element.
func verifyConverted(b driver.Buffer, c command) reply {
	cv := c.Convert
	if err := cv.Validate(); err != nil {
		return errReply(err)
	}
	per := cv.PoolBytes(cv.Dst)
	if n := b.Desc().Len; uint64(c.Requests)*per > n {
		return errReply(fmt.Errorf("%d requests x %d bytes exceed the %d-byte buffer", c.Requests, per, n))
	}
	host := driver.HostBytes(b)
	var got []byte
	if host == nil {
		got = make([]byte, per)
	}
	for i := 0; i < c.Requests; i++ {
		if host != nil {
			got = host[uint64(i)*per : uint64(i+1)*per]
		} else if err := b.ReadAt(got, uint64(i)*per); err != nil {
			return errReply(fmt.Errorf("request %d: read back: %w", i, err))
		}
		if err := cv.Verify(got, cv.Seed+uint64(i)); err != nil {
			return errReply(fmt.Errorf("request %d: %w", i, err))
		}
	}
	return reply{OK: true, Verified: c.Requests}
}
