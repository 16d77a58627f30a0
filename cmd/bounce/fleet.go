package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/bouncekv/bounce/benchreport"
	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/discovery/etcd"
	"github.com/bouncekv/bounce/driver"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/workload"
)

// fleetFlags are the flags of `bounce bench --senders N --receivers M`.
type fleetFlags struct {
	senders, receivers int
	perSender          int
	pattern            string
	route              string
}

func (f *fleetFlags) add(fs *pflag.FlagSet) {
	fs.IntVar(&f.senders, "senders", 0, "fleet benchmark: this many sender processes (with --receivers), all found through etcd")
	fs.IntVar(&f.receivers, "receivers", 0, "fleet benchmark: this many receiver processes (with --senders)")
	fs.IntVar(&f.perSender, "sender-requests", 8, "fleet benchmark: requests each sender moves, all at once")
	fs.StringVar(&f.pattern, "pattern", "round-robin", "fleet benchmark: how senders choose receivers: round-robin, or seeded (random from --seed)")
	fs.StringVar(&f.route, "fleet-route", "bounce", "fleet benchmark: route of every request: bounce, direct or auto")
}

func (f *fleetFlags) on() bool { return f.senders != 0 || f.receivers != 0 }

// fleetPlan assigns each request of each sender to a receiver and a slot
// in that receiver's buffer. Slots at a receiver run sender by sender, so
// one sender's requests to one receiver are a contiguous range, and slot i
// of receiver k carries the byte pattern of seed base(k)+i: the receiver
// verifies its whole buffer as one run of requests.
type fleetPlan struct {
	senders, receivers, perSender int
	assign                        [][]int // [sender][request] = receiver
	start, count                  [][]int // [sender][receiver]: first slot and slots
	slots                         []int   // [receiver]: slots in all
}

// fleetConnsPerHost is the security.max_control_conns_per_host a fleet's
// agents need, and whether it is above the configured one. Every agent
// runs on this host, so a receiver's ROUTER takes all the senders' control
// connections from one host, and a sender's all the receivers'; twice
// that, as a redialed connection may linger beside its successor.
func fleetConnsPerHost(senders, receivers, configured int) (int, bool) {
	need := 2 * (senders + receivers)
	return need, need > configured
}

// planFleet is pure: the same arguments give the same plan.
func planFleet(senders, receivers, perSender int, pattern string, seed uint64) (fleetPlan, error) {
	if senders < 1 || receivers < 1 || senders > 256 || receivers > 256 {
		return fleetPlan{}, fmt.Errorf("--senders %d --receivers %d: both accepted 1..256", senders, receivers)
	}
	if perSender < 1 || perSender > 4096 {
		return fleetPlan{}, fmt.Errorf("--sender-requests %d: accepted 1..4096", perSender)
	}
	p := fleetPlan{senders: senders, receivers: receivers, perSender: perSender, slots: make([]int, receivers)}
	for s := range senders {
		row := make([]int, perSender)
		rng := rand.New(rand.NewPCG(seed, uint64(s)))
		for j := range row {
			switch pattern {
			case "round-robin":
				row[j] = (s + j) % receivers
			case "seeded":
				row[j] = rng.IntN(receivers)
			default:
				return fleetPlan{}, fmt.Errorf("--pattern %q: accepted: round-robin, seeded", pattern)
			}
		}
		p.assign = append(p.assign, row)
	}
	for s := range senders {
		st, ct := make([]int, receivers), make([]int, receivers)
		for _, k := range p.assign[s] {
			ct[k]++
		}
		for k := range receivers {
			st[k] = p.slots[k]
			p.slots[k] += ct[k]
		}
		p.start, p.count = append(p.start, st), append(p.count, ct)
	}
	return p, nil
}

// fleetSeed is the pattern seed of slot 0 at receiver k.
func fleetSeed(base uint64, k int) uint64 { return base + uint64(k)*1_000_003 }

