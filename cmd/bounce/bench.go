package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
	"golang.org/x/term"

	"github.com/bouncekv/bounce/benchreport"
	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/driver"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/transfer"
	"github.com/bouncekv/bounce/workload"
)

// benchOptions are the flags of `bounce bench`.
type benchOptions struct {
	workloads   []string
	workloadSet bool // --workload was given (not its default)
	all, list   bool
	descSize    string
	count       int
	concurrency []int
	generations int
	routes      []string
	layout      string
	forms       []string
	repeat      int
	seed        uint64
	jsonPath    string
	plotsDir    string
	verify      bool
	notVerified string // why cells are not verified when verify is off ("" = --verify=false)
	maxBytes    string
	cellTimeout time.Duration
	peer        string // a remote receiver's descriptor line ('bounce serve')
	duration    time.Duration
	fleet       fleetFlags // --senders N --receivers M: the fleet benchmark (fleet.go)
	memory      memoryFlag
}

// benchGroup is one workload shape at one concurrency: the routes and
// iterations of a group are measured back to back.
type benchGroup struct {
	g    benchreport.Group
	spec workload.Spec // one request; Seed is set per iteration
}

// benchPlan is the resolved sweep.
type benchPlan struct {
	groups  []benchGroup
	routes  []string
	layouts []string
	forms   []string // the request forms; nil: descriptor lists, unlabelled
	repeat  int
	budget  uint64
	largest uint64 // the largest requests x bytes of any group
	notes   []string
}

func (p benchPlan) cells() int { return len(p.groups) * p.repeat * len(p.routes) }

// blockForm reports whether group g moves block tables on route r (bulk is
// one descriptor in either form).
func blockForm(g benchreport.Group, r string) bool {
	return g.Form == benchreport.FormBlocks && r != benchreport.RouteBulk
}

