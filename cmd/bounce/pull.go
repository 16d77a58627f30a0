package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/renameio/v2"
	"github.com/spf13/cobra"

	"github.com/bouncekv/bounce/driver"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/transfer"
)

func newPullCmd() *cobra.Command {
	var wf workloadFlags
	var peerFile, jsonOut, descOut string
	var repeat int
	var admitWait time.Duration
	var memory memoryFlag
	cmd := &cobra.Command{
		Use:   "pull",
		Short: "Pull a KV-shaped workload from a holding agent and verify it",
		Long: `pull is send the other way round, decode-initiated: it builds an agent
from the configuration, loads the holder published by 'bounce serve --hold'
(its descriptor line from a file, or with discovery.kind etcd its agent
name), pulls the workload the holder filled its buffer with into a buffer
of its own and checks every byte here. The holder decides what may be
pulled (its buffer, registered for every admitted peer) and must know this
agent: write this agent's line with --descriptor-out to the file the
holder follows ('serve --follow FILE'), or through etcd 'serve --follow
NAME' loads it once pull published itself. One unrecorded request moves
first, retried until the holder loaded this agent (at most --admit-wait);
--repeat pulls the workload several times, one summary row each; --json
writes the rows.`,
		Example: `  bounce serve --hold --workload gptoss120b-tp8-b16 --requests 8 --descriptor-out hold.json --follow pull.json
  bounce pull --peer hold.json --descriptor-out pull.json --workload gptoss120b-tp8-b16 --requests 8 --repeat 5`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			j, err := startPeerJob(cmd, "pull", memory, wf, repeat, peerFile)
			if err != nil {
				return err
			}
			defer j.close()
			spec, n, src, buf, d := j.spec, j.n, j.src, j.buf, j.d
			if descOut != "" {
				if err := writeOwnLine(n, descOut); err != nil {
					return runtime(err)
				}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Minute)
			defer cancel()
			h, err := src.current(ctx)
			if err != nil {
				return failed(err)
			}
			tgt := driver.Target{Peer: h.Name, Buffer: h.buffer()}
			out := cmd.OutOrStdout()
			reload := func() error {
				blob, err := base64.StdEncoding.DecodeString(h.Descriptor)
				if err != nil {
					return err
				}
				_ = n.Agent.ForgetPeer(h.Name)
				_, err = n.Agent.LoadPeer(blob)
				return err
			}
			if err := awaitAdmitted(ctx, d, tgt, driver.Options{Spec: spec, Requests: 1, Pull: true, TagPrefix: "warm-up-"}, admitWait, reload); err != nil {
				return failed(fmt.Errorf("warm-up: %w", err))
			}
			fmt.Fprintln(out, "warm-up: one unrecorded request pulled first")
			var rows []namedResult
			var firstErr error
			for i := range repeat {
				if h, err = src.current(ctx); err != nil {
					return failed(err)
				}
				tgt = driver.Target{Peer: h.Name, Buffer: h.buffer()}
				if err := buf.Clear(); err != nil {
					return runtime(err)
				}
				res, err := d.Run(ctx, tgt, driver.Options{Spec: spec, Requests: wf.requests, Pull: true})
				if err != nil {
					return failed(err)
				}
				row := namedResult{res: res, iteration: i, label: "pull"}
				if repeat > 1 {
					row.label = fmt.Sprintf("pull #%d", i)
				}
				switch {
				case res.Failed > 0:
					row.verified = "no: requests failed"
					if firstErr == nil {
						firstErr = fmt.Errorf("%d of %d requests failed: %w", res.Failed, res.Requests, res.FirstErr)
					}
				default:
					if verr := driver.VerifyBuffer(buf, spec, wf.requests); verr != nil {
						row.verified = "FAILED"
						if firstErr == nil {
							firstErr = fmt.Errorf("pass %d: %w", i, verr)
						}
					} else {
						row.verified = verifiedYes
					}
				}
				rows = append(rows, row)
			}
			printResults(out, spec, rows)
			if jsonOut != "" {
				if err := writeSendJSON(jsonOut, spec, "pull", rows); err != nil {
					return runtime(err)
				}
			}
			if firstErr != nil {
				return failed(firstErr)
			}
			return nil
		},
	}
	wf.add(cmd, 1)
	cmd.Flags().IntVar(&repeat, "repeat", 1, "pull the workload this many times, one summary row each")
	cmd.Flags().StringVar(&jsonOut, "json", "", "also write the results as JSON to this file")
	cmd.Flags().StringVar(&peerFile, "peer", "", `the holder: its descriptor line from 'bounce serve --hold' (a file, or "-" for stdin), or with discovery.kind etcd its agent name`)
	cmd.Flags().StringVar(&descOut, "descriptor-out", "", "write this agent's descriptor line to this file, for the holder to load ('serve --follow FILE')")
	cmd.Flags().DurationVar(&admitWait, "admit-wait", time.Minute, "how long the first pull waits for the holder to load this agent")
	cmd.MarkFlagRequired("peer")
	memory.add(cmd)
	configFlags(cmd)
	return cmd
}

// writeOwnLine writes n's descriptor line (a hello without a buffer, as a
// sender publishes through etcd) atomically to path.
func writeOwnLine(n *node.Node, path string) error {
	own, err := n.Agent.Descriptor()
	if err != nil {
		return err
	}
	line, _ := json.Marshal(hello{Name: n.Agent.Name(), Descriptor: base64.StdEncoding.EncodeToString(own)})
	return renameio.WriteFile(path, append(line, '\n'), 0o644)
}

// awaitAdmitted moves o (one request) until it succeeds, at most wait:
// the holder may load this agent only after its first try (it follows
// this agent's descriptor line), and a control channel whose handshake it
// refused then never retries it, so each failed try loads the holder
// again (a fresh connection) before the next.
func awaitAdmitted(ctx context.Context, d *driver.Driver, tgt driver.Target, o driver.Options, wait time.Duration, reload func() error) error {
	deadline := time.Now().Add(wait)
	for {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		res, err := d.Run(tctx, tgt, o)
		cancel()
		if err == nil && res.Failed > 0 {
			err = res.FirstErr
		}
		if err == nil || errors.Is(err, transfer.ErrNotQuiescent) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if rerr := reload(); rerr != nil {
			return fmt.Errorf("%w (reloading the holder: %v)", err, rerr)
		}
	}
}