// fleetJob is what the bench tells one sender child (one JSON line).
type fleetJob struct {
	DescSize   uint64        `json:"desc_size"`
	Count      int           `json:"count"`
	Fragmented bool          `json:"fragmented"`
	Route      string        `json:"route"`
	Duration   time.Duration `json:"duration"` // repeat the targets' rounds for this long; 0 = once
	Targets    []fleetTarget `json:"targets"`
}

// fleetTarget is one receiver of a sender: its slots and their first seed.
type fleetTarget struct {
	Peer  string `json:"peer"`
	Start int    `json:"start"`
	Count int    `json:"count"`
	Seed  uint64 `json:"seed"`
}

// fleetOutcome is what a sender child reports for one target.
type fleetOutcome struct {
	Peer        string  `json:"peer"`
	Requests    int     `json:"requests"`
	Failed      int     `json:"failed"`
	Bytes       uint64  `json:"bytes"`
	ElapsedNS   int64   `json:"elapsed_ns"`
	LatenciesNS []int64 `json:"latencies_ns"`
	Route       string  `json:"route"`
	Error       string  `json:"error,omitempty"`
}

// fleetLine is one line a sender child writes: a phase it reached, its
// outcomes, or why it failed.
type fleetLine struct {
	Phase    string         `json:"phase"` // resolved, ready, done
	Outcomes []fleetOutcome `json:"outcomes,omitempty"`
	Error    string         `json:"error,omitempty"`
}

// newFleetSenderCmd is the hidden sender child of the fleet benchmark: it
// reads a fleetJob, publishes its record ("joined"), on "resolve" resolves
// its receivers through etcd ("resolved"), and on "warm"
// fills its sources and moves each request once, unrecorded, on "run" its
// whole job.
func newFleetSenderCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "fleet-sender",
		Short:  "Sender child of 'bounce bench --senders N --receivers M' (internal)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			out := json.NewEncoder(cmd.OutOrStdout())
			err = fleetSender(cmd, l.Config, bufio.NewScanner(cmd.InOrStdin()), out)
			if err != nil {
				out.Encode(fleetLine{Phase: "failed", Error: err.Error()})
			}
			return err
		},
	}
	configFlags(cmd)
	return cmd
}

