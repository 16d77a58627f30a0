package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/bouncekv/bounce/mem"
)

// writeFile writes a YAML file in a temporary directory and returns its path.
func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bounce.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// flags returns a registered flag set parsed from args.
func flags(t *testing.T, args ...string) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	return fs
}

func mustLoad(t *testing.T, o LoadOptions) *Loaded {
	t.Helper()
	l, err := Load(o)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return l
}

// keyErrors flattens a joined error into its *KeyErrors.
func keyErrors(err error) []*KeyError {
	var out []*KeyError
	var walk func(error)
	walk = func(e error) {
		if ke, ok := e.(*KeyError); ok {
			out = append(out, ke)
			return
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
		}
	}
	walk(err)
	return out
}

// findKeyError returns the *KeyError for key (or, for unknown environment
// variables, with that source), failing if there is none.
func findKeyError(t *testing.T, err error, key string, sentinel error) *KeyError {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one for %s", key)
	}
	for _, ke := range keyErrors(err) {
		if ke.Key == key || (ke.Key == "" && string(ke.Source) == key) {
			if !errors.Is(ke, sentinel) {
				t.Fatalf("%s: error %q is not %v", key, ke, sentinel)
			}
			return ke
		}
	}
	t.Fatalf("no error for %s in:\n%v", key, err)
	return nil
}

func TestKeysMatchTheDocumentedSet(t *testing.T) {
	block := func(b string) []string {
		var out []string
		for _, k := range []string{"path", "args", "env", "inherit_env", "checksum", "options", "max_restarts", "restart_backoff"} {
			out = append(out, b+"."+k)
		}
		return out
	}
	want := slices.Concat([]string{
		"agent.name",
		"bounce.enabled", "bounce.arena_size", "bounce.granularity", "bounce.max_chunk", "bounce.min_chunk", "bounce.max_inflight", "bounce.device_max_inflight",
		"bounce.copy_contexts", "bounce.copy_workers", "bounce.scatter_workers", "bounce.min_descriptors", "bounce.max_avg_descriptor",
		"bounce.request_timeout", "bounce.quarantine", "bounce.eager_gather", "bounce.zero_copy_args", "bounce.arena_memory", "bounce.cost_model", "bounce.disable_merging", "bounce.route", "bounce.pull_read",
		"engine.kind", "engine.plugin"}, block("engine.plugin"), []string{"engine.listen", "engine.connections",
		"engine.encryption", "engine.frame_timeout", "engine.max_pending_conns", "engine.options",
		"control_plane.kind", "control_plane.interface", "control_plane.bind_address", "control_plane.send_hwm", "control_plane.plugin"}, block("control_plane.plugin"),
		[]string{"stages.gather"}, block("stages.gather.plugin"), []string{"stages.scatter"}, block("stages.scatter.plugin"), []string{"stages.write"}, block("stages.write.plugin"),
		[]string{"stages.device", "stages.fallback",
			"telemetry.traces", "telemetry.otlp_endpoint", "telemetry.service_name", "telemetry.sample_ratio", "telemetry.metrics.listen",
			"log.level", "log.format",
			"security.mode", "security.key_file", "security.allowed_peers", "security.max_flows_per_peer",
			"security.want_rate", "security.want_burst", "security.max_control_peers",
			"security.max_control_conns_per_host", "security.max_control_conns", "security.max_message_size",
			"security.max_arena_share",
			"discovery.kind", "discovery.endpoints", "discovery.prefix", "discovery.lease", "discovery.dial_timeout",
			"discovery.username", "discovery.password_file", "discovery.tls_ca", "discovery.tls_cert", "discovery.tls_key", "discovery.insecure",
		})
	if got := Keys(); !slices.Equal(got, want) {
		t.Fatalf("Keys() =\n%v\nwant\n%v", got, want)
	}
	// Every key has a distinct variable and flag, and every field of Config
	// has exactly one key.
	envs, fls := map[string]string{}, map[string]string{}
	ptrs := map[any]string{}
	var c Config
	for _, f := range fields() {
		e, fl := EnvVar(f.key), FlagName(f.key)
		if !strings.HasPrefix(e, EnvPrefix) || envs[e] != "" || fls[fl] != "" || fl == "" {
			t.Fatalf("%s: env %q flag %q collide or are empty", f.key, e, fl)
		}
		envs[e], fls[fl] = f.key, f.key
		p := reflect.ValueOf(f.ptr(&c)).Pointer()
		if ptrs[p] != "" {
			t.Fatalf("%s and %s set the same field", f.key, ptrs[p])
		}
		ptrs[p] = f.key
	}
	n := 0
	for _, sec := range []any{c.Agent, c.Bounce, c.Engine, c.ControlPlane, c.Stages, c.Telemetry, c.Log, c.Security, c.Discovery} {
		n += reflect.TypeOf(sec).NumField()
	}
	if n != len(fields()) {
		t.Fatalf("Config has %d fields, schema %d keys", n, len(fields()))
	}
	// A plugin block's keys have their own distinct variables and flags.
	for _, s := range subKeys() {
		e, fl := EnvVar(s.key), FlagName(s.key)
		if !strings.HasPrefix(e, EnvPrefix) || envs[e] != "" || fls[fl] != "" || fl == "" {
			t.Fatalf("%s: env %q flag %q collide or are empty", s.key, e, fl)
		}
		envs[e], fls[fl] = s.key, s.key
	}
	for k, e := range map[string]string{
		"bounce.arena_size": "BOUNCE_ARENA_SIZE", "agent.name": "BOUNCE_AGENT_NAME", "control_plane.send_hwm": "BOUNCE_CONTROL_PLANE_SEND_HWM",
		"engine.options": "BOUNCE_ENGINE_OPTIONS", "bounce.enabled": "BOUNCE_ENABLED",
	} {
		if EnvVar(k) != e {
			t.Fatalf("EnvVar(%s) = %s, want %s", k, EnvVar(k), e)
		}
	}
	if FlagName("control_plane.send_hwm") != "control-plane.send-hwm" || EnvVar("nope") != "" || FlagName("nope") != "" {
		t.Fatal("flag naming")
	}
	fs := flags(t)
	for _, k := range want {
		if fs.Lookup(FlagName(k)) == nil {
			t.Fatalf("no flag for %s", k)
		}
	}
}

