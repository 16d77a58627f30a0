// Package benchreport holds the results of a `bounce bench` sweep: the
// measured cells, the side-by-side ratios between routes, the machine and
// configuration they were measured on, and the peak memory of both agents.
// It renders them as JSON, as a terminal table and as PNG plots.
package benchreport

import (
	"cmp"
	"fmt"
	"github.com/bouncekv/bounce/driver"
	"math"
	"slices"
	"strings"
	"time"
)

// Schema is the version of the JSON layout written by WriteJSON. Version 2
// names a cell's throughput bytes_per_second (1 called it throughput_bps)
// and adds the build and the effective configuration; version 3 makes a
// cell's verified a boolean, with not_verified saying why bytes were not
// checked (1 and 2 wrote "yes", "failed" or "skipped"). ReadJSON reads all
// three.
const Schema = 3

// Route names used in cells. RouteBulk is not a pipeline route: it is the
// same bytes as one contiguous descriptor per request, moved on the direct
// path — the best an engine can do with the bytes.
const (
	RouteBounce = "bounce"
	RouteDirect = "direct"
	RouteBulk   = "bulk"
	// RouteAuto lets the agent choose (bounce.route auto).
	RouteAuto = "auto"
	// RoutePull is the bounce path the other way round: the receiver
	// pulls the same workload (pipeline.Agent.Pull), measured beside the
	// push (bounce) with the pull/bounce ratio.
	RoutePull = "pull"
	// FormDescs and FormBlocks are the request forms a Group names:
	// descriptor lists, and block tables over registered pools.
	FormDescs  = "descs"
	FormBlocks = "blocks"
	// RouteBest is the denominator of the auto/best ratio: per iteration,
	// the faster of the bounce and direct cells.
	RouteBest = "best"
)

// AutoTolerance is how far below the faster of bounce and direct route
// auto may land in a cell and still count as having chosen well
// (AutoVerdict).
const AutoTolerance = 0.05

// Verification outcomes of a row of the summary table (Row.Verified), and
// of a cell as its Verification method names them.
const (
	VerifiedYes     = "yes"     // the receiver checked every byte of every request
	VerifiedFailed  = "failed"  // a request failed or a byte was wrong
	VerifiedSkipped = "skipped" // the bytes were not checked (Cell.NotVerified says why)
)

// Stages is the pipeline's own per-stage timing of a request, summed over
// its chunks (chunks overlap: the stages add up to more than the latency):
// building the plan, WANT to first GRANT, the gathers, the bulk writes
// until landed, sending DATA, the receiver's scatter (DATA's arrival to the
// scatter's end, as its ACKs report it), and the rest of DATA to ACK (the
// DATA's and the ACK's trips). A direct request has only its write.
type Stages struct {
	PlanNS      int64 `json:"plan_ns"`
	GrantWaitNS int64 `json:"grant_wait_ns"`
	GatherNS    int64 `json:"gather_ns"`
	WriteNS     int64 `json:"write_ns"`
	DataNS      int64 `json:"data_ns"`
	ScatterNS   int64 `json:"scatter_ns"`
	AckWaitNS   int64 `json:"ack_wait_ns"`
}

// Build identifies the bounce that produced a report.
type Build struct {
	// Version is the module version ("(devel)" for a source build).
	Version string `json:"version"`
	// Commit is the VCS revision, "" when the binary carries none.
	Commit string `json:"commit,omitempty"`
	// Modified says the working tree had uncommitted changes.
	Modified bool `json:"modified"`
	// WireVersion is the control-plane codec version (wire.Version).
	WireVersion uint16 `json:"wire_version"`
}

