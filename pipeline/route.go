package pipeline

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/bouncekv/bounce/pipeline/plan"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// ErrBounceUnavailable is Submit's refusal of a request that requires the
// bounce route (RouteBounce, or Config.Route bounce) but cannot take it; the
// error names the reason.
var ErrBounceUnavailable = errors.New("bounce route unavailable")

// route decides bounce or direct for a request that asked for want and says
// why: a low-cardinality reason (for metrics, span attributes and the
// once-per-peer fallback warning) and the text for logs and summaries.
func (a *Agent) route(s *submission) (Route, string, string) {
	req, pi, want := s.req, s.pi, s.want
	if want == RouteDirect {
		return RouteDirect, whyDirectRequested, "direct route requested"
	}
	n := req.count()
	if n == 0 {
		return RouteDirect, whyEmpty, "empty transfer"
	}
	if !a.bounceOn {
		return RouteDirect, whyLocalOff, "bounce off locally: " + a.noBounce
	}
	if !pi.bounce {
		return RouteDirect, whyPeerNotCapable, "peer " + strconv.Quote(pi.name) + " not bounce-capable: " + pi.reason
	}
	if !req.uniform() {
		return RouteDirect, whyMixedDevices, "descriptors span several devices on one side"
	}
	if k := req.srcKind(); !transfer.Handles(a.set.Gatherer, k) {
		return RouteDirect, whyMemoryKind, fmt.Sprintf("the gather stage cannot read %s memory", k)
	}
	if why, ok := a.gatherCannotReach(s); ok {
		return RouteDirect, whyMemoryKind, why
	}
	// Memory the engine cannot carry (device KV over a host engine) has
	// one way across: gather into the arena the engine does carry. The
	// descriptor gates and the cost model compare two routes; here there is
	// one.
	if k, ok := s.kinds.native, s.kinds.nativeMiss; ok {
		if transfer.Stages(a.set.Engine, k) {
			// The direct path would copy every descriptor through host
			// buffers on each side: the baseline bounce exists to beat.
			return RouteBounce, whyEngineKind, fmt.Sprintf("the engine carries %s memory only by staging each descriptor through host buffers; the bounce route stages it through the arena", k)
		}
		return RouteBounce, whyEngineKind, fmt.Sprintf("the engine cannot carry %s memory; the bounce route stages it through the arena", k)
	}
	if want == RouteBounce {
		return RouteBounce, whyBounceRequested, "bounce route requested"
	}
	if n < a.cfg.MinDescriptors {
		return RouteDirect, whyFewDescriptors, fmt.Sprintf("%d descriptors < bounce.min_descriptors %d", n, a.cfg.MinDescriptors)
	}
	total := req.bytes()
	if avg := total / uint64(n); avg > a.cfg.MaxAvgDescriptor {
		return RouteDirect, whyLargeDescriptors, fmt.Sprintf("average descriptor %s > bounce.max_avg_descriptor %s", sizeString(avg), sizeString(a.cfg.MaxAvgDescriptor))
	}
	return RouteBounce, whyEligible, "eligible"
}

// reacher is the optional capability of a gather stage whose reach depends
// on the memory itself, not on its kind alone (the cuda stage reads host
// memory only when it is pinned for the device): Reachable returns the
// registered range holding d and nil when the stage can read it, or why
// not.
type reacher interface {
	Reachable(d transfer.Desc) (transfer.Desc, error)
}

// gatherCannotReach says why the gather stage cannot read some source of
// req that the engine can carry on the direct path (pageable host memory
// for a device gather stage), so route auto does not pick a bounce route
// whose first gather would fail. Memory the direct path cannot carry
// either is left to the bounce route and its error. Each registered range
// is asked about once.
func (a *Agent) gatherCannotReach(s *submission) (string, bool) {
	r, ok := a.set.Gatherer.(reacher)
	if !ok || s.kinds.stagedMiss {
		return "", false
	}
	src := s.req.Src
	if br := s.req.Blocks; br != nil { // a pool's regions, each once
		src = make([]transfer.Desc, len(br.src.Pool.Regions))
		for i := range src {
			src[i] = br.src.Pool.Span(i)
		}
	}
	var last transfer.Desc
	for _, d := range src {
		if last.Len > 0 && last.Contains(d.Addr, d.Len) {
			continue
		}
		rng, err := r.Reachable(d)
		if err != nil {
			return fmt.Sprintf("the gather stage cannot read source %v: %v", d, err), true
		}
		last = rng
	}
	return "", false
}