func TestDefaults(t *testing.T) {
	d := Default()
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	b := d.Bounce
	if !b.Enabled || b.ArenaSize != 256*MiB || b.Granularity != MiB || b.MaxChunk != 8*MiB || b.MinChunk != 0 || b.MaxInflight != 8 || b.DeviceMaxInflight != 32 ||
		b.CopyContexts != 8 || b.ScatterWorkers != 4 || b.MinDescriptors != 1024 || b.MaxAvgDescriptor != 16*KiB ||
		b.RequestTimeout != 30*time.Second || !b.EagerGather || b.ZeroCopyArgs || b.DisableMerging {
		t.Fatalf("bounce defaults: %+v", b)
	}
	if d.Engine.Kind != "tcp" || d.Engine.Connections != 4 || d.ControlPlane.Kind != "zmq" || d.ControlPlane.SendHWM != 1000 ||
		d.Stages.Gather.Kind != "host" || d.Stages.Scatter.Kind != "host" || d.Stages.Write.Kind != "engine" || d.Telemetry.Traces != "none" ||
		d.Telemetry.OTLPEndpoint != "" || d.Telemetry.ServiceName != "" || d.Telemetry.MetricsListen != "" || d.Telemetry.SampleRatio != 1 {
		t.Fatalf("defaults: %+v", d)
	}
	if !strings.HasSuffix(d.Agent.Name, "-"+strconv.Itoa(os.Getpid())) {
		t.Fatalf("agent name %q does not end in the pid", d.Agent.Name)
	}
	if Default().Agent.Name != d.Agent.Name {
		t.Fatal("default agent name is not deterministic")
	}

	l := mustLoad(t, LoadOptions{})
	if !reflect.DeepEqual(l.Config, d) {
		t.Fatalf("Load with no layers:\n%+v\nwant\n%+v", l.Config, d)
	}
	if len(l.Notices) != 0 || len(l.Sources) != len(Keys()) {
		t.Fatalf("notices %v, %d sources", l.Notices, len(l.Sources))
	}
	for k, s := range l.Sources {
		if s != SourceDefault {
			t.Fatalf("%s from %s", k, s)
		}
	}
}

func TestPrecedence(t *testing.T) {
	path := writeFile(t, `
bounce:
  arena_size: 512mb     # file only
  max_inflight: 2       # file, env
  copy_contexts: 3      # file, env, flag
  scatter_workers: 5    # file, flag
engine:
  connections: 7
`)
	env := []string{
		"BOUNCE_MAX_INFLIGHT=12",
		"BOUNCE_COPY_CONTEXTS=13",
		"BOUNCE_MIN_DESCRIPTORS=64", // env only
		"BOUNCE_REQUEST_TIMEOUT=5s", // env, flag
		"PATH=/usr/bin",             // not ours
		"BOUNCEX=1",                 // not our prefix
		"bounce_arena_size=1",       // prefixes are case-sensitive
	}
	fs := flags(t, "--bounce.copy-contexts=23", "--bounce.scatter-workers", "25", "--bounce.request-timeout=750ms",
		"--bounce.granularity=64KiB") // flag only
	l := mustLoad(t, LoadOptions{File: path, Environ: env, Flags: fs})

	file := Source("file:" + path)
	want := []struct {
		key string
		got any
		val any
		src Source
	}{
		{"bounce.arena_size", l.Config.Bounce.ArenaSize, 512 * MiB, file},
		{"bounce.max_inflight", l.Config.Bounce.MaxInflight, 12, "env:BOUNCE_MAX_INFLIGHT"},
		{"bounce.copy_contexts", l.Config.Bounce.CopyContexts, 23, "flag:--bounce.copy-contexts"},
		{"bounce.scatter_workers", l.Config.Bounce.ScatterWorkers, 25, "flag:--bounce.scatter-workers"},
		{"bounce.min_descriptors", l.Config.Bounce.MinDescriptors, 64, "env:BOUNCE_MIN_DESCRIPTORS"},
		{"bounce.request_timeout", l.Config.Bounce.RequestTimeout, 750 * time.Millisecond, "flag:--bounce.request-timeout"},
		{"bounce.granularity", l.Config.Bounce.Granularity, 64 * KiB, "flag:--bounce.granularity"},
		{"engine.connections", l.Config.Engine.Connections, 7, file},
		{"bounce.max_chunk", l.Config.Bounce.MaxChunk, 8 * MiB, SourceDefault},
		{"engine.kind", l.Config.Engine.Kind, "tcp", SourceDefault},
	}
	for _, w := range want {
		if !reflect.DeepEqual(w.got, w.val) || l.Sources[w.key] != w.src {
			t.Errorf("%s = %v from %q; want %v from %q", w.key, w.got, l.Sources[w.key], w.val, w.src)
		}
	}
	n := 0
	for _, s := range l.Sources {
		if s != SourceDefault {
			n++
		}
	}
	if n != 8 {
		t.Fatalf("%d keys not from defaults, want 8: %v", n, l.Sources)
	}
	// Flags the user did not set leave lower layers alone even though every
	// flag has a default.
	l = mustLoad(t, LoadOptions{File: path, Flags: flags(t)})
	if l.Config.Bounce.MaxInflight != 2 || l.Sources["bounce.max_inflight"] != file {
		t.Fatalf("unset flag overrode the file: %d from %s", l.Config.Bounce.MaxInflight, l.Sources["bounce.max_inflight"])
	}
}