// Report is one bench sweep.
type Report struct {
	// Schema is the JSON layout version (Schema).
	Schema int `json:"schema"`
	// Started and Finished bound the sweep.
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// Command is the command line that produced the report.
	Command []string `json:"command,omitempty"`
	// Machine is where it ran.
	Machine Machine `json:"machine"`
	// Bounce is the build that ran the sweep.
	Bounce Build `json:"bounce"`
	// EffectiveConfig is the sender's whole configuration after every
	// layer (defaults, file, environment, flags), keyed as in YAML.
	EffectiveConfig map[string]any `json:"effective_config,omitempty"`
	// Config is what was swept and with which engine and control plane.
	Config Config `json:"config"`
	// Cells are the measurements in the order they were taken.
	Cells []Cell `json:"cells"`
	// Ratios are throughput ratios measured side by side (ComputeRatios).
	Ratios []Ratio `json:"ratios"`
	// AutoJudgements judge route auto against noise in every cell that
	// ran auto, bounce and direct (JudgeAuto).
	AutoJudgements []AutoJudgement `json:"auto_judgements,omitempty"`
	// Memory is the peak memory of both agents, where it could be read.
	Memory *Memory `json:"memory,omitempty"`
	// Notes are what the sweep skipped, clamped or noticed.
	Notes []string `json:"notes,omitempty"`
}

// Config summarizes the sweep's settings.
type Config struct {
	Engine string `json:"engine"`
	// Peer names the remote receiver of a bench --peer run ("" when the
	// receiver was a local child process).
	Peer          string            `json:"peer,omitempty"`
	EngineOptions map[string]string `json:"engine_options,omitempty"`
	ControlPlane  string            `json:"control_plane"`
	BounceOn      bool              `json:"bounce_enabled"`
	ArenaSize     uint64            `json:"arena_size"`
	MaxChunk      uint64            `json:"max_chunk"`
	MinChunk      uint64            `json:"min_chunk,omitempty"`
	CopyWorkers   int               `json:"copy_workers"` // 0: the CPU count, 2..8
	MaxInflight   int               `json:"max_inflight"`
	Workloads     []string          `json:"workloads"`
	DescSize      uint64            `json:"desc_size_override,omitempty"`
	Count         int               `json:"count_override,omitempty"`
	Layouts       []string          `json:"layouts"`
	Forms         []string          `json:"forms,omitempty"` // the request forms (--form); empty: descriptor lists
	Concurrency   []int             `json:"concurrency"`
	Generations   int               `json:"generations,omitempty"`
	Routes        []string          `json:"routes"`
	Repeat        int               `json:"repeat"`
	Seed          uint64            `json:"seed"`
	Verify        bool              `json:"verify"`
	MaxBytes      uint64            `json:"max_bytes"`
}

// EngineLabel names the engine with its options, e.g. "ucx (error_mode=none)".
func (c Config) EngineLabel() string {
	if len(c.EngineOptions) == 0 {
		return c.Engine
	}
	keys := make([]string, 0, len(c.EngineOptions))
	for k := range c.EngineOptions {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		keys[i] = k + "=" + c.EngineOptions[k]
	}
	return c.Engine + " (" + strings.Join(keys, ",") + ")"
}

// Group identifies what a cell measured apart from the route and the
// iteration: cells of one group are compared with each other.
type Group struct {
	Workload string `json:"workload"`
	DescSize uint64 `json:"desc_size"`
	Count    int    `json:"count"`
	Layout   string `json:"layout"`
	// Form is the request form: "descs" (descriptor lists) or "blocks"
	// (block tables over registered pools); empty in reports of runs
	// without --form, which moved descriptor lists.
	Form        string `json:"form,omitempty"`
	Concurrency int    `json:"concurrency"`
	// Generations > 1 runs a closed loop: Concurrency requests in flight,
	// each completion submitting the next, Generations x Concurrency
	// requests in all; latencies then cover the requests after the first
	// Concurrency (the steady state). 0 or 1 is a burst: every request
	// submitted at once.
	Generations int `json:"generations,omitempty"`
	// AskedConcurrency is the concurrency the command asked for when
	// --max-bytes clamped it to Concurrency (0 when it was not clamped).
	AskedConcurrency int `json:"asked_concurrency,omitempty"`
}

// Bytes returns one request's payload.
func (g Group) Bytes() uint64 { return g.DescSize * uint64(g.Count) }

// String names the group for tables and plots.
func (g Group) String() string {
	asked := ""
	if g.AskedConcurrency != 0 {
		asked = fmt.Sprintf(" (asked c%d)", g.AskedConcurrency)
	}
	return fmt.Sprintf("%s %dx%s %s c%d%s%s", g.Workload, g.Count, FormatSize(g.DescSize), g.LayoutForm(), g.Concurrency, g.loopTag(" "), asked)
}