func newBenchCmd() *cobra.Command {
	var o benchOptions
	var layouts layoutsFlag
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Sweep workloads, concurrency and routes between two agent processes; table, JSON and plots",
		Long: `bench is the performance sweep. Like 'bounce run' it starts one receiver agent
as a child process ('bounce serve', its buffer sized for the largest cell) and
a sender agent in this process, with the configured engine and control plane
(tcp and zmq by default, on loopback unless configured otherwise). Then, for
every cell — workload preset x layout x concurrency x route x iteration — it
clears the receiver's buffer, moves the workload (concurrent requests
submitted at once; with --generations K a closed loop that keeps the
concurrency in flight for K x concurrency requests and reports latency over
the steady state), has the receiver verify every byte, and records the
throughput and every request's latency. One unrecorded warm-up transfer per
route runs first. --peer measures against a 'bounce serve' running elsewhere
instead: its descriptor line, or with discovery.kind etcd its agent name,
resolved and followed through etcd as 'bounce send' does.

Routes: bounce (gather, one bulk write per region, scatter), direct (one
engine post per descriptor), bulk (the same bytes as ONE contiguous
descriptor per request on the direct path: what the engine does with the
bytes at its best; with --memory device it writes them from a host buffer
into a host buffer, the host-memory bulk baseline beside the device
cells), auto (the agent decides), pull (the same workload the other way
round, decode-initiated: the receiver fills its buffer as the holder and
this agent pulls it into its own and verifies it here; the ratio pull/bounce
compares it with the push). With --memory device over tcp, direct
stages every descriptor through page-locked host buffers on each side (a
copy per descriptor: the baseline without bounce). Within each iteration the
routes run back to back, in an order rotated every iteration, so the
bounce/direct and bounce/bulk ratios are measured side by side; the table
reports the median ratio over iterations.

Forms: --form descs (the default) submits descriptor lists, as earlier runs
did; --form blocks submits block tables (pipeline.BlockRequest) over pools
registered on each side, one per request (at most 256 requests per cell);
--form blocks,descs runs both side by side: each iteration moves both forms'
routes back to back, both in the block-table layout of the preset (K and V
of every layer as regions, 512 ids per request at block 16; workload.Spec),
so the two forms move the same pieces between the same places, and the
ratios add <route>[blocks]/<route>[descs]. The block form needs the receiver
this command starts (not --peer).

Memory stays bounded by --max-bytes: a concurrency whose requests x bytes
exceed it is clamped to the largest that fits, or skipped, with a note; a
clamped cell is named with the level asked for. A value listed twice in
--workload, --routes, --concurrency or --desc-size is a usage error.
The TP=1 presets are 2.5 GiB per request. After the sweep both agents' peak
RSS (VmHWM) is reported next to their KV buffers and arena, and where a
request's time went: plan, WANT->GRANT, gather, write, DATA, the receiver's
scatter (carried back in its ACKs) and the rest of DATA->ACK. In the JSON
report each cell's verified is a boolean, with not_verified giving the
reason when the bytes were not checked (--verify=false, --peer).

With --senders N --receivers M it runs the fleet benchmark instead: M
receiver and N sender processes on this machine that find each other through
etcd (the cluster of discovery.kind etcd, else one embedded in this process),
senders choosing receivers round robin or by a --seed pattern (--pattern),
--sender-requests each, all at once (--duration: again and again for that
long). It reports each sender's throughput into each receiver, per-receiver
fairness (max/min across its senders), request latency percentiles, and has
every receiver verify every byte (--json writes it all).`,
		Example: `  bounce bench
  bounce bench --workload llama70b-tp8-b16 --count 4096 --concurrency 1,8,64,128 --routes bounce,direct,bulk
  bounce bench --all --layout both --repeat 3 --json bench.json --plots bench-plots
  bounce bench --count 4096 --concurrency 128 --generations 3 --routes bounce,direct,bulk --max-bytes 7GiB
  bounce bench --engine.kind ucx --bounce.arena-size 32MiB --workload llama70b-tp8-b16 --routes bounce
  bounce bench --peer recv.json --engine.listen 10.0.0.1:0 --control-plane.interface eth0 --routes bounce,direct,bulk
  bounce bench --discovery.kind etcd --discovery.insecure --agent.name prefill-1 --peer decode-0 --routes bounce,direct
  bounce bench --desc-size 512B..64KiB --concurrency 1,8 --routes bounce,direct --plots sweep
  bounce bench --workload llama70b-tp8-b16,gptoss120b-tp8-b16 --form blocks,descs --routes bounce,direct,bulk
  bounce bench --senders 4 --receivers 2
  bounce bench --senders 8 --receivers 2 --pattern seeded --count 1024 --desc-size 4KiB --duration 10s
  bounce bench --list`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.list {
				return listPresets(cmd.OutOrStdout())
			}
			l, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			if err := o.memory.check(); err != nil {
				return err
			}
			o.memory.apply(&l.Config, cmd.ErrOrStderr())
			if o.fleet.on() && o.memory.kind == memoryDevice {
				return usage(fmt.Errorf("--memory device: not yet with --senders/--receivers (the fleet benchmark moves host memory)"))
			}
			if layouts.preset != "" {
				return benchLayouts(cmd, l.Config, &o, layouts)
			}
			o.workloadSet = cmd.Flags().Changed("workload")
			if o.fleet.on() {
				return runFleet(cmd, l.Config, &o)
			}
			plan, err := o.plan()
			if err != nil {
				return err
			}
			return o.run(cmd, l.Config, plan)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.workloads, "workload", []string{"gptoss120b-tp8-b16", "llama70b-tp8-b16"}, "workload presets, repeatable or comma-separated, each named once (see --list)")
	f.BoolVar(&o.all, "all", false, "every preset (the TP=1 ones are 2.5 GiB per request; see --max-bytes)")
	f.BoolVar(&o.list, "list", false, "list the workload presets and exit")
	f.StringVar(&o.descSize, "desc-size", "", "override every preset's descriptor size (e.g. 4KiB), or sweep sizes: a list (2KiB,16KiB) or a range doubling from its low end (512B..64KiB); a sweep keeps each preset's bytes")
	f.IntVar(&o.count, "count", 0, "override every preset's descriptor count (e.g. 4096)")
	f.IntSliceVar(&o.concurrency, "concurrency", []int{1, 8}, "concurrent requests per cell, a list, each level once (the GUIDE sweeps 1,8,64,128)")
	f.IntVar(&o.generations, "generations", 1, "1: a burst, every request of a cell submitted at once; K > 1: a closed loop moving K x concurrency requests with concurrency in flight (a new one as each finishes), latency percentiles over the requests after the first generation")
	f.StringSliceVar(&o.routes, "routes", []string{benchreport.RouteBounce, benchreport.RouteDirect}, "routes to compare, each named once: bounce, direct, bulk, auto, pull (the receiver pulls the same workload; ratio pull/bounce)")
	f.StringVar(&o.layout, "layout", "fragmented", "block layout: fragmented, contiguous or both")
	f.StringSliceVar(&o.forms, "form", []string{benchreport.FormDescs}, "request forms, each named once: descs (descriptor lists), blocks (block tables over registered pools); blocks,descs compares them side by side")
	f.IntVar(&o.repeat, "repeat", 3, "iterations per cell (routes alternate within each)")
	f.Uint64Var(&o.seed, "seed", 1, "seed for the block layouts and byte patterns (the sweep is reproducible from it)")
	f.StringVar(&o.jsonPath, "json", "", "write the full results as JSON to this file")
	f.StringVar(&o.plotsDir, "plots", "", "write PNG plots into this directory")
	f.BoolVar(&o.verify, "verify", true, "have the receiver verify every cell's bytes (--verify=false to skip)")
	f.StringVar(&o.maxBytes, "max-bytes", "3GiB", "budget for one cell's requests x bytes (each side holds one such buffer)")
	f.DurationVar(&o.cellTimeout, "cell-timeout", 10*time.Minute, "give up on a cell's requests after this long")
	f.DurationVar(&o.duration, "duration", 0, "run each cell for at least this long (its workload moved again and again, every round counted) instead of once")
	o.memory.add(cmd)
	f.StringVar(&o.peer, "peer", "", `benchmark against a 'bounce serve' running elsewhere: its descriptor line (a file, or "-" for stdin), or with discovery.kind etcd its agent name; its bytes are not verified (run 'bounce serve --expect' with 'bounce send' for that)`)
	o.fleet.add(f)
	layouts.add(cmd)
	configFlags(cmd)
	return cmd
}