func TestEveryKindThroughEveryLayer(t *testing.T) {
	path := writeFile(t, `
agent: {name: n1}
bounce: {enabled: false, arena_size: 1073741824, max_avg_descriptor: "64 KiB", request_timeout: 1m30s}
telemetry: {sample_ratio: 0.25, traces: otlp}
control_plane: {bind_address: "::1"}
`)
	l := mustLoad(t, LoadOptions{File: path})
	c := l.Config
	if c.Agent.Name != "n1" || c.Bounce.Enabled || c.Bounce.ArenaSize != GiB || c.Bounce.MaxAvgDescriptor != 64*KiB ||
		c.Bounce.RequestTimeout != 90*time.Second || c.Telemetry.SampleRatio != 0.25 || c.Telemetry.Traces != "otlp" || c.ControlPlane.BindAddress != "::1" {
		t.Fatalf("file: %+v", c)
	}
	env := []string{"BOUNCE_ENABLED=yes", "BOUNCE_ARENA_SIZE=2g", "BOUNCE_TELEMETRY_SAMPLE_RATIO=0.5", "BOUNCE_EAGER_GATHER=off", "BOUNCE_AGENT_NAME=n2"}
	c = mustLoad(t, LoadOptions{File: path, Environ: env}).Config
	if !c.Bounce.Enabled || c.Bounce.ArenaSize != 2*GiB || c.Telemetry.SampleRatio != 0.5 || c.Bounce.EagerGather || c.Agent.Name != "n2" {
		t.Fatalf("env: %+v", c)
	}
	fs := flags(t, "--bounce.enabled=false", "--bounce.disable-merging", "--bounce.arena-size", "4 GiB", "--telemetry.sample-ratio=1", "--agent.name=n3")
	c = mustLoad(t, LoadOptions{File: path, Environ: env, Flags: fs}).Config
	if c.Bounce.Enabled || !c.Bounce.DisableMerging || c.Bounce.ArenaSize != 4*GiB || c.Telemetry.SampleRatio != 1 || c.Agent.Name != "n3" {
		t.Fatalf("flags: %+v", c)
	}
}

func TestGarbageValuesNameKeyValueAndForms(t *testing.T) {
	cases := []struct {
		key, file, env, flag, value, forms string
	}{
		{"bounce.arena_size", "bounce: {arena_size: lots}", "BOUNCE_ARENA_SIZE=lots", "--bounce.arena-size=lots", "lots", "K/KB/KiB"},
		{"bounce.arena_size", "bounce: {arena_size: -5}", "BOUNCE_ARENA_SIZE=-5", "--bounce.arena-size=-5", "-5", "K/KB/KiB"},
		{"bounce.max_inflight", "bounce: {max_inflight: eight}", "BOUNCE_MAX_INFLIGHT=eight", "--bounce.max-inflight=eight", "eight", "whole number"},
		{"bounce.max_inflight", "bounce: {max_inflight: 2.5}", "BOUNCE_MAX_INFLIGHT=2.5", "--bounce.max-inflight=2.5", "2.5", "whole number"},
		{"bounce.enabled", "bounce: {enabled: maybe}", "BOUNCE_ENABLED=maybe", "--bounce.enabled=maybe", "maybe", "true or false"},
		{"bounce.request_timeout", "bounce: {request_timeout: 30}", "BOUNCE_REQUEST_TIMEOUT=30", "--bounce.request-timeout=30", "30", "Go duration"},
		{"telemetry.sample_ratio", "telemetry: {sample_ratio: half}", "BOUNCE_TELEMETRY_SAMPLE_RATIO=half", "--telemetry.sample-ratio=half", "half", "a number"},
		{"engine.options", "engine: {options: [a, b]}", "BOUNCE_ENGINE_OPTIONS=a", "--engine.options=a", "a", "k1=v1"},
		{"agent.name", "agent: {name: 12}", "", "", "12", "a string"},
		{"engine.options", "engine: {options: {a: {b: c}}}", "", "", "{a=map[b:c]}", "mapping of option names"},
	}
	for _, c := range cases {
		path := writeFile(t, c.file)
		_, err := Load(LoadOptions{File: path})
		ke := findKeyError(t, err, c.key, ErrBadValue)
		for _, part := range []string{c.key, c.value, c.forms, "file:" + path} {
			if !strings.Contains(ke.Error(), part) {
				t.Errorf("file %q: error %q lacks %q", c.file, ke, part)
			}
		}
		if c.env != "" {
			_, err = Load(LoadOptions{Environ: []string{c.env}})
			ke = findKeyError(t, err, c.key, ErrBadValue)
			name, _, _ := strings.Cut(c.env, "=")
			for _, part := range []string{c.key, c.value, c.forms, "env:" + name} {
				if !strings.Contains(ke.Error(), part) {
					t.Errorf("env %q: error %q lacks %q", c.env, ke, part)
				}
			}
		}
		if c.flag != "" {
			fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
			RegisterFlags(fs)
			err := fs.Parse([]string{c.flag})
			if err == nil {
				t.Fatalf("flag %s parsed", c.flag)
			}
			for _, part := range []string{c.key, c.value, c.forms} {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("flag %q: error %q lacks %q", c.flag, err, part)
				}
			}
		}
	}
}

