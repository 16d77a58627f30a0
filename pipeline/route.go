package pipeline

import (
	"fmt"

	"github.com/bouncekv/bounce/pipeline/plan"
	"github.com/bouncekv/bounce/transfer"
)

// route decides bounce or direct and says why: a low-cardinality reason
// (for metrics and span attributes) and the text for logs and summaries.
func (a *Agent) route(req Request, pi *peerInfo) (Route, string, string) {
	if req.Route == RouteDirect {
		return RouteDirect, whyDirectRequested, "direct route requested"
	}
	if !a.bounceOn {
		return RouteDirect, whyLocalOff, "bounce off locally: " + a.noBounce
	}
	if !pi.bounce {
		return RouteDirect, whyPeerNotCapable, "peer not bounce-capable: " + pi.reason
	}
	n := len(req.Src)
	if n == 0 {
		return RouteDirect, whyEmpty, "empty transfer"
	}
	if !uniform(req.Src) || !uniform(req.Dst) {
		return RouteDirect, whyMixedDevices, "descriptors span several devices on one side"
	}
	if k := req.Src[0].Kind; !transfer.Handles(a.set.Gatherer, k) {
		return RouteDirect, whyMemoryKind, fmt.Sprintf("the gather stage cannot read %s memory", k)
	}
	if req.Route == RouteBounce {
		return RouteBounce, whyBounceRequested, "bounce route requested"
	}
	if n < a.cfg.MinDescriptors {
		return RouteDirect, whyFewDescriptors, fmt.Sprintf("%d descriptors < min_descriptors %d", n, a.cfg.MinDescriptors)
	}
	var total uint64
	for _, d := range req.Src {
		total += d.Len
	}
	if avg := total / uint64(n); avg > a.cfg.MaxAvgDescriptor {
		return RouteDirect, whyLargeDescriptors, fmt.Sprintf("average descriptor %d B > max_avg_descriptor %d B", avg, a.cfg.MaxAvgDescriptor)
	}
	return RouteBounce, whyEligible, "eligible"
}

// checkKinds refuses, before anything moves, a request whose memory the
// route's first stage cannot touch: the engine reads the sources and
// writes the destinations of the direct path; the gather stage reads the
// sources of the bounce path (the peer's scatter stage checks the
// destinations against its own memory).
func (a *Agent) checkKinds(route Route, req Request) error {
	if route == RouteBounce {
		return transfer.CheckKinds(a.set.Gatherer, "the gather stage", req.Src)
	}
	if err := transfer.CheckKinds(a.set.Engine, "the engine", req.Src); err != nil {
		return err
	}
	return transfer.CheckKinds(a.set.Engine, "the engine", req.Dst)
}

func uniform(ds []transfer.Desc) bool {
	for _, d := range ds[1:] {
		if d.Device != ds[0].Device || d.Kind != ds[0].Kind {
			return false
		}
	}
	return true
}

func (a *Agent) plan(req Request) (*plan.Plan, error) {
	p, err := plan.Build(req.Src, req.Dst, plan.Options{MaxChunk: a.cfg.MaxChunk, MinChunk: a.cfg.MinChunk, NoMerge: a.cfg.DisableMerging})
	if err != nil {
		return nil, fmt.Errorf("pipeline: plan transfer to %q: %w", req.Peer, err)
	}
	return p, nil
}
