package nixl

import (
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// Defaults used for zero Config fields.
const (
	// DefaultMaxNotifySize bounds one notification's payload.
	DefaultMaxNotifySize = 16 << 10
	// DefaultRecvQueue bounds received notifications not yet taken.
	DefaultRecvQueue = 4096
	// DefaultPollInterval is the longest the background goroutine sleeps
	// between two progress/getNotifs rounds when nothing is in flight.
	DefaultPollInterval = time.Millisecond
	// DefaultDrainTimeout bounds how long ForgetPeer and Close wait for
	// NIXL to complete in-flight writes before giving up on them.
	DefaultDrainTimeout = 5 * time.Second
)

// BackendErrorMode is the UCX backend parameter that selects the UCP error
// handling mode of NIXL's endpoints ("peer" or "none"). NIXL releases from
// 0.3.0 on read it and default to peer; UCX 1.13's shared-memory transports
// support only none, so on one host keep tcp among UCX_TLS or set none.
const BackendErrorMode = "ucx_error_handling_mode"

// Config configures an Engine. Zero fields take the defaults above.
type Config struct {
	// Name is the NIXL agent name peers know this engine by (1..255 bytes,
	// no NUL).
	Name string
	// Backend holds the UCX backend's initialisation parameters, passed to
	// createBackend unchanged (for example "ucx_error_handling_mode": "none"
	// on NIXL releases that read it, or "device_list"). Nil means none.
	Backend map[string]string
	// ProgressThread turns on NIXL's own progress thread. It busy-yields a
	// core, so it is off by default and the engine's background goroutine
	// progresses the worker instead.
	ProgressThread bool
	// MaxNotifySize bounds a notification payload (0 = default; at most 1 MiB).
	MaxNotifySize int
	// RecvQueue bounds received notifications waiting for RecvNotification;
	// messages arriving when it is full are dropped and counted.
	RecvQueue int
	// PollInterval is the longest idle sleep of the background goroutine
	// (0 = default). It bounds the latency of notifications and, on
	// transports that need target-side progress (tcp), of incoming writes.
	PollInterval time.Duration
	// DrainTimeout bounds how long ForgetPeer and Close wait for in-flight
	// writes to complete before they report them not quiescent.
	DrainTimeout time.Duration
	// Logger receives warnings (nil = discard).
	Logger *slog.Logger
}

// maxNameLen bounds agent names.
const maxNameLen = 255

func checkName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty name")
	case len(name) > maxNameLen:
		return fmt.Errorf("name of %d bytes exceeds %d", len(name), maxNameLen)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("name %q contains NUL", name)
	}
	return nil
}

// validate checks cfg and fills in the defaults.
func (c *Config) validate() error {
	if err := checkName(c.Name); err != nil {
		return fmt.Errorf("nixl: config Name: %v", err)
	}
	for k, v := range c.Backend {
		if k == "" || strings.IndexByte(k, 0) >= 0 || strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("nixl: config Backend %q=%q: keys must be non-empty and neither may contain NUL", k, v)
		}
	}
	switch {
	case c.MaxNotifySize == 0:
		c.MaxNotifySize = DefaultMaxNotifySize
	case c.MaxNotifySize < 0 || c.MaxNotifySize > 1<<20:
		return fmt.Errorf("nixl: config MaxNotifySize %d: want 0 (default %d) or 1..%d", c.MaxNotifySize, DefaultMaxNotifySize, 1<<20)
	}
	switch {
	case c.RecvQueue == 0:
		c.RecvQueue = DefaultRecvQueue
	case c.RecvQueue < 0 || c.RecvQueue > 1<<20:
		return fmt.Errorf("nixl: config RecvQueue %d: want 0 (default %d) or 1..%d", c.RecvQueue, DefaultRecvQueue, 1<<20)
	}
	if err := durDefault(&c.PollInterval, DefaultPollInterval, "PollInterval"); err != nil {
		return err
	}
	if err := durDefault(&c.DrainTimeout, DefaultDrainTimeout, "DrainTimeout"); err != nil {
		return err
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

func durDefault(v *time.Duration, def time.Duration, key string) error {
	switch {
	case *v == 0:
		*v = def
	case *v < 0:
		return fmt.Errorf("nixl: config %s %v: want 0 (default %v) or positive", key, *v, def)
	}
	return nil
}

// Stats are counters of an engine's notification path.
type Stats struct {
	// NotifyFailed counts genNotif calls NIXL rejected.
	NotifyFailed uint64
	// RecvDropped counts received notifications dropped because the receive
	// queue was full.
	RecvDropped uint64
}