func TestBadValueInAnOverriddenLayerIsStillAnError(t *testing.T) {
	path := writeFile(t, "bounce: {max_inflight: many}")
	_, err := Load(LoadOptions{File: path, Environ: []string{"BOUNCE_MAX_INFLIGHT=4"}})
	ke := findKeyError(t, err, "bounce.max_inflight", ErrBadValue)
	if ke.Source != Source("file:"+path) {
		t.Fatalf("source %q", ke.Source)
	}
}

func TestFlagValuesCheckedByLoadToo(t *testing.T) {
	// A flag set without RegisterFlags' checking (a plain string flag of the
	// same name) still cannot smuggle garbage past Load.
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.String("bounce.arena-size", "", "")
	fs.String("unrelated", "", "")
	if err := fs.Parse([]string{"--bounce.arena-size=huge", "--unrelated=whatever"}); err != nil {
		t.Fatal(err)
	}
	_, err := Load(LoadOptions{Flags: fs})
	ke := findKeyError(t, err, "bounce.arena_size", ErrBadValue)
	if ke.Source != "flag:--bounce.arena-size" || ke.Value != "huge" {
		t.Fatalf("%+v", ke)
	}
}

func TestUnknownKeysRejected(t *testing.T) {
	cases := []struct {
		file, key, hint string
	}{
		{"bounce: {arena_sz: 1GiB}", "bounce.arena_sz", "arena_size"},
		{"bouncer: {arena_size: 1GiB}", "bouncer", "control_plane"},
		{"bounce.arena_size: 1GiB", "bounce.arena_size", "nest keys"},
		{"Bounce: {arena_size: 1GiB}", "Bounce", "sections"},
		{"engine: {option: {a: b}}", "engine.option", "options"},
		{"telemetry: {otlp: {endpoint: x}}", "telemetry.otlp", "otlp_endpoint"},
	}
	for _, c := range cases {
		_, err := Load(LoadOptions{FileData: []byte(c.file)})
		ke := findKeyError(t, err, c.key, ErrUnknownKey)
		if !strings.Contains(ke.Error(), c.hint) || ke.Source != "file:inline" {
			t.Errorf("%q: error %q (source %q) lacks %q", c.file, ke, ke.Source, c.hint)
		}
	}
	_, err := Load(LoadOptions{Environ: []string{"BOUNCE_ARENA_SZ=1GiB", "BOUNCE_BOUNCE_ARENA_SIZE=1GiB"}})
	for _, name := range []string{"env:BOUNCE_ARENA_SZ", "env:BOUNCE_BOUNCE_ARENA_SIZE"} {
		ke := findKeyError(t, err, name, ErrUnknownKey)
		if !strings.Contains(ke.Error(), "1GiB") || !strings.Contains(ke.Error(), "BOUNCE_ARENA_SIZE") {
			t.Errorf("error %q does not show the value and the naming rule", ke)
		}
	}
}

func TestAllProblemsReportedTogether(t *testing.T) {
	_, err := Load(LoadOptions{
		FileData: []byte("bounce: {arena_size: lots, nope: 1}\nextra: {}\n"),
		Environ:  []string{"BOUNCE_MAX_INFLIGHT=x", "BOUNCE_WHAT=1"},
		Flags:    flags(t, "--engine.connections=9"),
	})
	if n := len(keyErrors(err)); n != 5 {
		t.Fatalf("%d problems reported, want 5:\n%v", n, err)
	}
}

func TestFileErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent.yaml")
	_, err := Load(LoadOptions{File: missing})
	if err == nil || !strings.Contains(err.Error(), missing) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	for _, text := range []string{"- a\n- b\n", "bounce: [\n", "bounce: {a: 1, a: 2}", "5", "bounce:\n\tarena_size: 1"} {
		if _, err := Load(LoadOptions{FileData: []byte(text)}); err == nil || !strings.Contains(err.Error(), "file:inline") {
			t.Errorf("YAML %q: error %v", text, err)
		}
	}
	// A section that is not a mapping, and a key with no value.
	_, err = Load(LoadOptions{FileData: []byte("bounce: 5")})
	findKeyError(t, err, "bounce", ErrBadValue)
	_, err = Load(LoadOptions{FileData: []byte("bounce:\n  arena_size:\n")})
	ke := findKeyError(t, err, "bounce.arena_size", ErrBadValue)
	if !strings.Contains(ke.Reason, "no value") {
		t.Fatalf("null value: %v", ke)
	}
	// Empty documents and empty sections are fine.
	for _, text := range []string{"", "# nothing\n", "bounce:\n", "bounce: {}\nengine:\n  options: {}\n"} {
		l, err := Load(LoadOptions{FileData: []byte(text)})
		if err != nil || !reflect.DeepEqual(l.Config, Default()) {
			t.Errorf("YAML %q: %v", text, err)
		}
	}
}

