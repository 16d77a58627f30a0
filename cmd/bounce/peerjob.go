package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/driver"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/workload"
)

// peerJob is what send and pull set up before their first request: the
// configuration, the workload, this agent's node, the peer it follows and
// a Driver over a buffer of the workload's bytes.
type peerJob struct {
	cfg  config.Config
	log  *slog.Logger
	spec workload.Spec
	n    *node.Node
	src  *peerSource
	buf  driver.Buffer
	d    *driver.Driver
}

// startPeerJob sets up a peerJob for role (the service name), refusing a
// bad flag or descriptor file before an agent starts; close releases what
// it made, in reverse order.
func startPeerJob(cmd *cobra.Command, role string, memory memoryFlag, wf workloadFlags, repeat int, peerFile string) (*peerJob, error) {
	l, err := loadConfig(cmd)
	if err != nil {
		return nil, err
	}
	roleService(l, role)
	if err := memory.check(); err != nil {
		return nil, err
	}
	memory.apply(&l.Config, cmd.ErrOrStderr())
	j := &peerJob{cfg: l.Config}
	if j.spec, err = wf.spec(); err != nil {
		return nil, err
	}
	if repeat < 1 {
		return nil, usage(fmt.Errorf("--repeat %d: must be at least 1", repeat))
	}
	if j.cfg.Discovery.Kind != "etcd" && peerFile != "-" {
		// A bad descriptor file is reported before an agent starts.
		if _, _, err := readHello(nil, peerFile); err != nil {
			return nil, usage(err)
		}
	}
	j.log = logger(cmd, j.cfg.Log)
	if j.n, err = node.Build(j.cfg, factories(), j.log); err != nil {
		return nil, classify(err, usage)
	}
	if j.src, err = openPeer(cmd.Context(), cmd.InOrStdin(), j.cfg, j.n, j.log, peerFile); err != nil {
		j.close()
		return nil, err
	}
	if j.buf, err = memory.alloc(factories(), j.cfg, j.spec.Bytes()*uint64(wf.requests)); err != nil {
		j.close()
		return nil, runtime(err)
	}
	if j.d, err = driver.NewOn(j.n.Agent, j.buf); err != nil {
		j.close()
		return nil, runtime(err)
	}
	return j, nil
}

// close releases the Driver, the peer source and the node, those made.
func (j *peerJob) close() {
	if j.d != nil {
		j.d.Close()
	}
	if j.src != nil {
		j.src.close()
	}
	if j.n != nil {
		j.n.Close(context.Background())
	}
}
