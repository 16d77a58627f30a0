package config_test

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/bouncekv/bounce/config"
)

// Load layers the defaults, a YAML file, the environment and the flags the
// user set, and says where each value came from.
func ExampleLoad() {
	fs := pflag.NewFlagSet("bounce", pflag.ContinueOnError)
	config.RegisterFlags(fs)
	if err := fs.Parse([]string{"--bounce.max-inflight=16"}); err != nil {
		fmt.Println(err)
		return
	}
	l, err := config.Load(config.LoadOptions{
		File:    "testdata/example.yaml", // sets arena_size 512mb, max_inflight 4, ...
		Environ: []string{"BOUNCE_MAX_INFLIGHT=12", "BOUNCE_MAX_CHUNK=1GiB", "HOME=/root"},
		Flags:   fs,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, key := range []string{"agent.name", "bounce.arena_size", "bounce.max_inflight", "bounce.max_chunk", "bounce.granularity"} {
		fmt.Printf("%-20s from %s\n", key, l.Sources[key])
	}
	b := l.Config.Bounce
	fmt.Println(l.Config.Agent.Name, b.ArenaSize, b.MaxInflight, b.MaxChunk, b.Granularity, l.Config.Engine.Options)
	for _, n := range l.Notices {
		fmt.Fprintln(os.Stdout, "notice:", n)
	}
	// Output:
	// agent.name           from file:testdata/example.yaml
	// bounce.arena_size    from file:testdata/example.yaml
	// bounce.max_inflight  from flag:--bounce.max-inflight
	// bounce.max_chunk     from env:BOUNCE_MAX_CHUNK
	// bounce.granularity   from default
	// prefill-0 512MiB 16 512MiB 1MiB map[nodelay:true]
	// notice: bounce.max_chunk 1GiB exceeds the arena's usable capacity 512MiB (bounce.arena_size 512MiB, bounce.granularity 1MiB); clamped to 512MiB
}

// Bad input is refused with the key, the value, where it came from and what
// is accepted.
func ExampleLoad_errors() {
	_, err := config.Load(config.LoadOptions{Environ: []string{"BOUNCE_ARENA_SIZE=lots", "BOUNCE_MAX_INFLIGT=8"}})
	fmt.Println(err)
	// Output:
	// config: env:BOUNCE_MAX_INFLIGT="8": no setting has this environment variable (did you mean "BOUNCE_MAX_INFLIGHT"?); `bounce config --keys` lists every key's variable (bounce keys drop their section: BOUNCE_ARENA_SIZE)
	// config: bounce.arena_size="lots" (env:BOUNCE_ARENA_SIZE): want a number of bytes with an optional unit B, K/KB/KiB, M/MB/MiB, G/GB/GiB or T/TB/TiB (any case, powers of two; a decimal fraction when it makes whole bytes), e.g. 256MiB, 512mb, 1g, 2.5GiB, 64 KiB or 4096
}