func fleetSender(cmd *cobra.Command, cfg config.Config, in *bufio.Scanner, out *json.Encoder) error {
	in.Buffer(make([]byte, 1<<20), 16<<20)
	if !in.Scan() {
		return errors.New("fleet-sender: no job on stdin")
	}
	var job fleetJob
	if err := json.Unmarshal(in.Bytes(), &job); err != nil {
		return fmt.Errorf("fleet-sender: job: %w", err)
	}
	spec := workload.Spec{DescSize: job.DescSize, Count: job.Count, Fragmented: job.Fragmented}
	if err := spec.Validate(); err != nil {
		return err
	}
	rt, err := parseRoute(job.Route)
	if err != nil {
		return err
	}
	log := logger(cmd, cfg.Log)
	n, err := node.Build(cfg, factories(), log)
	if err != nil {
		return err
	}
	defer n.Close(context.Background())
	own, err := n.Agent.Descriptor()
	if err != nil {
		return err
	}
	line, _ := json.Marshal(hello{Name: n.Agent.Name(), Descriptor: base64.StdEncoding.EncodeToString(own)})
	ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Minute)
	defer cancel()
	in2, err := join(ctx, cfg, n, log, line, nil)
	if err != nil {
		return err
	}
	if in2 == nil {
		return errors.New("fleet-sender: needs discovery.kind etcd")
	}
	defer in2.close()
	// Its record is published: the receivers admit it (they follow it)
	// before it loads one of them, so its first connections (opened at
	// LoadPeer) are never refused for a key not yet admitted.
	out.Encode(fleetLine{Phase: "joined"})
	if !in.Scan() {
		return errors.New("fleet-sender: stdin closed before resolve")
	}
	if c := strings.TrimSpace(in.Text()); c != "resolve" {
		return fmt.Errorf("fleet-sender: command %q before resolve", c)
	}
	per := spec.Bytes()
	// One leg per receiver; each slot of a leg is a closed loop of its
	// own (its request moved again and again until the job's duration is
	// over, once when it is 0), so every request of the job is in flight
	// at once and a leg's throughput has the granularity of one request.
	type slot struct {
		d    *driver.Driver
		tgt  driver.Target
		seed uint64
	}
	type leg struct {
		peer  string
		slots []slot
	}
	var legs []leg
	defer func() {
		for _, l := range legs {
			for _, sl := range l.slots {
				sl.d.Close()
			}
		}
	}()
	for _, t := range job.Targets {
		rec, err := in2.peers.Resolve(ctx, t.Peer)
		if err != nil {
			return err
		}
		h, _, err := parseHello(rec.Value)
		if err != nil {
			return fmt.Errorf("receiver %s: %w", t.Peer, err)
		}
		if uint64(t.Start+t.Count)*per > h.BufferLen {
			return fmt.Errorf("receiver %s: slots %d+%d exceed its %d-byte buffer", t.Peer, t.Start, t.Count, h.BufferLen)
		}
		l := leg{peer: t.Peer}
		for i := range t.Count {
			buf := h.buffer()
			buf.Addr += uint64(t.Start+i) * per
			buf.Len = per
			d, err := driver.New(n.Agent, per)
			if err != nil {
				return err
			}
			l.slots = append(l.slots, slot{d: d, tgt: driver.Target{Peer: h.Name, Buffer: buf}, seed: t.Seed + uint64(i)})
		}
		legs = append(legs, l)
	}
	out.Encode(fleetLine{Phase: "resolved"})
	runAll := func(warm bool) []fleetOutcome {
		res := make([]fleetOutcome, len(legs))
		// A leg's time runs from its first submit to its last completion
		// (driver.Run's Elapsed ends at its last completion), so the
		// source fill before the first submit is not counted.
		first, last := make([]time.Time, len(legs)), make([]time.Time, len(legs))
		var mu sync.Mutex
		var wg sync.WaitGroup
		began := time.Now()
		for i, l := range legs {
			res[i].Peer = l.peer
			for _, sl := range l.slots {
				wg.Go(func() {
					s := spec
					s.Seed = sl.seed
					for {
						// The warm-up fills every slot's source and moves it
						// once; measured runs find the bytes in place.
						r, err := sl.d.Run(ctx, sl.tgt, driver.Options{Spec: s, Requests: 1, Route: rt, Prefilled: !warm})
						if err == nil && r.FirstErr != nil {
							err = r.FirstErr
						}
						mu.Lock()
						o := &res[i]
						o.Requests += r.Requests
						o.Failed += r.Failed
						o.Bytes += r.Bytes
						o.Route = r.Route
						for _, d := range r.Latencies {
							o.LatenciesNS = append(o.LatenciesNS, int64(d))
						}
						end := time.Now()
						if st := end.Add(-r.Elapsed); first[i].IsZero() || st.Before(first[i]) {
							first[i] = st
						}
						if end.After(last[i]) {
							last[i] = end
						}
						o.ElapsedNS = int64(last[i].Sub(first[i]))
						if err != nil && o.Error == "" {
							o.Error = err.Error()
						}
						mu.Unlock()
						if err != nil || warm || time.Since(began) >= job.Duration {
							return
						}
					}
				})
			}
		}
		wg.Wait()
		return res
	}
	for in.Scan() {
		switch c := strings.TrimSpace(in.Text()); c {
		case "warm":
			for _, o := range runAll(true) {
				if o.Error != "" {
					return fmt.Errorf("warm-up to %s: %s", o.Peer, o.Error)
				}
			}
			out.Encode(fleetLine{Phase: "ready"})
		case "run":
			out.Encode(fleetLine{Phase: "done", Outcomes: runAll(false)})
		case "quit":
			return nil
		default:
			return fmt.Errorf("fleet-sender: unknown command %q (warm, run, quit)", c)
		}
	}
	return in.Err()
}

// fleetChild is a fleet-sender child process and its output lines.
type fleetChild struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan []byte
}