// LayoutForm names the layout and, when set, the form ("fragmented
// blocks").
func (g Group) LayoutForm() string {
	if g.Form == "" {
		return g.Layout
	}
	return g.Layout + " " + g.Form
}

// loopTag names a closed loop ("<sep>loopK"), or is empty for a burst.
func (g Group) loopTag(sep string) string {
	if g.Generations > 1 {
		return fmt.Sprintf("%sloop%d", sep, g.Generations)
	}
	return ""
}

// Cell is one measured run: a group on one route in one iteration.
type Cell struct {
	Group
	// Route is the route asked for: bounce, direct or bulk.
	Route string `json:"route"`
	// Took is the route the requests took as the agent reported it.
	Took string `json:"took"`
	// Reason is why the agent chose Took.
	Reason string `json:"reason,omitempty"`
	// DescriptorsPerSecond is the workload's descriptors moved per second
	// (Count per successful request; the bulk route moves the same bytes
	// as one descriptor, but is counted as the workload's).
	DescriptorsPerSecond float64 `json:"descriptors_per_second"`
	// Stages is where a successful request's time went on the sender, the
	// mean over the cell's requests (nil when none succeeded).
	Stages *Stages `json:"stages,omitempty"`
	// Fallbacks counts the requests that went direct although the cell
	// did not ask for direct (handshake, gates, bounce off).
	Fallbacks int `json:"fallbacks,omitempty"`
	// Iteration counts from 0; Order is the cell's place within it.
	Iteration int `json:"iteration"`
	Order     int `json:"order"`
	// Requests were submitted (at once for a burst, Concurrency at a time
	// in a closed loop); Failed of them failed.
	Requests int `json:"requests"`
	Failed   int `json:"failed"`
	// Bytes is the payload of the successful requests.
	Bytes uint64 `json:"bytes"`
	// ElapsedNS is first submit to last completion.
	ElapsedNS int64 `json:"elapsed_ns"`
	// Throughput is Bytes per second of Elapsed.
	Throughput float64 `json:"bytes_per_second"`
	// Latency summarizes LatenciesNS.
	Latency LatencyStats `json:"latency"`
	// LatenciesNS are the successful requests' latencies, sorted: all of
	// them for a burst, the steady state's (after the first generation) for
	// a closed loop.
	LatenciesNS []int64 `json:"latencies_ns"`
	// AllLatency summarizes every successful request of a closed loop, the
	// first generation's ramp included (absent for a burst).
	AllLatency *LatencyStats `json:"all_requests_latency,omitempty"`
	// PeakInFlight is the most requests in flight at once.
	PeakInFlight int `json:"peak_in_flight,omitempty"`
	// Verified is true when the receiver checked every byte of every
	// request and found each right. When it is false, NotVerified says why
	// the bytes were not checked (verification off, a remote receiver), or
	// is empty when they were and a request failed or a byte was wrong
	// (Error says which). VerifiedRequests is how many requests the
	// receiver checked.
	Verified         bool   `json:"verified"`
	NotVerified      string `json:"not_verified,omitempty"`
	VerifiedRequests int    `json:"verified_requests,omitempty"`
	// Error is the first failure, if any.
	Error string `json:"error,omitempty"`
}

// Verification names the cell's outcome: VerifiedYes, VerifiedSkipped (not
// checked: NotVerified says why) or VerifiedFailed.
func (c Cell) Verification() string {
	switch {
	case c.Failed > 0:
		return VerifiedFailed
	case c.Verified:
		return VerifiedYes
	case c.NotVerified != "":
		return VerifiedSkipped
	}
	return VerifiedFailed
}

// OK reports a cell whose requests all succeeded and whose bytes did not
// fail verification.
func (c Cell) OK() bool {
	return c.Verification() != VerifiedFailed && c.Throughput > 0
}

// Latencies returns the cell's latencies as durations.
func (c Cell) Latencies() []time.Duration {
	out := make([]time.Duration, len(c.LatenciesNS))
	for i, n := range c.LatenciesNS {
		out[i] = time.Duration(n)
	}
	return out
}