// listPresets prints the sizing table.
func listPresets(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "preset\tmodel\tTP\tblock\tdescriptor\tcount\tbytes\tblock table (--form blocks)")
	for _, p := range workload.Presets() {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%d\t%s\t%d regions x %d ids\n", p.Name, p.Model, p.TP, p.Block, benchreport.FormatSize(p.DescSize), p.Count, benchreport.FormatSize(p.Bytes()), p.Regions(), p.IDs())
	}
	return tw.Flush()
}

// plan resolves the flags into the sweep; bad flags are usage errors.
func (o *benchOptions) plan() (benchPlan, error) {
	p := benchPlan{repeat: o.repeat}
	budget, err := parseSize(o.maxBytes)
	if err != nil {
		return p, usage(fmt.Errorf("--max-bytes: %w", err))
	}
	p.budget = budget
	if o.repeat < 1 {
		return p, usage(fmt.Errorf("--repeat %d: must be at least 1", o.repeat))
	}
	if o.generations < 1 || o.generations > maxGenerations {
		return p, usage(fmt.Errorf("--generations %d: accepted: 1..%d", o.generations, maxGenerations))
	}
	if o.duration < 0 || (o.duration > 0 && o.duration >= o.cellTimeout) {
		return p, usage(fmt.Errorf("--duration %v: accepted: 0 (off) or positive and below --cell-timeout %v", o.duration, o.cellTimeout))
	}
	if o.cellTimeout <= 0 {
		return p, usage(fmt.Errorf("--cell-timeout %v: must be positive", o.cellTimeout))
	}
	switch o.layout {
	case "fragmented", "contiguous":
		p.layouts = []string{o.layout}
	case "both":
		p.layouts = []string{"fragmented", "contiguous"}
	default:
		return p, usage(fmt.Errorf("--layout %q: accepted: fragmented, contiguous, both", o.layout))
	}
	for _, f := range o.forms {
		f = strings.TrimSpace(f)
		switch f {
		case benchreport.FormDescs, benchreport.FormBlocks:
		default:
			return p, usage(fmt.Errorf("--form %q: accepted: descs, blocks", f))
		}
		if slices.Contains(p.forms, f) {
			return p, usage(fmt.Errorf("--form %q is listed twice: name each form once", f))
		}
		p.forms = append(p.forms, f)
	}
	if !slices.Contains(p.forms, benchreport.FormBlocks) {
		p.forms = nil // descriptor lists in the descriptor layout, as before --form
	} else if o.peer != "" {
		return p, usage(fmt.Errorf("--form blocks: the block-table form needs the receiver this command starts (it registers the destination pools), not --peer"))
	}
	for _, r := range o.routes {
		r = strings.TrimSpace(r)
		switch r {
		case benchreport.RouteBounce, benchreport.RouteDirect, benchreport.RouteBulk, benchreport.RouteAuto, benchreport.RoutePull:
		default:
			return p, usage(fmt.Errorf("--routes %q: accepted: bounce, direct, bulk, auto, pull", r))
		}
		if slices.Contains(p.routes, r) {
			return p, usage(fmt.Errorf("--routes %q is listed twice: name each route once", r))
		}
		if r == benchreport.RoutePull && o.peer != "" {
			return p, usage(fmt.Errorf("--routes pull: the pull route needs the receiver this command starts (it fills its buffer as the holder), not --peer"))
		}
		p.routes = append(p.routes, r)
	}
	if len(p.routes) == 0 {
		return p, usage(fmt.Errorf("--routes: name at least one of bounce, direct, bulk, auto, pull"))
	}
	var conc []int
	for _, c := range o.concurrency {
		if c < 1 || c > maxConcurrency {
			return p, usage(fmt.Errorf("--concurrency %d: accepted: 1..%d", c, maxConcurrency))
		}
		if slices.Contains(conc, c) {
			return p, usage(fmt.Errorf("--concurrency %d is listed twice: name each level once", c))
		}
		conc = append(conc, c)
	}
	if len(conc) == 0 {
		return p, usage(fmt.Errorf("--concurrency: name at least one level"))
	}
	slices.Sort(conc)
	var presets []workload.Preset
	if o.all && o.workloadSet {
		return p, usage(fmt.Errorf("--all and --workload %s: --all runs every preset; name presets with --workload, or pass --all alone", strings.Join(o.workloads, ",")))
	}
	if o.all {
		presets = workload.Presets()
		p.notes = append(p.notes, fmt.Sprintf("--all includes the TP=1 presets, 2.5GiB per request: requests x bytes are capped at --max-bytes %s", benchreport.FormatSize(budget)))
	} else {
		if len(o.workloads) == 0 {
			return p, usage(fmt.Errorf("--workload: name at least one preset (or --all)"))
		}
		for _, name := range o.workloads {
			pr, err := workload.Lookup(strings.TrimSpace(name))
			if err != nil {
				return p, usage(fmt.Errorf("--workload: %w", err))
			}
			if slices.ContainsFunc(presets, func(q workload.Preset) bool { return q.Name == pr.Name }) {
				return p, usage(fmt.Errorf("--workload %q is listed twice (as preset %s): name each preset once", strings.TrimSpace(name), pr.Name))
			}
			presets = append(presets, pr)
		}
	}
	var descSizes []uint64 // nil: each preset's own
	if o.descSize != "" {
		if descSizes, err = parseSizeSweep(o.descSize); err != nil {
			return p, usage(fmt.Errorf("--desc-size: %w", err))
		}
		if len(descSizes) > 1 && o.count == 0 {
			p.notes = append(p.notes, "--desc-size sweep: each size moves its preset's bytes (count = preset bytes / size), so the sizes compare the same bytes")
		}
	}
	if o.count < 0 {
		return p, usage(fmt.Errorf("--count %d: must be positive", o.count))
	}
	type shape struct {
		pr   workload.Preset
		spec workload.Spec
	}
	var shapes []shape
	for _, pr := range presets {
		spec := workload.Spec{DescSize: pr.DescSize, Count: pr.Count, Seed: o.seed}
		if len(descSizes) == 0 {
			if o.count != 0 {
				spec.Count = o.count
			}
			shapes = append(shapes, shape{pr, spec})
			continue
		}
		for _, ds := range descSizes {
			s := spec
			s.DescSize = ds
			switch {
			case o.count != 0:
				s.Count = o.count
			case len(descSizes) > 1:
				s.Count = int(max(1, pr.Bytes()/ds))
			}
			shapes = append(shapes, shape{pr, s})
		}
	}
	for _, sh := range shapes {
		pr, spec := sh.pr, sh.spec
		label := pr.Name // what the notes call this shape
		if len(descSizes) > 1 {
			label = fmt.Sprintf("%s at %s descriptors", pr.Name, benchreport.FormatSize(spec.DescSize))
		}
		per := spec.Bytes()
		if per > budget {
			p.notes = append(p.notes, fmt.Sprintf("skipped %s: one request of %s exceeds --max-bytes %s", label, benchreport.FormatSize(per), benchreport.FormatSize(budget)))
			continue
		}
		gens := uint64(o.generations)
		var levels []int
		asked := map[int]int{} // a clamped level and the one asked for
		for _, c := range conc {
			if gens*uint64(c)*per <= budget {
				levels = append(levels, c)
				continue
			}
			fit := int(budget / (gens * per))
			if fit == 0 || slices.Contains(levels, fit) {
				p.notes = append(p.notes, fmt.Sprintf("skipped %s at concurrency %d: %d x %s exceeds --max-bytes %s", label, c, int(gens)*c, benchreport.FormatSize(per), benchreport.FormatSize(budget)))
				continue
			}
			p.notes = append(p.notes, fmt.Sprintf("clamped %s from concurrency %d to %d: %d x %s exceeds --max-bytes %s", label, c, fit, int(gens)*c, benchreport.FormatSize(per), benchreport.FormatSize(budget)))
			levels = append(levels, fit)
			asked[fit] = c
		}
		forms := []string{""}
		if p.forms != nil {
			forms = p.forms
			spec.Regions = pr.Regions()
			if spec.Count%spec.Regions != 0 {
				p.notes = append(p.notes, fmt.Sprintf("skipped %s: %d pieces do not divide into its %d regions (the block-table layout --form blocks needs)", label, spec.Count, spec.Regions))
				continue
			}
		}
		for _, layout := range p.layouts {
			for _, c := range levels {
				for _, form := range forms {
					s := spec
					s.Fragmented = layout == "fragmented"
					g := benchreport.Group{Workload: pr.Name, DescSize: s.DescSize, Count: s.Count, Layout: layout, Form: form, Concurrency: c, AskedConcurrency: asked[c]}
					if o.generations > 1 {
						g.Generations = o.generations
					}
					if form == benchreport.FormBlocks && int(gens)*c > driver.MaxBlockRequests {
						p.notes = append(p.notes, fmt.Sprintf("skipped the block form of %s at concurrency %d: %d requests, at most %d in the block form (a pool per request)", label, c, int(gens)*c, driver.MaxBlockRequests))
						continue
					}
					p.groups = append(p.groups, benchGroup{g: g, spec: s})
					p.largest = max(p.largest, gens*uint64(c)*per)
				}
			}
		}
	}
	if len(p.groups) == 0 {
		return p, usage(fmt.Errorf("nothing to run: every workload exceeds --max-bytes %s", benchreport.FormatSize(budget)))
	}
	return p, nil
}