func startFleetSender(name string, args []string, stderr io.Writer) (*fleetChild, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	c := &fleetChild{name: name, cmd: exec.Command(exe, append([]string{"fleet-sender"}, args...)...), lines: make(chan []byte, 4)}
	c.cmd.Stderr = stderr
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start sender %s: %w", name, err)
	}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			c.lines <- append([]byte(nil), sc.Bytes()...)
		}
	}()
	return c, nil
}

// send writes one line to the child.
func (c *fleetChild) send(line []byte) error {
	if _, err := c.stdin.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("sender %s: %w", c.name, err)
	}
	return nil
}

// await reads the child's next line, which must reach phase.
func (c *fleetChild) await(phase string, timeout time.Duration) (fleetLine, error) {
	select {
	case b, ok := <-c.lines:
		if !ok {
			return fleetLine{}, fmt.Errorf("sender %s exited before %s", c.name, phase)
		}
		var l fleetLine
		if err := json.Unmarshal(b, &l); err != nil {
			return fleetLine{}, fmt.Errorf("sender %s: line %q: %w", c.name, b, err)
		}
		if l.Phase != phase {
			return l, fmt.Errorf("sender %s: %s (wanted %s)", c.name, l.Error, phase)
		}
		return l, nil
	case <-time.After(timeout):
		return fleetLine{}, fmt.Errorf("sender %s: not %s within %v", c.name, phase, timeout)
	}
}

// close asks the child to quit, then kills it after a grace period.
func (c *fleetChild) close() {
	_ = c.send([]byte("quit"))
	c.stdin.Close()
	done := make(chan struct{})
	go func() { c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		c.cmd.Process.Kill()
		<-done
	}
}

// fleetReport is the fleet benchmark's result (--json).
type fleetReport struct {
	Senders    int           `json:"senders"`
	Receivers  int           `json:"receivers"`
	Pattern    string        `json:"pattern"`
	Etcd       string        `json:"etcd"`
	DescSize   uint64        `json:"desc_size"`
	Count      int           `json:"count"`
	Fragmented bool          `json:"fragmented"`
	Duration   time.Duration `json:"duration_ns"`
	Requests   int           `json:"requests"`
	Bytes      uint64        `json:"bytes"`
	ElapsedNS  int64         `json:"elapsed_ns"`
	P50NS      int64         `json:"p50_ns"`
	P90NS      int64         `json:"p90_ns"`
	P99NS      int64         `json:"p99_ns"`
	MaxNS      int64         `json:"max_ns"`
	Verified   bool          `json:"verified"`
	PerRecv    []fleetRecvOf `json:"receivers_detail"`
}

// fleetRecvOf is one receiver's share: each sender's throughput into it
// and their max/min ratio.
type fleetRecvOf struct {
	Name     string             `json:"name"`
	Bytes    uint64             `json:"bytes"`
	Verified int                `json:"verified_requests"`
	Fairness float64            `json:"fairness_max_over_min"`
	Senders  map[string]float64 `json:"sender_bytes_per_second"`
}