// NewCell fills a cell's measurement fields from a run's raw numbers; the
// latencies are copied and sorted.
func NewCell(g Group, route string, iteration, order int, requests, failed int, bytes uint64, elapsed time.Duration, latencies []time.Duration) Cell {
	c := Cell{Group: g, Route: route, Iteration: iteration, Order: order, Requests: requests, Failed: failed, Bytes: bytes, ElapsedNS: int64(elapsed)}
	if elapsed > 0 {
		c.Throughput = float64(bytes) / elapsed.Seconds()
		c.DescriptorsPerSecond = float64(g.Count) * float64(requests-failed) / elapsed.Seconds()
	}
	c.Latency = Summarize(latencies)
	c.LatenciesNS = make([]int64, len(latencies))
	for i, d := range latencies {
		c.LatenciesNS[i] = int64(d)
	}
	slices.Sort(c.LatenciesNS)
	return c
}

// LatencyStats are the percentiles of a set of request latencies (nearest
// rank), in nanoseconds.
type LatencyStats struct {
	Count  int   `json:"count"`
	MinNS  int64 `json:"min_ns"`
	MeanNS int64 `json:"mean_ns"`
	P50NS  int64 `json:"p50_ns"`
	P90NS  int64 `json:"p90_ns"`
	P99NS  int64 `json:"p99_ns"`
	MaxNS  int64 `json:"max_ns"`
	// TailRatio is P99/P50 (0 without latencies).
	TailRatio float64 `json:"p99_over_p50"`
}