// routeSpec returns what route r moves for spec and how: bulk is the same
// bytes as one contiguous descriptor on the direct path.
func routeSpec(r string, spec workload.Spec) (workload.Spec, pipeline.Route) {
	switch r {
	case benchreport.RouteBounce, benchreport.RoutePull:
		return spec, pipeline.RouteBounce
	case benchreport.RouteDirect:
		return spec, pipeline.RouteDirect
	case benchreport.RouteBulk:
		return workload.Spec{DescSize: spec.Bytes(), Count: 1, Seed: spec.Seed}, pipeline.RouteDirect
	}
	return spec, pipeline.RouteAuto
}

// iterationSeed keeps every iteration's layouts and bytes distinct and
// reproducible; request i of a cell uses the seed plus i.
func iterationSeed(seed uint64, it int) uint64 { return seed + uint64(it)<<32 }

// maxConcurrency bounds --concurrency and maxGenerations --generations;
// request i of a cell uses seed+i, so iteration seeds must stay further apart
// than their product.
const (
	maxConcurrency = 4096
	maxGenerations = 64
)

// rotate returns routes starting at the it-th, so no route always runs first.
func rotate(routes []string, it int) []string {
	out := make([]string, len(routes))
	for i := range routes {
		out[i] = routes[(i+it)%len(routes)]
	}
	return out
}

