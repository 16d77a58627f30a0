package certify

import (
	"maps"
	"slices"
)

// waivers lists, per built-in subject ("kind/name"), the rules it is known
// not to keep and why: each is skipped with its reason in the report, so a
// certification says plainly what the implementation does not promise.
var waivers = map[string]map[string]string{
	"engine/loopback": {
		"engine/blocks-geometry": "defect: loopback PostBlocks takes the destination's pool regions by the source table's regions (spans of w.Src.RegionsTouched applied to w.Dst), so a block write between tables of different region or id counts panics (index out of range in transfer.Pool.Span); tables of one shape, what the pipeline sends, pass every other block rule",
	},
	"engine/nixl": {
		"engine/target-forget":        "nixl (NIXL over UCX 1.13): invalidateRemoteMD on the target drops the peer's metadata but its UCX worker still serves the peer's puts, so target-side ForgetPeer is no fence and nixl is no transfer.Fencer; measured: a write posted after B.ForgetPeer(A) reports done",
		"engine/deregister-in-flight": "nixl (NIXL over UCX 1.13): the target's UCX copies to whatever registered address the writer names and deregisterMem does not wait for puts in flight, so deregistration is no fence; measured: 1 run in 3 saw a byte land after DeregisterMemory returned",
	},
}

// Waivers returns the rules the built-in implementation name of kind is
// known not to keep, sorted, and the reason for each (nil when none).
// bounce conformance skips them unless told not to.
func Waivers(kind, name string) ([]string, map[string]string) {
	w := waivers[kind+"/"+name]
	if w == nil {
		return nil, nil
	}
	return slices.Sorted(maps.Keys(w)), maps.Clone(w)
}