// runFleet is `bounce bench --senders N --receivers M`: M receiver and N
// sender processes on this machine, all found through etcd (the one
// configured with discovery.kind etcd, else an embedded one), every
// sender's requests moved at once, every byte verified.
func runFleet(cmd *cobra.Command, cfg config.Config, o *benchOptions) error {
	f := o.fleet
	out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
	plan, err := planFleet(f.senders, f.receivers, f.perSender, f.pattern, o.seed)
	if err != nil {
		return usage(err)
	}
	if _, err := parseRoute(f.route); err != nil {
		return err
	}
	if o.peer != "" {
		return usage(errors.New("--peer: the fleet benchmark starts its own receivers"))
	}
	if len(o.workloads) != 1 && cmd.Flags().Changed("workload") {
		return usage(fmt.Errorf("--workload: the fleet benchmark moves one workload, got %d", len(o.workloads)))
	}
	if o.layout == "both" {
		return usage(errors.New("--layout both: the fleet benchmark takes fragmented or contiguous"))
	}
	wf := workloadFlags{preset: o.workloads[0], descSize: o.descSize, count: o.count, contiguous: o.layout == "contiguous", seed: o.seed, requests: 1}
	spec, err := wf.spec()
	if err != nil {
		return err
	}
	per := spec.Bytes()
	budget, err := parseSize(o.maxBytes)
	if err != nil {
		return usage(fmt.Errorf("--max-bytes: %w", err))
	}
	if total := per * uint64(f.senders*f.perSender); total > budget {
		return usage(fmt.Errorf("the fleet moves %s (%d senders x %d requests x %s), over --max-bytes %s (each byte is held on both sides)",
			benchreport.FormatSize(total), f.senders, f.perSender, benchreport.FormatSize(per), benchreport.FormatSize(budget)))
	}

	// The directory: the configured etcd, or one embedded in this process.
	dc := cfg.Discovery
	where := dc.Endpoints
	if dc.Kind != "etcd" {
		dir, err := os.MkdirTemp("", "bounce-bench-etcd-")
		if err != nil {
			return runtime(err)
		}
		defer os.RemoveAll(dir)
		srv, err := etcd.StartServer(dir, 60*time.Second)
		if err != nil {
			return runtime(err)
		}
		defer srv.Close()
		// An etcd of this process on loopback, for this run only: no
		// TLS, no users (discovery.insecure for its agents).
		dc.Kind, dc.Endpoints, dc.Insecure, where = "etcd", srv.Endpoint, true, srv.Endpoint+" (embedded)"
	}
	prefix := strings.TrimSuffix(dc.Prefix, "/") + fmt.Sprintf("/bench-%d", os.Getpid())
	base := append(configArgs(cmd, "agent.name", "telemetry.service-name", "telemetry.metrics.listen",
		"discovery.kind", "discovery.endpoints", "discovery.prefix", "discovery.insecure"),
		"--discovery.kind=etcd", "--discovery.endpoints="+dc.Endpoints, "--discovery.prefix="+prefix, fmt.Sprintf("--discovery.insecure=%t", dc.Insecure))
	if cfg.ControlPlane.BindAddress == "" && cfg.ControlPlane.Interface == "" {
		base = append(base, "--control-plane.bind-address=127.0.0.1")
	}
	if n, raise := fleetConnsPerHost(f.senders, f.receivers, cfg.Security.MaxControlConnsPerHost); raise {
		base = append(base, "--"+config.FlagName("security.max_control_conns_per_host")+"="+strconv.Itoa(n))
	}
	sname := func(s int) string { return fmt.Sprintf("send-%d", s) }
	rname := func(k int) string { return fmt.Sprintf("recv-%d", k) }
	var senderNames []string
	for s := range f.senders {
		senderNames = append(senderNames, sname(s))
	}
	rounds := "once"
	if o.duration > 0 {
		rounds = "again and again for " + o.duration.String()
	}
	fmt.Fprintf(out, "bounce bench: fleet of %d senders x %d receivers through etcd at %s, prefix %s; %s, %d requests per sender (%s each, %s) moved %s, route %s\n",
		f.senders, f.receivers, where, prefix, f.pattern, f.perSender, benchreport.FormatSize(per), layoutName(spec), rounds, f.route)

	// Every child opens the same etcd: its one warning about that etcd
	// (no TLS or users) is printed once, not once per process.
	logs := &fleetLogs{w: errw, once: []string{etcd.InsecureWarning}}
	var recvs []*receiver
	defer func() {
		for _, r := range recvs {
			r.close()
		}
	}()
	for k := range f.receivers {
		size := max(uint64(plan.slots[k])*per, 1<<20)
		args := append(slices.Clone(base), "--agent.name="+rname(k), "--buffer-size="+config.Size(size).String(), "--follow="+strings.Join(senderNames, ","))
		r, err := startReceiver(args, logs.child(), 60*time.Second)
		if err != nil {
			return runtime(fmt.Errorf("receiver %s: %w", rname(k), err))
		}
		recvs = append(recvs, r)
	}
	var sends []*fleetChild
	defer func() {
		for _, c := range sends {
			c.close()
		}
	}()
	for s := range f.senders {
		job := fleetJob{DescSize: spec.DescSize, Count: spec.Count, Fragmented: spec.Fragmented, Route: f.route, Duration: o.duration}
		for k := range f.receivers {
			if c := plan.count[s][k]; c > 0 {
				job.Targets = append(job.Targets, fleetTarget{Peer: rname(k), Start: plan.start[s][k], Count: c, Seed: fleetSeed(o.seed, k) + uint64(plan.start[s][k])})
			}
		}
		c, err := startFleetSender(sname(s), append(slices.Clone(base), "--agent.name="+sname(s)), logs.child())
		if err != nil {
			return runtime(err)
		}
		sends = append(sends, c)
		b, _ := json.Marshal(job)
		if err := c.send(b); err != nil {
			return runtime(err)
		}
	}
	for _, c := range sends {
		if _, err := c.await("joined", 2*time.Minute); err != nil {
			return failed(err)
		}
	}
	// Every receiver admits every sender (it follows their records) before
	// a sender loads a receiver (its first connection) and before a byte
	// moves.
	deadline := time.Now().Add(2 * time.Minute)
	for k, r := range recvs {
		for {
			rep, err := r.call(command{Op: "known", Peers: senderNames}, 30*time.Second)
			if err != nil {
				return failed(err)
			}
			if len(rep.Known) == len(senderNames) {
				break
			}
			if time.Now().After(deadline) {
				return failed(fmt.Errorf("receiver %s admitted only %v of %v within 2m", rname(k), rep.Known, senderNames))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, c := range sends {
		if err := c.send([]byte("resolve")); err != nil {
			return runtime(err)
		}
	}
	for _, c := range sends {
		if _, err := c.await("resolved", 2*time.Minute); err != nil {
			return failed(err)
		}
	}
	for _, phase := range []string{"warm", "run"} {
		for _, c := range sends {
			if err := c.send([]byte(phase)); err != nil {
				return runtime(err)
			}
		}
		if phase == "warm" {
			for _, c := range sends {
				if _, err := c.await("ready", 10*time.Minute); err != nil {
					return failed(err)
				}
			}
		}
	}
	outcomes := make([][]fleetOutcome, f.senders)
	for s, c := range sends {
		l, err := c.await("done", 10*time.Minute)
		if err != nil {
			return failed(err)
		}
		outcomes[s] = l.Outcomes
	}

	rep := fleetReport{Duration: o.duration, Senders: f.senders, Receivers: f.receivers, Pattern: f.pattern, Etcd: where, DescSize: spec.DescSize, Count: spec.Count, Fragmented: spec.Fragmented, Verified: true}
	var lat []time.Duration
	var firstErr error
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "receiver\tsender\trequests\tfailed\tbytes\tthroughput\tp50\tp99\troute")
	per0 := map[string]map[string]float64{}
	var slowest time.Duration
	toRecv := map[string]int{} // requests each receiver was sent
	for s, ocs := range outcomes {
		for _, oc := range ocs {
			var ls []time.Duration
			for _, ns := range oc.LatenciesNS {
				ls = append(ls, time.Duration(ns))
			}
			slices.Sort(ls)
			lat = append(lat, ls...)
			slowest = max(slowest, time.Duration(oc.ElapsedNS))
			tp := 0.0
			if oc.ElapsedNS > 0 {
				tp = float64(oc.Bytes) / time.Duration(oc.ElapsedNS).Seconds()
			}
			if per0[oc.Peer] == nil {
				per0[oc.Peer] = map[string]float64{}
			}
			per0[oc.Peer][sname(s)] = tp
			rep.Requests += oc.Requests
			rep.Bytes += oc.Bytes
			toRecv[oc.Peer] += oc.Requests
			if (oc.Failed > 0 || oc.Error != "") && firstErr == nil {
				firstErr = fmt.Errorf("%s -> %s: %d of %d requests failed: %s", sname(s), oc.Peer, oc.Failed, oc.Requests, oc.Error)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%v\t%v\t%s\n", oc.Peer, sname(s), oc.Requests, oc.Failed, benchreport.FormatSize(oc.Bytes),
				benchreport.FormatRate(tp), driver.Percentile(ls, 50).Round(10*time.Microsecond), driver.Percentile(ls, 99).Round(10*time.Microsecond), oc.Route)
		}
	}
	tw.Flush()
	slices.Sort(lat)
	rep.ElapsedNS = int64(slowest)
	rep.P50NS, rep.P90NS, rep.P99NS, rep.MaxNS = int64(driver.Percentile(lat, 50)), int64(driver.Percentile(lat, 90)), int64(driver.Percentile(lat, 99)), int64(driver.Percentile(lat, 100))

	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "receiver\tsenders\tbytes\tverified\tfairness (max/min throughput of its senders)")
	worst := 0.0
	for k, r := range recvs {
		rr := fleetRecvOf{Name: rname(k), Bytes: uint64(plan.slots[k]) * per, Senders: per0[rname(k)]}
		verified := "-"
		if plan.slots[k] > 0 {
			c := verifyCommand(spec, plan.slots[k])
			c.Seed = fleetSeed(o.seed, k)
			vr, err := r.call(c, 5*time.Minute)
			if err != nil {
				rep.Verified = false
				verified = "NO: " + err.Error()
				if firstErr == nil {
					firstErr = fmt.Errorf("receiver %s: %w", rname(k), err)
				}
			} else {
				rr.Verified = vr.Verified
				// Each request slot holds the last request written to it:
				// its bytes are checked; the count sent says how many came.
				verified = fmt.Sprintf("every byte (%d requests received; the last in each of its %d slots checked)", toRecv[rname(k)], vr.Verified)
			}
		}
		lo, hi := 0.0, 0.0
		for _, tp := range rr.Senders {
			if lo == 0 || tp < lo {
				lo = tp
			}
			hi = max(hi, tp)
		}
		if lo > 0 {
			rr.Fairness = hi / lo
			worst = max(worst, rr.Fairness)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%.2f\n", rr.Name, len(rr.Senders), benchreport.FormatSize(rr.Bytes), verified, rr.Fairness)
		rep.PerRecv = append(rep.PerRecv, rr)
	}
	tw.Flush()
	fmt.Fprintf(out, "fleet: %d requests, %s in %v (%s aggregate); request latency p50 %v, p90 %v, p99 %v, max %v; worst per-receiver fairness %.2f\n",
		rep.Requests, benchreport.FormatSize(rep.Bytes), slowest.Round(time.Millisecond), benchreport.FormatRate(float64(rep.Bytes)/slowest.Seconds()),
		time.Duration(rep.P50NS).Round(10*time.Microsecond), time.Duration(rep.P90NS).Round(10*time.Microsecond),
		time.Duration(rep.P99NS).Round(10*time.Microsecond), time.Duration(rep.MaxNS).Round(10*time.Microsecond), worst)
	if o.jsonPath != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(o.jsonPath, append(b, '\n'), 0o644); err != nil {
			return runtime(err)
		}
	}
	if firstErr != nil {
		return failed(firstErr)
	}
	return nil
}

func layoutName(s workload.Spec) string {
	if s.Fragmented {
		return "fragmented"
	}
	return "contiguous"
}

// fleetLogs passes the fleet's child processes' stderr lines through to w,
// except that a line containing one of once is printed only the first time
// any child writes it.
type fleetLogs struct {
	mu   sync.Mutex
	w    io.Writer
	once []string
	seen map[string]bool
}

// child returns the stderr of one child process.
func (l *fleetLogs) child() io.Writer { return &fleetLogLines{l: l} }

// fleetLogLines is one child's stderr: bytes up to a newline are held, then
// the line goes to its fleetLogs.
type fleetLogLines struct {
	l    *fleetLogs
	part []byte
}

func (c *fleetLogLines) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			c.part = append(c.part, b...)
			break
		}
		line := append(c.part, b[:i+1]...)
		c.part = nil
		b = b[i+1:]
		c.l.line(line)
	}
	return n, nil
}

func (l *fleetLogs) line(b []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.once {
		if bytes.Contains(b, []byte(s)) {
			if l.seen[s] {
				return
			}
			if l.seen == nil {
				l.seen = map[string]bool{}
			}
			l.seen[s] = true
		}
	}
	_, _ = l.w.Write(b)
}