func TestMaxChunkClampedWithNotice(t *testing.T) {
	l := mustLoad(t, LoadOptions{FileData: []byte("bounce: {arena_size: 48MiB, granularity: 1MiB, max_chunk: 64MiB}")})
	if l.Config.Bounce.MaxChunk != 32*MiB {
		t.Fatalf("max_chunk %v, want 32MiB", l.Config.Bounce.MaxChunk)
	}
	if len(l.Notices) != 1 {
		t.Fatalf("notices %v", l.Notices)
	}
	for _, part := range []string{"bounce.max_chunk", "64MiB", "32MiB", "48MiB", "clamped"} {
		if !strings.Contains(l.Notices[0], part) {
			t.Fatalf("notice %q lacks %q", l.Notices[0], part)
		}
	}
	// Within capacity: untouched, no notice.
	l = mustLoad(t, LoadOptions{Environ: []string{"BOUNCE_MAX_CHUNK=256MiB"}})
	if l.Config.Bounce.MaxChunk != 256*MiB || len(l.Notices) != 0 {
		t.Fatalf("max_chunk %v, notices %v", l.Config.Bounce.MaxChunk, l.Notices)
	}
	// Validate on a hand-built config refuses what Load would clamp;
	// Normalize fixes it once.
	c := Default()
	c.Bounce.MaxChunk = 512 * MiB
	findKeyError(t, c.Validate(), "bounce.max_chunk", ErrOutOfRange)
	if n := c.Normalize(); len(n) != 1 || c.Bounce.MaxChunk != 256*MiB {
		t.Fatalf("Normalize: %v, %v", n, c.Bounce.MaxChunk)
	}
	if n := c.Normalize(); n != nil || c.Validate() != nil {
		t.Fatalf("second Normalize: %v, %v", n, c.Validate())
	}
}

func TestUsableCapacity(t *testing.T) {
	cases := []struct{ arena, gran, want Size }{
		{256 * MiB, MiB, 256 * MiB}, {48 * MiB, MiB, 32 * MiB}, {MiB, MiB, MiB}, {MiB + 1, MiB, MiB},
		{3 * KiB, KiB, 2 * KiB}, {MiB, 2 * MiB, 0}, {MiB, 3 * KiB, 0}, {MiB, 0, 0}, {0, MiB, 0},
		{1 << 63, 1, 1 << 63}, {1<<64 - 1, 1, 1 << 63},
	}
	for _, c := range cases {
		b := BounceConfig{ArenaSize: c.arena, Granularity: c.gran}
		if got := b.UsableCapacity(); got != c.want {
			t.Errorf("UsableCapacity(%v, %v) = %v, want %v", c.arena, c.gran, got, c.want)
		}
	}
}