func (o *benchOptions) run(cmd *cobra.Command, cfg config.Config, plan benchPlan) error {
	out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
	var childArgs []string
	var h hello
	var blob []byte
	if o.peer != "" {
		// Through etcd --peer is the receiver's agent name (resolved
		// when the session starts); otherwise its descriptor line.
		h.Name = o.peer
		if cfg.Discovery.Kind != "etcd" {
			var err error
			if h, blob, err = readHello(cmd.InOrStdin(), o.peer); err != nil {
				return usage(err)
			}
		}
		if o.verify {
			o.notVerified = fmt.Sprintf("the receiver %q runs elsewhere (--peer)", h.Name)
			plan.notes = append(plan.notes, fmt.Sprintf("--peer: the receiver %q runs elsewhere; its bytes are not verified (cells say verified false, not_verified %q)", h.Name, o.notVerified))
			o.verify = false
		}
	} else {
		cfg, childArgs = localPair(cmd, cfg)
		childArgs = append(childArgs, "--buffer-size="+config.Size(plan.largest).String(), o.memory.arg())
		if o.memory.kind == memoryDevice && slices.Contains(plan.routes, benchreport.RouteBulk) {
			// bulk on device KV: one bulk write of the same bytes from
			// a host buffer into a host buffer (what the bytes cost on
			// the engine from host memory), beside the device cells.
			childArgs = append(childArgs, "--host-bulk-buffer")
			plan.notes = append(plan.notes, "--memory device: the bulk route writes the same bytes as one descriptor from a host buffer into a host buffer (the host-memory bulk baseline); bounce and direct move device memory")
		}
	}
	if o.memory.kind == memoryDevice {
		plan.notes = append(plan.notes, "--memory device: sources and destinations are GPU memory (stages.device); the receiver verifies by copying each request back")
	}

	rep := &benchreport.Report{
		Schema:  benchreport.Schema,
		Started: time.Now().UTC(),
		Command: os.Args,
		Machine: benchreport.CurrentMachine(),
		Config: benchreport.Config{
			Engine: cfg.Engine.Kind, EngineOptions: cfg.Engine.Options, ControlPlane: cfg.ControlPlane.Kind, ArenaSize: uint64(cfg.Bounce.ArenaSize),
			MaxChunk: uint64(cfg.Bounce.MaxChunk), MinChunk: uint64(cfg.Bounce.MinChunk), CopyWorkers: cfg.Bounce.CopyWorkers, MaxInflight: cfg.Bounce.MaxInflight,
			Layouts: plan.layouts, Forms: plan.forms, Routes: plan.routes, Repeat: plan.repeat, Seed: o.seed, Verify: o.verify, MaxBytes: plan.budget,
			Count: o.count, Generations: o.generations,
		},
		Notes: slices.Clone(plan.notes),
	}
	rep.Bounce, _ = buildInfo()
	if eff, err := effectiveConfig(cfg); err != nil {
		rep.Notes = append(rep.Notes, "effective configuration not recorded: "+err.Error())
	} else {
		rep.EffectiveConfig = eff
	}
	if o.descSize != "" && !strings.Contains(o.descSize, "..") && !strings.Contains(o.descSize, ",") {
		rep.Config.DescSize = plan.groups[0].g.DescSize
	}
	for _, g := range plan.groups {
		if !slices.Contains(rep.Config.Workloads, g.g.Workload) {
			rep.Config.Workloads = append(rep.Config.Workloads, g.g.Workload)
		}
		if !slices.Contains(rep.Config.Concurrency, g.g.Concurrency) {
			rep.Config.Concurrency = append(rep.Config.Concurrency, g.g.Concurrency)
		}
	}
	slices.Sort(rep.Config.Concurrency)
	fmt.Fprintf(out, "bounce bench: engine %s, control plane %s, arena %s; %d workload(s) x %d layout(s), concurrency %v, routes %s, %d iteration(s): %d cells; buffers %s per side; %s/%s, %d CPUs\n",
		rep.Config.EngineLabel(), cfg.ControlPlane.Kind, benchreport.FormatSize(uint64(cfg.Bounce.ArenaSize)), len(rep.Config.Workloads), len(plan.layouts), rep.Config.Concurrency,
		strings.Join(plan.routes, ","), plan.repeat, plan.cells(), benchreport.FormatSize(plan.largest), rep.Machine.GOOS, rep.Machine.GOARCH, rep.Machine.NumCPU)
	// The plan's notes are the report's (rep.Notes): printed once, with it.

	var s *session
	var err error
	if o.peer != "" {
		s, err = remoteSession(cmd, cfg, o.peer, h, blob, plan.largest, o.memory)
		rep.Config.Peer = h.Name
	} else {
		s, err = startSession(cmd, cfg, childArgs, plan.largest, o.memory)
	}
	if err != nil {
		return err
	}
	rep.Config.BounceOn = true
	if on, why, _ := s.n.Agent.PeerRoute(s.tgt.Peer); !on {
		rep.Config.BounceOn = false
		note := fmt.Sprintf("the bounce path is unavailable (%s); bounce cells fail with that reason (the bounce route requires bounce; the auto route falls back, counted)", why)
		rep.Notes = append(rep.Notes, note)
		fmt.Fprintf(errw, "note: %s\n", note)
	}
	sweepErr := s.warmUp(cmd.Context(), plan.warmUps()...)
	if sweepErr == nil {
		rep.Cells, sweepErr = o.sweep(cmd, s, plan)
	}
	if m, err := s.memory(plan, uint64(cfg.Bounce.ArenaSize)); err != nil {
		rep.Notes = append(rep.Notes, "peak memory not measured: "+err.Error())
	} else {
		rep.Memory = &m
	}
	if cerr := s.close(); cerr != nil && sweepErr == nil {
		rep.Notes = append(rep.Notes, "closing: "+cerr.Error())
	}
	if sweepErr != nil {
		rep.Notes = append(rep.Notes, "sweep aborted: "+sweepErr.Error())
	}
	rep.Finished = time.Now().UTC()
	if end := benchreport.CurrentMachine().LoadAvg; end != "" {
		rep.Notes = append(rep.Notes, fmt.Sprintf("load average (1/5/15 min) at the start %s, at the end %s", rep.Machine.LoadAvg, end))
	}
	rep.Ratios = benchreport.ComputeRatios(rep.Cells)
	rep.AutoJudgements = benchreport.JudgeAuto(rep.Cells)
	return o.finish(out, errw, rep, sweepErr)
}

