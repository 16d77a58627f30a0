package pipeline

import (
	"os"
	"runtime"
	"sync/atomic"
)

// Stats are the agent's counters since it started.
type Stats struct {
	BounceSubmits, DirectSubmits uint64
	Succeeded, Failed            uint64
	// Control messages that could not be sent (queue full, unknown peer),
	// DONE notices sent as engine notifications included.
	SendDrops uint64
	// Malformed or unexpected control messages dropped, by reason
	// (BadMessages counts engine notifications that were not a DONE too).
	// RejectedWants counts refused WANTs (a WANT conflicting with its live
	// flow included); DuplicateWants counts repeated WANTs of a live flow,
	// dropped without a reply.
	BadMessages, LateData, RejectedWants, BadRuns uint64
	DuplicateWants                                uint64
	// Peers kept on the direct path by the handshake, and peer descriptors
	// that failed to decode.
	IncompatiblePeers, BadPeerDescriptors uint64
	// Scatter failures (no ACK was sent).
	ScatterFailures uint64
	// Scatters cancelled before they started because their flow was
	// cancelled, expired or its peer forgotten (nothing was copied).
	CancelledScatters uint64
	// Flows reclaimed because their sender went silent (see FlowExpiry).
	ExpiredFlows uint64
	// Quarantines counts regions quarantined since the start (see
	// Config.Quarantine); QuarantinedRegions and QuarantinedBytes are the
	// regions (and their arena bytes) in quarantine now.
	Quarantines, QuarantinedRegions, QuarantinedBytes uint64
	// FencedReleases counts quarantined regions released early because the
	// engine fenced their lost sender (transfer.Fencer).
	FencedReleases uint64
	// Control messages dropped because their sender is not an admitted
	// peer, WANTs naming an endpoint other than the one in the peer's
	// descriptor (the descriptor's is used) or, for a peer not loaded, an
	// endpoint on another host than the WANT's, WANTs over the per-peer
	// rate, new flows over the per-peer flow limit, and WANTs refused a
	// reverse path over MaxControlPeersPerHost.
	Unadmitted, ForeignEndpoints, RateLimited, FlowLimited, HostLimited uint64
	// WANTs sent (cancels included), grants sent and bytes moved through
	// the bounce path.
	Wants, Grants, BounceBytes uint64
	// LostPeers counts the engine's reports of a peer that lost every
	// connection and the control channel's of a dropped connection
	// (transfer.PeerLossReporter); their flows were reclaimed.
	LostPeers uint64
	// Gauges, for leak checks: control peers the receiver opened from
	// WANT endpoints, receiver flows, and requests in flight (as of the
	// reactor's last periodic check, at most 10 ms old), and the process's
	// open file descriptors and goroutines (read by Stats).
	ControlPeers, Flows, Requests uint64
	OpenFDs, Goroutines           int
	// Receiver completion events produced (Received), and those dropped
	// because the consumer's channel was full.
	Events, DroppedEvents uint64
	// Fallbacks counts requests that could have taken the bounce path but
	// went direct (bounce off here, the peer's handshake, the gates);
	// BounceRefused counts requests that required bounce and were refused.
	Fallbacks, BounceRefused uint64
	// Requests route auto sent bounce and direct by its cost model.
	AutoBounce, AutoDirect uint64
	// Pulls counts this agent's pulls (PullRequest); PullsServed the
	// peers' pulls it served to the end and RefusedPulls those it refused
	// (memory not registered for the puller, limits, a bad request).
	Pulls, PullsServed, RefusedPulls uint64
	// PullReadOffers counts chunks this agent offered a puller to read
	// (STAGED) instead of writing them; PullReads the chunks this agent
	// read from holders' staged regions, FailedReads those reads that
	// failed (the pull failed with them).
	PullReadOffers, PullReads, FailedReads uint64
}

type counters struct {
	bounceSubmits, directSubmits                  atomic.Uint64
	succeeded, failed                             atomic.Uint64
	sendDrops                                     atomic.Uint64
	badMessages, lateData, rejectedWants, badRuns atomic.Uint64
	duplicateWants                                atomic.Uint64
	// blockTableChecks counts block-table WANTs whose ids were checked
	// (the O(ids) pass; read by tests, not exported).
	blockTableChecks                       atomic.Uint64
	incompatiblePeers, badPeerDesc         atomic.Uint64
	scatterFailures, expiredFlows          atomic.Uint64
	cancelledScatters                      atomic.Uint64
	quarantines                            atomic.Uint64
	fencedReleases                         atomic.Uint64
	quarantinedRegions, quarantinedBytes   atomic.Uint64
	unadmitted, foreignEndpoints           atomic.Uint64
	rateLimited, flowLimited, hostLimited  atomic.Uint64
	wants, grants, bounceBytes             atomic.Uint64
	lostPeers                              atomic.Uint64
	controlPeers, flows, requests          atomic.Uint64
	events, droppedEvents                  atomic.Uint64
	fallbacks, bounceRefused               atomic.Uint64
	autoBounce, autoDirect                 atomic.Uint64
	pulls, pullsServed, refusedPulls       atomic.Uint64
	pullReadOffers, pullReads, failedReads atomic.Uint64
}

// Stats returns a snapshot of the agent's counters.
func (a *Agent) Stats() Stats {
	c := &a.stats
	return Stats{
		BounceSubmits: c.bounceSubmits.Load(), DirectSubmits: c.directSubmits.Load(),
		Succeeded: c.succeeded.Load(), Failed: c.failed.Load(),
		SendDrops:   c.sendDrops.Load(),
		BadMessages: c.badMessages.Load(), LateData: c.lateData.Load(), RejectedWants: c.rejectedWants.Load(), BadRuns: c.badRuns.Load(),
		DuplicateWants:    c.duplicateWants.Load(),
		IncompatiblePeers: c.incompatiblePeers.Load(), BadPeerDescriptors: c.badPeerDesc.Load(),
		ScatterFailures: c.scatterFailures.Load(), ExpiredFlows: c.expiredFlows.Load(), CancelledScatters: c.cancelledScatters.Load(),
		FencedReleases: c.fencedReleases.Load(),
		Quarantines:    c.quarantines.Load(), QuarantinedRegions: c.quarantinedRegions.Load(), QuarantinedBytes: c.quarantinedBytes.Load(),
		Unadmitted: c.unadmitted.Load(), ForeignEndpoints: c.foreignEndpoints.Load(),
		RateLimited: c.rateLimited.Load(), FlowLimited: c.flowLimited.Load(), HostLimited: c.hostLimited.Load(),
		Wants: c.wants.Load(), Grants: c.grants.Load(), BounceBytes: c.bounceBytes.Load(),
		LostPeers:    c.lostPeers.Load(),
		ControlPeers: c.controlPeers.Load(), Flows: c.flows.Load(), Requests: c.requests.Load(),
		OpenFDs: openFDs(), Goroutines: runtime.NumGoroutine(),
		Events: c.events.Load(), DroppedEvents: c.droppedEvents.Load(),
		Fallbacks: c.fallbacks.Load(), BounceRefused: c.bounceRefused.Load(),
		AutoBounce: c.autoBounce.Load(), AutoDirect: c.autoDirect.Load(),
		Pulls: c.pulls.Load(), PullsServed: c.pullsServed.Load(), RefusedPulls: c.refusedPulls.Load(),
		PullReadOffers: c.pullReadOffers.Load(), PullReads: c.pullReads.Load(), FailedReads: c.failedReads.Load(),
	}
}

// openFDs counts this process's open file descriptors (-1 where /proc is
// not available).
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents) - 1 // the directory ReadDir opened
}