func TestValidateRanges(t *testing.T) {
	cases := []struct {
		key    string
		mutate func(*Config)
		value  string
		says   string
	}{
		{"agent.name", func(c *Config) { c.Agent.Name = "" }, "", "empty"},
		{"agent.name", func(c *Config) { c.Agent.Name = "a b" }, "a b", "spaces"},
		{"agent.name", func(c *Config) { c.Agent.Name = "a\x1fb" }, "a\x1fb", "control"},
		{"agent.name", func(c *Config) { c.Agent.Name = strings.Repeat("n", 256) }, "", "255"},
		{"bounce.arena_size", func(c *Config) { c.Bounce.ArenaSize = 0 }, "0B", "positive"},
		{"bounce.granularity", func(c *Config) { c.Bounce.Granularity = 3 * KiB }, "3KiB", "power of two"},
		{"bounce.granularity", func(c *Config) { c.Bounce.Granularity = 512 * MiB }, "512MiB", "arena_size"},
		{"bounce.max_chunk", func(c *Config) { c.Bounce.MaxChunk = 0 }, "0B", "positive"},
		{"bounce.max_inflight", func(c *Config) { c.Bounce.MaxInflight = 0 }, "0", "between 1 and 1024"},
		{"bounce.max_inflight", func(c *Config) { c.Bounce.MaxInflight = 1025 }, "1025", "between 1 and 1024"},
		{"bounce.device_max_inflight", func(c *Config) { c.Bounce.DeviceMaxInflight = 0 }, "0", "between 1 and 1024"},
		{"bounce.copy_contexts", func(c *Config) { c.Bounce.CopyContexts = -1 }, "-1", "between 1 and 1024"},
		{"bounce.copy_workers", func(c *Config) { c.Bounce.CopyWorkers = 257 }, "257", "between 0 and 256"},
		{"bounce.min_chunk", func(c *Config) { c.Bounce.MinChunk = 1 }, "1B", "0 (off) or at least 64KiB"},
		{"bounce.min_chunk", func(c *Config) { c.Bounce.MinChunk = 16 * MiB }, "16MiB", "must not exceed bounce.max_chunk 8MiB"},
		{"bounce.route", func(c *Config) { c.Bounce.Route = "fast" }, "fast", "auto, bounce, direct"},
		{"bounce.pull_read", func(c *Config) { c.Bounce.PullRead = "always" }, "always", "auto, off"},
		{"log.level", func(c *Config) { c.Log.Level = "verbose" }, "verbose", "debug, info, warn, error"},
		{"log.format", func(c *Config) { c.Log.Format = "logfmt" }, "logfmt", "text, json"},
		{"bounce.scatter_workers", func(c *Config) { c.Bounce.ScatterWorkers = 0 }, "0", "between 1 and 1024"},
		{"bounce.min_descriptors", func(c *Config) { c.Bounce.MinDescriptors = -1 }, "-1", "negative"},
		{"bounce.max_avg_descriptor", func(c *Config) { c.Bounce.MaxAvgDescriptor = 0 }, "0B", "positive"},
		{"bounce.request_timeout", func(c *Config) { c.Bounce.RequestTimeout = 0 }, "0s", "1ms and 24h"},
		{"bounce.request_timeout", func(c *Config) { c.Bounce.RequestTimeout = 25 * time.Hour }, "25h0m0s", "1ms and 24h"},
		{"bounce.quarantine", func(c *Config) { c.Bounce.Quarantine = -time.Second }, "-1s", "0 (1 × request_timeout) or between 1ms and 24h"},
		{"bounce.quarantine", func(c *Config) { c.Bounce.Quarantine = time.Microsecond }, "1µs", "0 (1 × request_timeout) or between 1ms and 24h"},
		{"bounce.quarantine", func(c *Config) { c.Bounce.Quarantine = 25 * time.Hour }, "25h0m0s", "0 (1 × request_timeout) or between 1ms and 24h"},
		{"engine.kind", func(c *Config) { c.Engine.Kind = "rdma" }, "rdma", "loopback, tcp, ucx, nixl, cudacopy, plugin"},
		{"bounce.arena_memory", func(c *Config) { c.Bounce.ArenaMemory = "gpu" }, "gpu", "auto, device, pinned-host, host"},
		{"stages.fallback", func(c *Config) { c.Stages.Fallback = "cpu" }, "cpu", "host, refuse"},
		{"stages.device", func(c *Config) { c.Stages.Device = -1 }, "-1", "between 0 and 1023"},
		{"engine.plugin", func(c *Config) { c.Engine.Kind = "plugin" }, "", "required"},
		{"engine.plugin", func(c *Config) { c.Engine.Plugin.Path = "/x.so" }, "/x.so", "only used"},
		{"engine.plugin.checksum", func(c *Config) {
			c.Engine.Kind, c.Engine.Plugin.Path, c.Engine.Plugin.Checksum = "plugin", "/x", "md5:00"
		}, "md5:00", "sha256:<64 hex digits>"},
		{"engine.plugin.env", func(c *Config) {
			c.Engine.Kind, c.Engine.Plugin.Path, c.Engine.Plugin.Env = "plugin", "/x", []string{"NOVALUE"}
		}, "NOVALUE", "NAME=value"},
		{"engine.plugin.max_restarts", func(c *Config) { c.Engine.Kind, c.Engine.Plugin.Path, c.Engine.Plugin.MaxRestarts = "plugin", "/x", -1 }, "-1", "between 0 and 100"},
		{"engine.listen", func(c *Config) { c.Engine.Listen = "" }, "", "host:port"},
		{"engine.listen", func(c *Config) { c.Engine.Listen = "127.0.0.1:99999" }, "127.0.0.1:99999", "0 to 65535"},
		{"engine.connections", func(c *Config) { c.Engine.Connections = 0 }, "0", "between 1 and 256"},
		{"engine.options", func(c *Config) { c.Engine.Options = map[string]string{"": "x"} }, "", "empty"},
		{"control_plane.kind", func(c *Config) { c.ControlPlane.Kind = "tcp" }, "tcp", "zmq, nixlnotif, inproc, plugin"},
		{"control_plane.plugin", func(c *Config) { c.ControlPlane.Kind = "plugin" }, "", "required"},
		{"control_plane.interface", func(c *Config) { c.ControlPlane.Interface = "eth0/1" }, "eth0/1", "interface name"},
		{"control_plane.bind_address", func(c *Config) { c.ControlPlane.BindAddress = "localhost" }, "localhost", "IP address"},
		{"control_plane.bind_address", func(c *Config) { c.ControlPlane.BindAddress, c.ControlPlane.Interface = "10.0.0.1", "eth0" }, "10.0.0.1", "only one"},
		{"control_plane.send_hwm", func(c *Config) { c.ControlPlane.SendHWM = 0 }, "0", "between 1 and 1048576"},
		{"stages.gather", func(c *Config) { c.Stages.Gather.Kind = "gpu" }, "gpu", "host, cuda, plugin"},
		{"stages.scatter", func(c *Config) { c.Stages.Scatter.Kind = "" }, "", "host, cuda, plugin"},
		{"stages.write", func(c *Config) { c.Stages.Write.Kind = "host" }, "host", "engine, plugin"},
		{"stages.scatter", func(c *Config) { c.Stages.Scatter.Kind = "plugin" }, "plugin", "{plugin: {path:"},
		{"stages.gather.plugin", func(c *Config) { c.Stages.Gather.Plugin.Path = "/s.so" }, "/s.so", "only used"},
		{"telemetry.traces", func(c *Config) { c.Telemetry.Traces = "jaeger" }, "jaeger", "none, otlp, stdout"},
		{"telemetry.otlp_endpoint", func(c *Config) { c.Telemetry.OTLPEndpoint = "collector" }, "collector", "host:port"},
		{"telemetry.metrics.listen", func(c *Config) { c.Telemetry.MetricsListen = "localhost" }, "localhost", "host:port"},
		{"telemetry.service_name", func(c *Config) { c.Telemetry.ServiceName = "a\nb" }, "a\nb", "control characters"},
		{"telemetry.sample_ratio", func(c *Config) { c.Telemetry.SampleRatio = 1.5 }, "1.5", "between 0 and 1"},
		{"security.mode", func(c *Config) { c.Security.Mode = "trust" }, "trust", "authenticate, off"},
		{"security.max_flows_per_peer", func(c *Config) { c.Security.MaxFlowsPerPeer = 0 }, "0", "between 1 and"},
		{"security.max_message_size", func(c *Config) { c.Security.MaxMessageSize = 1 }, "1B", "between 64KiB and 1GiB"},
		{"security.max_arena_share", func(c *Config) { c.Security.MaxArenaShare = 0 }, "0", "above 0 and at most 1"},
		{"engine.encryption", func(c *Config) { c.Engine.Encryption = "maybe" }, "maybe", "off, on"},
		{"engine.frame_timeout", func(c *Config) { c.Engine.FrameTimeout = 0 }, "0s", "between 1ms and 1h"},
		{"telemetry.sample_ratio", func(c *Config) { c.Telemetry.SampleRatio = -0.1 }, "-0.1", "between 0 and 1"},
	}
	for _, c := range cases {
		cfg := Default()
		c.mutate(&cfg)
		err := cfg.Validate()
		ke := findKeyError(t, err, c.key, ErrOutOfRange)
		if len(keyErrors(err)) != 1 {
			t.Errorf("%s: %d errors: %v", c.key, len(keyErrors(err)), err)
		}
		if (c.value != "" && ke.Value != c.value) || !strings.Contains(ke.Error(), c.says) || !strings.Contains(ke.Error(), c.key) {
			t.Errorf("%s: error %q (value %q), want value %q and %q", c.key, ke, ke.Value, c.value, c.says)
		}
		// The section's own Validate reports the same problem.
		section := map[string]func() error{
			"agent": cfg.Agent.Validate, "bounce": cfg.Bounce.Validate, "engine": cfg.Engine.Validate,
			"control_plane": cfg.ControlPlane.Validate, "stages": cfg.Stages.Validate, "telemetry": cfg.Telemetry.Validate,
			"log":      cfg.Log.Validate,
			"security": cfg.Security.Validate,
		}
		s, _ := splitKey(c.key)
		findKeyError(t, section[s](), c.key, ErrOutOfRange)
	}
	// NaN is out of range too (every comparison with it is false).
	if _, err := Load(LoadOptions{FileData: []byte("telemetry: {sample_ratio: .nan}")}); err == nil {
		t.Fatal("NaN sample ratio accepted")
	}
}