// warmUps returns one unrecorded move of the first group's workload per
// route, for session.warmUp.
func (p benchPlan) warmUps() []warmMove {
	var out []warmMove
	for _, r := range p.routes {
		rs, rt := routeSpec(r, p.groups[0].spec)
		out = append(out, warmMove{route: r, opts: driver.Options{Spec: rs, Requests: 1, Route: rt, Pull: r == benchreport.RoutePull}})
	}
	for _, bg := range p.groups { // and the block form's first group, once per route
		if bg.g.Form != benchreport.FormBlocks {
			continue
		}
		for _, r := range p.routes {
			if rs, rt := routeSpec(r, bg.spec); blockForm(bg.g, r) {
				out = append(out, warmMove{route: r, opts: driver.Options{Spec: rs, Requests: 1, Route: rt, Blocks: true, Pull: r == benchreport.RoutePull}})
			}
		}
		break
	}
	return out
}

// sweep measures every cell; it stops early only when the receiver stops
// answering or the command is cancelled.
func (o *benchOptions) sweep(cmd *cobra.Command, s *session, plan benchPlan) ([]benchreport.Cell, error) {
	prog := newBenchProgress(cmd.ErrOrStderr(), plan.cells())
	defer prog.finish()
	var cells []benchreport.Cell
	// Groups that differ only in their form are one family: each
	// iteration moves every form's routes back to back, side by side.
	for lo := 0; lo < len(plan.groups); {
		hi := lo + 1
		for hi < len(plan.groups) && sameShape(plan.groups[hi].g, plan.groups[lo].g) {
			hi++
		}
		for it := 0; it < plan.repeat; it++ {
			for _, bg := range plan.groups[lo:hi] {
				spec := bg.spec
				spec.Seed = iterationSeed(o.seed, it)
				for order, r := range rotate(plan.routes, it) {
					if err := cmd.Context().Err(); err != nil {
						return cells, err
					}
					prog.start(fmt.Sprintf("%s %s #%d", bg.g, r, it))
					c, err := o.cell(cmd.Context(), s, bg.g, spec, r, it, order)
					if err != nil {
						return cells, err
					}
					cells = append(cells, c)
					prog.done(c)
				}
			}
		}
		lo = hi
	}
	return cells, nil
}

// sameShape reports whether a and b differ in nothing but their form.
func sameShape(a, b benchreport.Group) bool {
	a.Form, b.Form = "", ""
	return a == b
}

