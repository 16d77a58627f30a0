package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/driver"
	"github.com/bouncekv/bounce/node"
)

// Where a workload's sources and destinations live (--memory).
const (
	memoryHost   = "host"
	memoryDevice = "device"
)

// memoryFlag is --memory of run, bench and serve.
type memoryFlag struct{ kind string }

func (m *memoryFlag) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&m.kind, "memory", memoryHost,
		"where the sources and destinations live: host, or device (GPU memory on stages.device; host stages become cuda, the bounce route stages device KV through a pinned-host arena over a host engine)")
}

func (m memoryFlag) check() error {
	if m.kind != memoryHost && m.kind != memoryDevice {
		return usage(fmt.Errorf("--memory %q: accepted: host, device", m.kind))
	}
	return nil
}

// arg passes the flag on to the receiver child.
func (m memoryFlag) arg() string { return "--memory=" + m.kind }

// apply makes cfg able to carry device KV: host stages become cuda (the
// only stages that touch device memory), said once on w. A stage falls
// back to host without CUDA; the buffer allocation then says why.
func (m memoryFlag) apply(cfg *config.Config, w io.Writer) {
	if m.kind != memoryDevice {
		return
	}
	for _, st := range []*config.StageConfig{&cfg.Stages.Gather, &cfg.Stages.Scatter} {
		if st.Kind == "host" {
			st.Kind = "cuda"
			if w != nil {
				fmt.Fprintf(w, "--memory device: stages.gather and stages.scatter host become cuda\n")
				w = nil
			}
		}
	}
}

// alloc allocates n bytes where the flag says: host memory, or device
// memory on cfg.Stages.Device through f's CUDA driver.
func (m memoryFlag) alloc(f node.Factories, cfg config.Config, n uint64) (driver.Buffer, error) {
	if m.kind != memoryDevice {
		return driver.AllocHost(n)
	}
	if f.CUDA == nil {
		return nil, fmt.Errorf("--memory device: no CUDA driver in this build")
	}
	drv, err := f.CUDA.Open()
	if err != nil {
		return nil, fmt.Errorf("--memory device: %w", err)
	}
	c, err := drv.Primary(cfg.Stages.Device)
	if err != nil {
		return nil, fmt.Errorf("--memory device: %w", err)
	}
	b, err := driver.AllocDevice(c, n)
	if err != nil {
		_ = c.Release()
		return nil, fmt.Errorf("--memory device: %w", err)
	}
	return releasing{b, c.Release}, nil
}

// releasing frees a buffer and then gives its context back.
type releasing struct {
	driver.Buffer
	release func() error
}

func (r releasing) Free() error {
	err := r.Buffer.Free()
	if rerr := r.release(); err == nil {
		err = rerr
	}
	return err
}