func TestRangeErrorsFromLoadCarryTheirSource(t *testing.T) {
	_, err := Load(LoadOptions{Environ: []string{"BOUNCE_MAX_INFLIGHT=0"}, Flags: flags(t, "--engine.kind=rdma")})
	ke := findKeyError(t, err, "bounce.max_inflight", ErrOutOfRange)
	if ke.Source != "env:BOUNCE_MAX_INFLIGHT" || !strings.Contains(ke.Error(), `bounce.max_inflight="0" (env:BOUNCE_MAX_INFLIGHT): must be between 1 and 1024`) {
		t.Fatalf("%q", ke)
	}
	ke = findKeyError(t, err, "engine.kind", ErrOutOfRange)
	if ke.Source != "flag:--engine.kind" {
		t.Fatalf("%q", ke)
	}
}

func TestEngineOptions(t *testing.T) {
	path := writeFile(t, "engine:\n  options:\n    tls: rc\n    nodelay: true\n    depth: 16\n    ratio: 0.5\n    ucx.net: mlx5_0:1\n")
	env := []string{"BOUNCE_ENGINE_OPTIONS=depth=32,zcopy=1"}
	fs := flags(t, "--engine.options=tls=tcp", "--engine.options", "extra=x")
	l := mustLoad(t, LoadOptions{File: path, Environ: env, Flags: fs})
	want := map[string]string{"tls": "tcp", "nodelay": "true", "depth": "32", "ratio": "0.5", "ucx.net": "mlx5_0:1", "zcopy": "1", "extra": "x"}
	if !reflect.DeepEqual(l.Config.Engine.Options, want) {
		t.Fatalf("options %v, want %v", l.Config.Engine.Options, want)
	}
	file := Source("file:" + path)
	for k, src := range map[string]Source{
		"engine.options.tls": "flag:--engine.options", "engine.options.nodelay": file, "engine.options.depth": "env:BOUNCE_ENGINE_OPTIONS",
		"engine.options.ucx.net": file, "engine.options.extra": "flag:--engine.options", "engine.options": "flag:--engine.options",
	} {
		if l.Sources[k] != src {
			t.Errorf("%s from %q, want %q", k, l.Sources[k], src)
		}
	}
	for _, bad := range []string{"=1", "a", "a=1,,b=2"} {
		_, err := Load(LoadOptions{Environ: []string{"BOUNCE_ENGINE_OPTIONS=" + bad}})
		findKeyError(t, err, "engine.options", ErrBadValue)
	}
	_, err := Load(LoadOptions{FileData: []byte(`engine: {options: {"": x}}`)})
	findKeyError(t, err, "engine.options", ErrBadValue)
	if l := mustLoad(t, LoadOptions{Environ: []string{"BOUNCE_ENGINE_OPTIONS="}}); l.Config.Engine.Options != nil {
		t.Fatalf("empty options: %v", l.Config.Engine.Options)
	}
}

func TestYAMLRoundTrip(t *testing.T) {
	c := Default()
	c.Agent.Name = "decode-3"
	c.Bounce.Enabled = false
	c.Bounce.ArenaSize = 3 * GiB
	c.Bounce.Granularity = 64 * KiB
	c.Bounce.MaxChunk = 1536 * KiB
	c.Bounce.MaxAvgDescriptor = 1000
	c.Bounce.RequestTimeout = 1500 * time.Millisecond
	c.Bounce.DisableMerging = true
	c.Engine.Kind, c.Engine.Plugin.Path = "plugin", "/opt/engine.so"
	c.Engine.Plugin.Checksum = "sha256:" + strings.Repeat("ab", 32)
	c.Engine.Plugin.Env = []string{"A=1", "B=x=y"}
	c.Engine.Plugin.Args = []string{"--rails", "4"}
	c.Engine.Options = map[string]string{"yes": "no", "n": "12", "empty": "", "quote": `a "b"`, "colon": "a: b"}
	c.ControlPlane.BindAddress = "::1"
	c.Stages.Gather = PluginStage("/opt/stage.so")
	c.Stages.Write = PluginStage("/opt/writer")
	c.Stages.Write.Plugin.Options = map[string]string{"stripes": "4"}
	c.Stages.Write.Plugin.MaxRestarts = 0
	c.Telemetry.SampleRatio = 0.125
	c.Telemetry.ServiceName = "true" // a string that looks like a bool
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	text, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"arena_size: 3GiB", "max_chunk: 1536KiB", "max_avg_descriptor: 1000B", "request_timeout: 1.5s", `service_name: "true"`, "# shared region arena size"} {
		if !strings.Contains(string(text), want) {
			t.Errorf("YAML lacks %q:\n%s", want, text)
		}
	}
	l := mustLoad(t, LoadOptions{File: "effective.yaml", FileData: text})
	if !reflect.DeepEqual(l.Config, c) {
		t.Fatalf("round trip:\n%+v\nwant\n%+v\n%s", l.Config, c, text)
	}
	for _, k := range Keys() {
		if _, sub := findSubKey(k); sub {
			continue // a block's empty keys are not rendered
		}
		if l.Sources[k] != "file:effective.yaml" {
			t.Fatalf("%s from %s", k, l.Sources[k])
		}
	}
}

