package tcp

import (
	"container/list"
	"slices"
	"time"
)

// fenceSet holds the names ForgetPeer dropped, oldest first, each until
// its hold ends or LoadPeer loads the peer again. It is bounded two ways:
// by time (a name is dropped once its hold ended, so the set holds at most
// the names forgotten within one hold) and by count (past max the oldest
// goes early, which add reports). It is not safe for concurrent use; the
// engine holds its lock. Times come from the caller.
type fenceSet struct {
	hold  time.Duration
	max   int
	order *list.List // of *fenceEntry, oldest first (all holds are equal)
	byKey map[string]*list.Element
}

type fenceEntry struct {
	name  string
	until time.Time
	// incs are the incarnations of the peer refused (metadata.inc); nil
	// refuses every incarnation (one was unknown).
	incs []uint64
}

func newFenceSet(hold time.Duration, max int) *fenceSet {
	return &fenceSet{hold: hold, max: max, order: list.New(), byKey: make(map[string]*list.Element)}
}

// add fences the incarnations incs of name from now for the hold (a name
// already held starts its hold again, refusing its earlier incarnations
// too); no incs, or a zero (unknown) one, refuses every incarnation. It
// returns how many names it dropped before their hold ended to keep the
// set within max.
func (f *fenceSet) add(name string, incs []uint64, now time.Time) (evicted int) {
	f.prune(now)
	if len(incs) == 0 || slices.Contains(incs, 0) {
		incs = nil
	}
	if el, ok := f.byKey[name]; ok {
		e := el.Value.(*fenceEntry)
		e.until = now.Add(f.hold)
		if e.incs != nil && incs != nil {
			e.incs = append(e.incs, incs...)
		} else {
			e.incs = nil
		}
		f.order.MoveToBack(el)
		return 0
	}
	f.byKey[name] = f.order.PushBack(&fenceEntry{name: name, until: now.Add(f.hold), incs: slices.Clone(incs)})
	for f.order.Len() > f.max {
		f.removeEl(f.order.Front())
		evicted++
	}
	return evicted
}

// refuses reports whether name's incarnation inc is fenced at now: the
// name is held and inc is one of its fenced incarnations (or every one
// is, or inc is unknown: zero). A new incarnation of a fenced peer (a
// process restarted with its key) is not refused; its old one still is.
func (f *fenceSet) refuses(name string, inc uint64, now time.Time) bool {
	f.prune(now)
	el, ok := f.byKey[name]
	if !ok {
		return false
	}
	incs := el.Value.(*fenceEntry).incs
	return incs == nil || inc == 0 || slices.Contains(incs, inc)
}

// remove lifts the fence on name (LoadPeer loaded it again).
func (f *fenceSet) remove(name string) {
	if el, ok := f.byKey[name]; ok {
		f.removeEl(el)
	}
}

// len returns the number of names held.
func (f *fenceSet) len() int { return f.order.Len() }

// prune drops the names whose hold ended by now.
func (f *fenceSet) prune(now time.Time) {
	for el := f.order.Front(); el != nil && !now.Before(el.Value.(*fenceEntry).until); el = f.order.Front() {
		f.removeEl(el)
	}
}

func (f *fenceSet) removeEl(el *list.Element) {
	delete(f.byKey, el.Value.(*fenceEntry).name)
	f.order.Remove(el)
}