// cell measures one cell: clear, run, verify.
func (o *benchOptions) cell(ctx context.Context, s *session, g benchreport.Group, spec workload.Spec, route string, it, order int) (benchreport.Cell, error) {
	rs, rt := routeSpec(route, spec)
	d, tgt, which := s.route(route)
	requests := g.Concurrency * max(1, g.Generations)
	pull := route == benchreport.RoutePull
	switch {
	case pull:
		// The receiver is the holder: it fills its buffer with the
		// bytes, this agent pulls them into its own, cleared, and
		// verifies them here.
		fc := verifyCommand(rs, requests)
		fc.Op = "fill"
		if _, err := s.recv.call(fc, 5*time.Minute); err != nil {
			return benchreport.Cell{}, runtime(err)
		}
		if o.verify {
			if err := d.Buffer().Clear(); err != nil {
				return benchreport.Cell{}, runtime(err)
			}
		}
	case o.verify:
		if _, err := s.recv.call(command{Op: "clear", Buffer: which}, 2*time.Minute); err != nil {
			return benchreport.Cell{}, runtime(err)
		}
	}
	blocks := blockForm(g, route)
	if blocks {
		if err := s.pools(rs, requests); err != nil {
			return benchreport.Cell{}, runtime(fmt.Errorf("%s %s #%d: %w", g, route, it, err))
		}
	}
	rctx, cancel := context.WithTimeout(ctx, o.cellTimeout)
	res, err := d.Run(rctx, tgt, driver.Options{Spec: rs, Requests: requests, InFlight: g.Concurrency, Route: rt, Blocks: blocks, Pull: pull})
	// --duration: keep moving the cell's workload until it has run that
	// long; the rounds' bytes, times and latencies add up.
	for o.duration > 0 && err == nil && res.Failed == 0 && res.Elapsed < o.duration {
		var more driver.Result
		more, err = d.Run(rctx, tgt, driver.Options{Spec: rs, Requests: requests, InFlight: g.Concurrency, Route: rt, Blocks: blocks, Pull: pull})
		if err == nil {
			res = mergeResults(res, more)
		}
	}
	cancel()
	if errors.Is(err, transfer.ErrNotQuiescent) { // the buffers cannot be reused: stop the sweep
		return benchreport.Cell{}, runtime(fmt.Errorf("%s %s #%d: %w", g, route, it, err))
	}
	if err != nil {
		c := benchreport.NewCell(g, route, it, order, requests, requests, 0, 0, nil)
		c.Error = err.Error()
		return c, nil
	}
	window, all := res.Latencies, (*benchreport.LatencyStats)(nil)
	if g.Generations > 1 { // a closed loop: latency over the steady state
		s := benchreport.Summarize(res.Latencies)
		window, all = res.Steady, &s
	}
	c := benchreport.NewCell(g, route, it, order, res.Requests, res.Failed, res.Bytes, res.Elapsed, window)
	c.AllLatency, c.Took, c.Reason, c.PeakInFlight, c.Fallbacks = all, res.Route, res.Reason, res.PeakInFlight, res.Fallbacks
	c.Stages = cellStages(res.Stages)
	switch {
	case res.Failed > 0:
		c.Error = fmt.Sprintf("%d of %d requests failed: %v", res.Failed, res.Requests, res.FirstErr)
	case !o.verify:
		c.NotVerified = cmp.Or(o.notVerified, "verification off (--verify=false)")
	case pull: // the bytes landed here
		err := driver.VerifyBuffer(d.Buffer(), rs, requests)
		c.Verified = err == nil
		if err == nil {
			c.VerifiedRequests = requests
		} else {
			c.Error = err.Error()
		}
	default:
		vc := verifyCommand(rs, requests)
		vc.Buffer = which
		rep, err := s.recv.call(vc, 5*time.Minute)
		c.Verified, c.VerifiedRequests = err == nil, rep.Verified
		if err != nil {
			c.Error = err.Error()
		}
	}
	return c, nil
}

// memory reads both agents' peak RSS (Linux /proc).
func (s *session) memory(plan benchPlan, arena uint64) (benchreport.Memory, error) {
	m := benchreport.Memory{SourceBuffer: plan.largest, DestinationBuffer: s.tgt.Buffer.Len, ArenaSize: arena, LargestTransfer: plan.largest}
	var err error
	if m.SenderPeakRSS, err = benchreport.PeakRSS(os.Getpid()); err != nil {
		return m, err
	}
	if s.recv == nil {
		m.ReceiverElsewhere = true // not measured: it runs elsewhere
		return m, nil
	}
	if m.ReceiverPeakRSS, err = benchreport.PeakRSS(s.recv.pid); err != nil {
		return m, err
	}
	return m, nil
}

// finish prints the table and writes the JSON and the plots; it returns
// sweepErr, or a failure when a cell failed.
func (o *benchOptions) finish(out, errw io.Writer, rep *benchreport.Report, sweepErr error) error {
	fmt.Fprintln(out)
	if err := benchreport.WriteTable(out, rep); err != nil {
		return runtime(err)
	}
	if o.jsonPath != "" {
		if err := benchreport.SaveJSON(o.jsonPath, rep); err != nil {
			return runtime(err)
		}
		fmt.Fprintf(out, "results: %s\n", o.jsonPath)
	}
	if o.plotsDir != "" {
		paths, skipped, err := benchreport.WritePlots(o.plotsDir, rep)
		if err != nil {
			return runtime(err)
		}
		for _, p := range paths {
			fmt.Fprintf(out, "plot: %s\n", p)
		}
		for _, s := range skipped {
			fmt.Fprintf(out, "plot: %s\n", s)
		}
	}
	if sweepErr != nil {
		var ee *exitError
		if errors.As(sweepErr, &ee) {
			return sweepErr
		}
		return runtime(sweepErr)
	}
	bad := 0
	for _, c := range rep.Cells {
		if !c.OK() {
			bad++
		}
	}
	if bad > 0 {
		return failed(fmt.Errorf("%d of %d cells failed or did not verify", bad, len(rep.Cells)))
	}
	if o.verify {
		fmt.Fprintln(out, "every cell verified byte for byte")
	}
	return nil
}

