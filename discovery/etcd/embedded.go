package etcd

import (
	"fmt"
	"net/url"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is a single etcd member embedded in this process, on 127.0.0.1
// ports the kernel picks: for tests, and for `bounce bench` when no
// cluster is given.
type Server struct {
	e    *embed.Etcd
	once sync.Once
	// Endpoint is the client URL, http://127.0.0.1:PORT.
	Endpoint string
}

// StartServer starts a member keeping its data in dir (an empty directory
// the caller removes) and waits, at most timeout, until it serves.
func StartServer(dir string, timeout time.Duration) (*Server, error) {
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	any0 := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls = []url.URL{any0}
	cfg.AdvertiseClientUrls = []url.URL{any0}
	cfg.ListenPeerUrls = []url.URL{any0}
	cfg.AdvertisePeerUrls = []url.URL{any0}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	case <-time.After(timeout):
		e.Close()
		return nil, fmt.Errorf("embedded etcd: not ready within %v", timeout)
	}
	return &Server{e: e, Endpoint: "http://" + e.Clients[0].Addr().String()}, nil
}

// Close stops the member.
func (s *Server) Close() { s.once.Do(s.e.Close) }