// checkKinds refuses, before anything moves, a request whose memory the
// route's first stage cannot touch: the engine reads the sources and
// writes the destinations of the direct path; the gather stage reads the
// sources of the bounce path (the peer's scatter stage checks the
// destinations against its own memory).
func (a *Agent) checkKinds(route Route, s *submission) error {
	if route == RouteBounce {
		if br := s.req.Blocks; br != nil {
			return transfer.CheckKinds(a.set.Gatherer, "the gather stage", []transfer.Desc{br.src.Pool.Span(0)})
		}
		return transfer.CheckKinds(a.set.Gatherer, "the gather stage", s.req.Src)
	}
	if k, ok := s.kinds.staged, s.kinds.stagedMiss; ok {
		hint := "the bounce route can carry it only with stages that handle it (stages.gather and stages.scatter cuda) and bounce on at both ends"
		if a.bounceOn && transfer.Handles(a.set.Gatherer, k) {
			hint = "take the bounce route (it stages the memory through the arena)"
		}
		return fmt.Errorf("the direct path cannot carry %s memory: the engine cannot touch it; %s: %w", k, hint, transfer.ErrUnsupported)
	}
	return nil
}

// kindMiss is engineCannot's answer: the first memory kind of a request
// the engine cannot touch natively, and the first it cannot touch even by
// staging each descriptor through host buffers.
type kindMiss struct {
	native, staged         transfer.MemKind
	nativeMiss, stagedMiss bool
}

// engineCannot finds, in one pass over req's sources and destinations (or
// its two pools), the first memory kind the engine cannot touch: natively,
// and (staged) also by staging each descriptor through host buffers
// (transfer.StagedKinder).
func engineCannot(eng transfer.Engine, req Request) kindMiss {
	var native, staged [256]bool // by MemKind, resolved once: this runs per descriptor
	native[transfer.Host] = transfer.Handles(eng, transfer.Host)
	if mk, has := eng.(transfer.MemoryKinder); has {
		for _, k := range mk.MemoryKinds() {
			native[k] = true
		}
	}
	staged = native
	if sk, has := eng.(transfer.StagedKinder); has {
		for _, k := range sk.StagedMemoryKinds() {
			staged[k] = true
		}
	}
	var m kindMiss
	see := func(k transfer.MemKind) {
		if !m.nativeMiss && !native[k] {
			m.native, m.nativeMiss = k, true
		}
		if !m.stagedMiss && !staged[k] {
			m.staged, m.stagedMiss = k, true
		}
	}
	if br := req.Blocks; br != nil {
		if len(br.SrcIDs) > 0 {
			see(br.src.Pool.Kind)
			see(br.dst.Pool.Kind)
		}
		return m
	}
	for _, ds := range [][]transfer.Desc{req.Src, req.Dst} {
		for _, d := range ds {
			see(d.Kind)
			if m.nativeMiss && m.stagedMiss {
				return m
			}
		}
	}
	return m
}

// count is the request's descriptor count: its pieces in the block-table
// form, its segments (each a direct write at most) when converted.
func (req Request) count() int {
	if br := req.Blocks; br != nil {
		if br.conv != nil {
			return int(br.pieces()) * len(br.conv.Src.Segs)
		}
		return int(br.pieces())
	}
	return len(req.Src)
}

// bytes is the request's payload.
func (req Request) bytes() uint64 {
	if br := req.Blocks; br != nil {
		return br.pieces() * br.unitLen()
	}
	var total uint64
	for _, d := range req.Src {
		total += d.Len
	}
	return total
}

// uniform reports whether each side's memory is of one kind on one device
// (a pool always is).
func (req Request) uniform() bool {
	if req.Blocks != nil {
		return true
	}
	return uniform(req.Src) && uniform(req.Dst)
}

// srcKind is the memory kind of the request's first source (count > 0).
func (req Request) srcKind() transfer.MemKind {
	if br := req.Blocks; br != nil {
		return br.src.Pool.Kind
	}
	return req.Src[0].Kind
}

// fellBack counts a request that could have bounced but goes direct and
// warns about it once per peer and reason (why; a peer loaded again is
// warned about again). A direct route asked for, nothing to move, or route
// auto's cost model predicting direct faster (Stats.AutoDirect counts it)
// is no fallback.
func (a *Agent) fellBack(pi *peerInfo, why, reason string) {
	if why == whyEmpty || why == whyDirectRequested || why == whyCostModel {
		return
	}
	a.stats.fallbacks.Add(1)
	pi.warnMu.Lock()
	first := !pi.warned[why]
	if first {
		if pi.warned == nil {
			pi.warned = make(map[string]bool)
		}
		pi.warned[why] = true
	}
	pi.warnMu.Unlock()
	if first {
		a.log.Warn("transfers to this peer take the direct path, not bounce (warned once per peer and reason; counted in Stats.Fallbacks)", "peer", pi.name, "reason", reason)
	}
}