// Summarize computes the percentiles of lat (in any order).
func Summarize(lat []time.Duration) LatencyStats {
	if len(lat) == 0 {
		return LatencyStats{}
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	var sum float64
	for _, d := range s {
		sum += float64(d)
	}
	st := LatencyStats{
		Count:  len(s),
		MinNS:  int64(s[0]),
		MeanNS: int64(math.Round(sum / float64(len(s)))),
		P50NS:  int64(driver.Percentile(s, 50)),
		P90NS:  int64(driver.Percentile(s, 90)),
		P99NS:  int64(driver.Percentile(s, 99)),
		MaxNS:  int64(s[len(s)-1]),
	}
	if st.P50NS > 0 {
		st.TailRatio = float64(st.P99NS) / float64(st.P50NS)
	}
	return st
}

// Median returns the median of xs (the mean of the middle two for an even
// count), or 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Ratio is a throughput ratio between two routes of one group, computed
// within each iteration (the two cells ran back to back) and summarized by
// the median over iterations.
type Ratio struct {
	Group
	// Numerator and Denominator are route names: Numerator's throughput
	// divided by Denominator's.
	Numerator   string `json:"numerator"`
	Denominator string `json:"denominator"`
	// PerIteration holds one ratio per iteration where both cells succeeded.
	PerIteration []float64 `json:"per_iteration"`
	// Median is the median of PerIteration.
	Median float64 `json:"median"`
}

// Name returns "numerator/denominator".
func (r Ratio) Name() string { return r.Numerator + "/" + r.Denominator }

// ComputeRatios pairs, within every group and iteration, the bounce cell
// with every other route's cell and returns bounce's throughput over the
// other's; where the group ran auto, bounce and direct it adds auto/best,
// auto's throughput over the faster of bounce and direct in the same
// iteration; for a group of the block form it adds, per route but bulk,
// "<route>[blocks]/<route>[descs]", its throughput over the descriptor
// form's of the same shape in the same iteration; where the group ran pull
// and bounce it adds pull/bounce, the pull's throughput over the push's.
// Groups and routes keep the
// order in which cells first appear; failed cells are left out of the ratios.
func ComputeRatios(cells []Cell) []Ratio {
	type key struct {
		g     Group
		route string
		iter  int
	}
	byKey := map[key]Cell{}
	var groups []Group
	routes := map[Group][]string{}
	for _, c := range cells {
		if _, ok := routes[c.Group]; !ok {
			groups = append(groups, c.Group)
		}
		if !slices.Contains(routes[c.Group], c.Route) {
			routes[c.Group] = append(routes[c.Group], c.Route)
		}
		byKey[key{c.Group, c.Route, c.Iteration}] = c
	}
	var out []Ratio
	for _, g := range groups {
		if !slices.Contains(routes[g], RouteBounce) {
			continue
		}
		var iters []int
		for k := range byKey {
			if k.g == g && k.route == RouteBounce {
				iters = append(iters, k.iter)
			}
		}
		slices.Sort(iters)
		for _, den := range routes[g] {
			if den == RouteBounce {
				continue
			}
			r := Ratio{Group: g, Numerator: RouteBounce, Denominator: den}
			for _, it := range iters {
				n, d := byKey[key{g, RouteBounce, it}], byKey[key{g, den, it}]
				if n.OK() && d.OK() {
					r.PerIteration = append(r.PerIteration, n.Throughput/d.Throughput)
				}
			}
			if len(r.PerIteration) == 0 {
				continue
			}
			r.Median = Median(r.PerIteration)
			out = append(out, r)
		}
		if slices.Contains(routes[g], RoutePull) {
			r := Ratio{Group: g, Numerator: RoutePull, Denominator: RouteBounce}
			for _, it := range iters {
				n, d := byKey[key{g, RoutePull, it}], byKey[key{g, RouteBounce, it}]
				if n.OK() && d.OK() {
					r.PerIteration = append(r.PerIteration, n.Throughput/d.Throughput)
				}
			}
			if len(r.PerIteration) > 0 {
				r.Median = Median(r.PerIteration)
				out = append(out, r)
			}
		}
		if g.Form == FormBlocks {
			// The block form against the descriptor form of the same
			// shape, route by route, in the iterations both ran.
			d := g
			d.Form = FormDescs
			for _, route := range routes[g] {
				if route == RouteBulk || !slices.Contains(routes[d], route) {
					continue // bulk is one descriptor in either form
				}
				r := Ratio{Group: g, Numerator: route + "[" + FormBlocks + "]", Denominator: route + "[" + FormDescs + "]"}
				for _, it := range iters {
					n, dd := byKey[key{g, route, it}], byKey[key{d, route, it}]
					if n.OK() && dd.OK() {
						r.PerIteration = append(r.PerIteration, n.Throughput/dd.Throughput)
					}
				}
				if len(r.PerIteration) > 0 {
					r.Median = Median(r.PerIteration)
					out = append(out, r)
				}
			}
		}
		if slices.Contains(routes[g], RouteAuto) && slices.Contains(routes[g], RouteDirect) {
			r := Ratio{Group: g, Numerator: RouteAuto, Denominator: RouteBest}
			for _, it := range iters {
				a, bn, d := byKey[key{g, RouteAuto, it}], byKey[key{g, RouteBounce, it}], byKey[key{g, RouteDirect, it}]
				if a.OK() && bn.OK() && d.OK() {
					r.PerIteration = append(r.PerIteration, a.Throughput/max(bn.Throughput, d.Throughput))
				}
			}
			if len(r.PerIteration) > 0 {
				r.Median = Median(r.PerIteration)
				out = append(out, r)
			}
		}
	}
	return out
}

// AutoVerdict counts the cells with an auto/best ratio and those whose
// median is within AutoTolerance of the faster route.
func AutoVerdict(ratios []Ratio) (within, cells int) {
	for _, r := range ratios {
		if r.Numerator == RouteAuto && r.Denominator == RouteBest {
			cells++
			if r.Median >= 1-AutoTolerance {
				within++
			}
		}
	}
	return within, cells
}

// Row is one line of the summary table: a group on one route over all
// iterations.
type Row struct {
	Group
	Route string
	// Took lists the routes the agent reported when they differ from Route.
	Took string
	// Iterations counts the cells; Failed sums their failed requests.
	Iterations int
	Failed     int
	// Throughput is the median over iterations.
	Throughput float64
	// Latency pools every iteration's request latencies.
	Latency LatencyStats
	// Verified is VerifiedYes only if every iteration verified,
	// VerifiedFailed if one failed, else VerifiedSkipped; NotVerified is
	// then the reason of the first iteration not checked.
	Verified    string
	NotVerified string
}

// Rows aggregates cells into one row per group and route, in the order the
// cells first appear.
func Rows(cells []Cell) []Row {
	type key struct {
		g     Group
		route string
	}
	var order []key
	acc := map[key][]Cell{}
	for _, c := range cells {
		k := key{c.Group, c.Route}
		if _, ok := acc[k]; !ok {
			order = append(order, k)
		}
		acc[k] = append(acc[k], c)
	}
	out := make([]Row, 0, len(order))
	for _, k := range order {
		cs := acc[k]
		r := Row{Group: k.g, Route: k.route, Iterations: len(cs), Verified: VerifiedYes}
		var tps []float64
		var lat []time.Duration
		var took []string
		for _, c := range cs {
			r.Failed += c.Failed
			tps = append(tps, c.Throughput)
			lat = append(lat, c.Latencies()...)
			switch v := c.Verification(); {
			case v == VerifiedFailed:
				r.Verified, r.NotVerified = VerifiedFailed, ""
			case v == VerifiedSkipped && r.Verified == VerifiedYes:
				r.Verified, r.NotVerified = VerifiedSkipped, c.NotVerified
			}
			if c.Took != "" && c.Took != expectedTook(c.Route) && !slices.Contains(took, c.Took) {
				took = append(took, c.Took)
			}
		}
		slices.Sort(took)
		for i, t := range took {
			if i > 0 {
				r.Took += ","
			}
			r.Took += t
		}
		r.Throughput = Median(tps)
		r.Latency = Summarize(lat)
		out = append(out, r)
	}
	return out
}

// expectedTook is the agent route a bench route should take.
func expectedTook(route string) string {
	if route == RouteBulk {
		return RouteDirect
	}
	return route
}

// Memory is the peak resident memory of both agents over the sweep (VmHWM),
// next to what they had to hold anyway: the source and destination buffers
// and the bounce arena.
type Memory struct {
	SenderPeakRSS   uint64 `json:"sender_peak_rss"`
	ReceiverPeakRSS uint64 `json:"receiver_peak_rss"`
	// SourceBuffer and DestinationBuffer are the registered KV buffers.
	SourceBuffer      uint64 `json:"source_buffer"`
	DestinationBuffer uint64 `json:"destination_buffer"`
	// ArenaSize is each agent's bounce arena.
	ArenaSize uint64 `json:"arena_size"`
	// LargestTransfer is the largest cell's payload (requests x bytes).
	LargestTransfer uint64 `json:"largest_transfer"`
	// ReceiverElsewhere is set when the receiver runs on another host
	// (bench --peer): its peak RSS is not measured (ReceiverPeakRSS 0).
	ReceiverElsewhere bool `json:"receiver_elsewhere,omitempty"`
}

// SenderOverhead is the sender's peak beyond its source buffer.
func (m Memory) SenderOverhead() int64 { return int64(m.SenderPeakRSS) - int64(m.SourceBuffer) }

// ReceiverOverhead is the receiver's peak beyond its destination buffer.
func (m Memory) ReceiverOverhead() int64 {
	return int64(m.ReceiverPeakRSS) - int64(m.DestinationBuffer)
}

// SortCells orders cells by the sweep's natural order: group order of
// first appearance is kept; within a group by iteration, then order.
func SortCells(cells []Cell) {
	first := map[Group]int{}
	for i, c := range cells {
		if _, ok := first[c.Group]; !ok {
			first[c.Group] = i
		}
	}
	slices.SortStableFunc(cells, func(a, b Cell) int {
		return cmp.Or(cmp.Compare(first[a.Group], first[b.Group]), cmp.Compare(a.Iteration, b.Iteration), cmp.Compare(a.Order, b.Order))
	})
}

// FormatSize renders bytes with binary units (4KiB, 320MiB, 2.5GiB).
func FormatSize(n uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f := float64(n)
	u := 0
	for f >= 1024 && u < len(units)-1 {
		f /= 1024
		u++
	}
	if f == math.Trunc(f) {
		return fmt.Sprintf("%.0f%s", f, units[u])
	}
	return fmt.Sprintf("%.3g%s", f, units[u])
}

// FormatRate renders bytes per second in decimal units (GB/s, MB/s).
func FormatRate(bps float64) string {
	switch {
	case bps >= 1e9:
		return fmt.Sprintf("%.2f GB/s", bps/1e9)
	case bps >= 1e6:
		return fmt.Sprintf("%.1f MB/s", bps/1e6)
	default:
		return fmt.Sprintf("%.0f B/s", bps)
	}
}

// FormatDuration rounds d for a table: three significant digits or so.
func FormatDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	default:
		return d.Round(time.Microsecond).String()
	}
}