func TestRegisterFlagsHelp(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	RegisterFlags(fs)
	usage := fs.FlagUsages()
	for _, want := range []string{
		"--bounce.arena-size size", "(default 256MiB)", "--bounce.enabled", "--bounce.request-timeout duration", "(default 30s)",
		"--control-plane.send-hwm int", "--engine.options k=v,...", "--telemetry.sample-ratio float",
	} {
		if !strings.Contains(usage, want) {
			t.Errorf("usage lacks %q:\n%s", want, usage)
		}
	}
	if fl := fs.Lookup("bounce.enabled"); fl.NoOptDefVal != "true" {
		t.Fatal("bool flag needs a value")
	}
}

// telemetry.metrics.listen is a grouped key (three levels): it loads from
// every layer, and an unknown key inside the group is an error naming it.
func TestGroupedKeyThroughEveryLayer(t *testing.T) {
	path := writeFile(t, "telemetry:\n  metrics:\n    listen: 127.0.0.1:9464\n")
	if got := mustLoad(t, LoadOptions{File: path}).Config.Telemetry.MetricsListen; got != "127.0.0.1:9464" {
		t.Fatalf("file: metrics listen %q", got)
	}
	l := mustLoad(t, LoadOptions{File: path, Environ: []string{"BOUNCE_TELEMETRY_METRICS_LISTEN=127.0.0.1:9465"}})
	if got := l.Config.Telemetry.MetricsListen; got != "127.0.0.1:9465" || l.Sources["telemetry.metrics.listen"] != "env:BOUNCE_TELEMETRY_METRICS_LISTEN" {
		t.Fatalf("env: metrics listen %q from %q", got, l.Sources["telemetry.metrics.listen"])
	}
	fs := flags(t, "--telemetry.metrics.listen=[::1]:0")
	if got := mustLoad(t, LoadOptions{File: path, Flags: fs}).Config.Telemetry.MetricsListen; got != "[::1]:0" {
		t.Fatalf("flag: metrics listen %q", got)
	}
	// The rendered YAML nests the group and loads back.
	c := Default()
	c.Telemetry.MetricsListen = "127.0.0.1:9464"
	y, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(y), "\n  metrics:\n") || !strings.Contains(string(y), "\n    listen: 127.0.0.1:9464\n") {
		t.Fatalf("rendered YAML does not nest telemetry.metrics.listen:\n%s", y)
	}
	if got := mustLoad(t, LoadOptions{FileData: y}).Config.Telemetry.MetricsListen; got != "127.0.0.1:9464" {
		t.Fatalf("rendered YAML loads back metrics listen %q", got)
	}
	_, err = Load(LoadOptions{FileData: []byte("telemetry: {metrics: {port: 9}}")})
	if err == nil || !strings.Contains(err.Error(), "telemetry.metrics.port") || !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("unknown grouped key: %v", err)
	}
	_, err = Load(LoadOptions{FileData: []byte("telemetry: {metrics: {listen: nowhere}}")})
	if err == nil || !strings.Contains(err.Error(), "telemetry.metrics.listen") || !strings.Contains(err.Error(), "host:port") {
		t.Fatalf("bad grouped value: %v", err)
	}
}

func TestCheckMemory(t *testing.T) {
	b := Default().Bounce
	b.ArenaSize, b.Granularity = 1*GiB, 1*MiB
	roomy := mem.Budget{Bytes: 4 << 30, MemAvailable: 4 << 30}
	if err := b.CheckMemory(roomy); err != nil {
		t.Fatalf("1GiB in 4GiB: %v", err)
	}
	tight := mem.Budget{Bytes: 1<<30 + 1<<20, MemAvailable: 8 << 30, CgroupLimit: 2 << 30, CgroupUsage: 1<<30 - 1<<20, Cgroup: "/sys/fs/cgroup/memory.max"}
	err := b.CheckMemory(tight)
	var ke *KeyError
	if !errors.As(err, &ke) || ke.Key != "bounce.arena_size" || ke.Value != "1GiB" || !errors.Is(err, ErrOutOfRange) ||
		!strings.Contains(err.Error(), "cgroup /sys/fs/cgroup/memory.max limit") {
		t.Fatalf("1GiB with 1GiB+1MiB left under the cgroup: %v", err)
	}
	if err := b.CheckMemory(mem.Budget{}); err != nil {
		t.Fatalf("unknown budget: %v", err)
	}
	b.ArenaMemory = "device"
	if err := b.CheckMemory(tight); err != nil {
		t.Fatalf("a device arena is not host memory: %v", err)
	}
	b.ArenaMemory = "host"
	b.Enabled = false
	if err := b.CheckMemory(tight); err != nil {
		t.Fatalf("bounce off maps no arena: %v", err)
	}
}
