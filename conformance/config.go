package conformance

import (
	"fmt"
	"time"
)

// Config tunes a suite run. The zero value runs every rule with the
// defaults documented on each field.
type Config struct {
	// Subject names the implementation under test in reports. Empty means
	// one derived from the fixture (a control channel's Kind, the Go type
	// of an engine or stage).
	Subject string
	// Sizes are the transfer sizes, in bytes, that the data rules move.
	// Default: 1, 7, 4096, 4097, 65536, 1 MiB and 8 MiB. Whatever is
	// given, the suite adds a size above 1 MiB when none is (1 MiB + 4097)
	// and, for an engine whose EnginePair.FragmentSize is set, one above
	// that fragment size, so no list certifies less than the large writes
	// that break engines most often.
	Sizes []uint64
	// Concurrency is the number of goroutines the concurrency rules post
	// from. Default 8.
	Concurrency int
	// OpTimeout bounds every wait for an operation, a message or a peer
	// loss to be noticed. A rule as a whole is abandoned after 3×OpTimeout.
	// Default 10s.
	OpTimeout time.Duration
	// CallTimeout bounds a call that must not block (Poll, Send, Notify,
	// Gather, Scatter, Recv after Close, a Recv past its timeout). Default 1s.
	CallTimeout time.Duration
	// Settle is how long the quiescence rules watch memory after a terminal
	// Poll for writes that should no longer happen. Default 30ms.
	Settle time.Duration
	// QuietWatch is how long the quiescence rules watch, once per rule,
	// for bytes a transport re-sends after an op was terminal (a
	// retransmission timer fires later than Settle). Default 300ms, or
	// Settle when that is longer.
	QuietWatch time.Duration
	// Seed seeds every pattern and random plan; a failure is reproduced by
	// running again with the same Seed. Each rule derives its own stream.
	Seed int64
	// Only, when not empty, lists the IDs of the rules to run; the others
	// are reported as skipped.
	Only []string
	// Skip lists the IDs of rules not to run; they are reported as skipped.
	Skip []string
	// SkipReasons says why a rule listed in Skip is skipped (say, what the
	// implementation documents it cannot promise); the reason is shown in
	// the rule's result. Every key must be listed in Skip.
	SkipReasons map[string]string
	// IgnoreGoroutines names functions (as in goleak.IgnoreAnyFunction)
	// whose goroutines are expected to outlive a rule, such as a library's
	// lazily started background worker.
	IgnoreGoroutines []string
}

// Defaults of Config.
const (
	// DefaultConcurrency is Config.Concurrency when zero.
	DefaultConcurrency = 8
	// DefaultOpTimeout is Config.OpTimeout when zero.
	DefaultOpTimeout = 10 * time.Second
	// DefaultCallTimeout is Config.CallTimeout when zero.
	DefaultCallTimeout = time.Second
	// DefaultSettle is Config.Settle when zero.
	DefaultSettle = 30 * time.Millisecond
	// DefaultQuietWatch is Config.QuietWatch when zero.
	DefaultQuietWatch = 300 * time.Millisecond
)

// DefaultSizes returns the default Config.Sizes.
func DefaultSizes() []uint64 {
	return []uint64{1, 7, 4096, 4097, 65536, 1 << 20, 8 << 20}
}

// maxSize is the largest accepted Config.Sizes entry.
const maxSize = 1 << 30

// largeFloor is the size the suite always runs a write above: a list
// without one gets largeFloor + floorExtra.
const (
	largeFloor = 1 << 20
	floorExtra = 4097
)

// sizeFloors returns sizes with a size above largeFloor and, when frag is
// not zero, one above frag added where none is. It never changes sizes.
func sizeFloors(sizes []uint64, frag uint64) []uint64 {
	out := append([]uint64(nil), sizes...)
	for _, floor := range []uint64{largeFloor, frag} {
		if floor == 0 || floor+floorExtra > maxSize {
			continue
		}
		above := false
		for _, n := range out {
			above = above || n > floor
		}
		if !above {
			out = append(out, floor+floorExtra)
		}
	}
	return out
}

// withDefaults fills zero fields and validates the result.
func (c Config) withDefaults() (Config, error) {
	if len(c.Sizes) == 0 {
		c.Sizes = DefaultSizes()
	} else {
		c.Sizes = append([]uint64(nil), c.Sizes...)
	}
	for _, n := range c.Sizes {
		if n == 0 || n > maxSize {
			return c, fmt.Errorf("Config.Sizes: %d outside [1, %d]", n, uint64(maxSize))
		}
	}
	c.Sizes = sizeFloors(c.Sizes, 0)
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Concurrency < 1 || c.Concurrency > 1024 {
		return c, fmt.Errorf("Config.Concurrency: %d outside [1, 1024]", c.Concurrency)
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = DefaultOpTimeout
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.Settle == 0 {
		c.Settle = DefaultSettle
	}
	if c.QuietWatch == 0 {
		c.QuietWatch = max(DefaultQuietWatch, c.Settle)
	}
	if c.OpTimeout < 0 || c.CallTimeout < 0 || c.Settle < 0 || c.QuietWatch < 0 {
		return c, fmt.Errorf("Config: negative OpTimeout, CallTimeout, Settle or QuietWatch")
	}
	known := map[string]bool{}
	for _, r := range Rules() {
		known[r.ID] = true
	}
	for _, list := range [][]string{c.Only, c.Skip} {
		for _, id := range list {
			if !known[id] {
				return c, fmt.Errorf("Config: unknown rule %q (see conformance.Rules)", id)
			}
		}
	}
	for id := range c.SkipReasons {
		listed := false
		for _, s := range c.Skip {
			listed = listed || s == id
		}
		if !listed {
			return c, fmt.Errorf("Config.SkipReasons: rule %q is not listed in Config.Skip", id)
		}
	}
	return c, nil
}

// maxSize returns the largest configured size.
func (c Config) maxSize() uint64 {
	m := c.Sizes[0]
	for _, n := range c.Sizes {
		m = max(m, n)
	}
	return m
}

// selected reports whether the rule id runs, and why not.
func (c Config) selected(id string) (bool, string) {
	for _, s := range c.Skip {
		if s == id {
			if why := c.SkipReasons[id]; why != "" {
				return false, "listed in Config.Skip: " + why
			}
			return false, "listed in Config.Skip"
		}
	}
	if len(c.Only) == 0 {
		return true, ""
	}
	for _, s := range c.Only {
		if s == id {
			return true, ""
		}
	}
	return false, "not listed in Config.Only"
}