// benchProgress reports progress on stderr: a progress bar on a terminal,
// one line per cell otherwise.
type benchProgress struct {
	w     io.Writer
	bar   *progressbar.ProgressBar
	total int
	n     int
}

func newBenchProgress(w io.Writer, total int) *benchProgress {
	p := &benchProgress{w: w, total: total}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionShowCount(),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionSetWidth(30),
		)
	}
	return p
}

func (p *benchProgress) start(what string) {
	if p.bar != nil {
		p.bar.Describe(what)
	}
}

func (p *benchProgress) done(c benchreport.Cell) {
	p.n++
	if p.bar != nil {
		p.bar.Add(1)
		return
	}
	status := "verified " + c.Verification()
	if c.NotVerified != "" {
		status += " (" + c.NotVerified + ")"
	}
	if c.Error != "" {
		status += ": " + c.Error
	}
	if c.Fallbacks > 0 {
		status += fmt.Sprintf("; %d of %d request(s) fell back to direct: %s", c.Fallbacks, c.Requests, c.Reason)
	}
	fmt.Fprintf(p.w, "bench [%d/%d] %s %s #%d: %s, p50 %s, p99 %s, %s\n", p.n, p.total, c.Group, c.Route, c.Iteration,
		benchreport.FormatRate(c.Throughput), benchreport.FormatDuration(time.Duration(c.Latency.P50NS)),
		benchreport.FormatDuration(time.Duration(c.Latency.P99NS)), status)
}

func (p *benchProgress) finish() {
	if p.bar != nil {
		p.bar.Finish()
		fmt.Fprintln(p.w)
	}
}

// parseSizeSweep parses --desc-size: one size, a comma-separated list, or a
// range lo..hi of the sizes doubling from lo up to hi (hi included when it
// is lo times a power of two).
func parseSizeSweep(s string) ([]uint64, error) {
	if lo, hi, ok := strings.Cut(s, ".."); ok {
		a, err := parseSize(lo)
		if err != nil {
			return nil, err
		}
		b, err := parseSize(hi)
		if err != nil {
			return nil, err
		}
		if b < a {
			return nil, fmt.Errorf("range %q: %s is below %s", s, hi, lo)
		}
		var out []uint64
		for v := a; v <= b && v != 0; v *= 2 {
			out = append(out, v)
		}
		return out, nil
	}
	var out []uint64
	for _, part := range strings.Split(s, ",") {
		v, err := parseSize(part)
		if err != nil {
			return nil, err
		}
		if slices.Contains(out, v) {
			return nil, fmt.Errorf("%s is listed twice", strings.TrimSpace(part))
		}
		out = append(out, v)
	}
	return out, nil
}

// mergeResults adds round b of a --duration cell to a: requests, bytes and
// time add up, latencies are pooled (sorted), the route reads "mixed" if
// the rounds took different ones.
func mergeResults(a, b driver.Result) driver.Result {
	na, nb := len(a.Latencies), len(b.Latencies)
	if na+nb > 0 { // both are means per request: weigh them by their counts
		a.Stages = scaleStages(a.Stages, na).Add(scaleStages(b.Stages, nb)).Div(na + nb)
	}
	a.Requests += b.Requests
	a.Failed += b.Failed
	a.Bytes += b.Bytes
	a.Elapsed += b.Elapsed
	a.Latencies = append(a.Latencies, b.Latencies...)
	slices.Sort(a.Latencies)
	if a.Steady != nil || b.Steady != nil {
		a.Steady = append(a.Steady, b.Steady...)
		slices.Sort(a.Steady)
	}
	a.PeakInFlight = max(a.PeakInFlight, b.PeakInFlight)
	a.Fallbacks += b.Fallbacks
	a.NotQuiescent += b.NotQuiescent
	if a.FirstErr == nil {
		a.FirstErr = b.FirstErr
	}
	if a.Route != b.Route {
		a.Route = "mixed"
	}
	return a
}

// effectiveConfig renders cfg (every key, after every layer) as the nested
// mapping its YAML form is, for the report.
func effectiveConfig(cfg config.Config) (map[string]any, error) {
	y, err := cfg.YAML()
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := yaml.Unmarshal(y, &m); err != nil {
		return nil, fmt.Errorf("effective configuration: %w", err)
	}
	return m, nil
}

func scaleStages(s pipeline.Stages, n int) pipeline.Stages {
	d := time.Duration(n)
	return pipeline.Stages{Plan: s.Plan * d, GrantWait: s.GrantWait * d, Gather: s.Gather * d, Write: s.Write * d, Data: s.Data * d, Scatter: s.Scatter * d, AckWait: s.AckWait * d}
}

// cellStages converts the driver's mean stage times for the report.
func cellStages(s pipeline.Stages) *benchreport.Stages {
	if s == (pipeline.Stages{}) {
		return nil
	}
	return &benchreport.Stages{PlanNS: int64(s.Plan), GrantWaitNS: int64(s.GrantWait), GatherNS: int64(s.Gather),
		WriteNS: int64(s.Write), DataNS: int64(s.Data), ScatterNS: int64(s.Scatter), AckWaitNS: int64(s.AckWait)}
}