// sizeString renders a byte count in binary units ("16 MiB", "1.5 KiB",
// "512 B") for reasons people read.
func sizeString(n uint64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return strconv.FormatUint(n, 10) + " B"
	}
	v, u := float64(n)/1024, 0
	for v >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64) + " " + string(units[u]) + "iB"
}

func uniform(ds []transfer.Desc) bool {
	for _, d := range ds[1:] {
		if d.Device != ds[0].Device || d.Kind != ds[0].Kind {
			return false
		}
	}
	return true
}

// messageLimiter is a control channel that bounds the size of one message
// (nixlnotif, whose messages are engine notifications).
type messageLimiter = transfer.MessageLimiter

// traceAllowance is the room a DATA or WANT keeps for its traceparent (a
// W3C traceparent is 55 bytes) when messages are sized to a channel limit.
const traceAllowance = 256

// minControlMessage is the smallest control message limit bounce works
// with: a DATA of one strided run, a GRANT of one credit and a NACK with a
// reason, each with room for a traceparent.
func minControlMessage() int {
	return max(wire.DataOverhead(traceAllowance)+wire.StridedRunSize, wire.GrantOverhead+wire.CreditSize, 1024)
}

// scatterLimit bounds each chunk's scatter runs so that its DATA fits the
// control channel (no limit when the channel states none).
func (a *Agent) scatterLimit() plan.ScatterLimit {
	if a.ctrlMax == 0 {
		return plan.ScatterLimit{}
	}
	return plan.ScatterLimit{Bytes: a.ctrlMax - wire.DataOverhead(traceAllowance), Single: wire.SingleRunSize, Strided: wire.StridedRunSize}
}

// wantTooLarge says why p's WANT cannot travel on the control channel, or
// "" when it can. The request then takes the direct path.
func (a *Agent) wantTooLarge(p *plan.Plan) string {
	if a.ctrlMax == 0 {
		return ""
	}
	w := &wire.Want{ChunkBytes: p.ChunkBytes(), Endpoint: a.set.Control.LocalEndpoint(), Incarnation: a.inc}
	if _, dst, ok := p.BlockTables(); ok {
		// The longest pool name: the WANT's own is the peer's.
		w.Blocks = &wire.WantBlocks{Pool: strings.Repeat("p", wire.MaxPoolName), BlockLen: dst.Pool.BlockLen, Pieces: dst.Len(), IDs: dst.IDs}
		if _, ds, ok := p.Shapes(); ok {
			w.Blocks.Shape, w.Blocks.Pieces = &ds, uint64(p.Descs)
		}
	}
	n, err := wire.EncodedLen(w)
	if err == nil && n+traceAllowance <= a.ctrlMax {
		return ""
	}
	return fmt.Sprintf("WANT for %d chunks exceeds the %s control channel's %d-byte messages", len(p.Chunks), a.set.Control.Kind(), a.ctrlMax)
}

// plan lays req out in chunks (plan.Layout): validated, chunk sizes known,
// runs not yet emitted. The reactor fills each chunk just before its gather
// (sendReq.advance), so a WANT leaves after one cheap pass over the
// descriptors and the runs of later chunks are emitted while earlier ones
// move. A block-table request is planned as piece ranges (plan.LayoutBlocks):
// nothing per piece, nothing to fill.
func (a *Agent) plan(req Request) (*plan.Plan, error) {
	opt := plan.Options{MaxChunk: a.cfg.MaxChunk, MinChunk: a.cfg.MinChunk, NoMerge: a.cfg.DisableMerging, Scatter: a.scatterLimit()}
	var p *plan.Plan
	var err error
	if br := req.Blocks; br != nil && br.conv != nil {
		p, err = plan.LayoutShaped(br.src, br.dst, br.conv.Src, br.conv.Dst, opt)
	} else if br != nil {
		p, err = plan.LayoutBlocks(br.src, br.dst, opt)
	} else {
		p, err = plan.Layout(req.Src, req.Dst, opt)
	}
	if err != nil {
		return nil, fmt.Errorf("pipeline: plan transfer to %q: %w", req.Peer, err)
	}
	return p, nil
}
