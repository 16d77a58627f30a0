package node

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/discovery"
	"github.com/bouncekv/bounce/discovery/etcd"
	"github.com/bouncekv/bounce/discovery/file"
)

// OpenDirectory opens the directory discovery.kind names: file (records
// are descriptor files) or etcd (it connects, and an unreachable cluster is
// an error wrapping discovery.ErrUnavailable).
func OpenDirectory(ctx context.Context, c config.DiscoveryConfig, log *slog.Logger) (discovery.Directory, error) {
	switch c.Kind {
	case "file":
		return file.Directory{}, nil
	case "etcd":
		return etcd.Open(ctx, c, log)
	}
	return nil, fmt.Errorf("discovery.kind %q: accepted: file, etcd", c.Kind)
}
