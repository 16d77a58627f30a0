package tcp

import (
	"container/list"
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
}

func newFenceSet(hold time.Duration, max int) *fenceSet {
	return &fenceSet{hold: hold, max: max, order: list.New(), byKey: make(map[string]*list.Element)}
}

// add fences name from now for the hold (a name already held starts its
// hold again). It returns how many names it dropped before their hold
// ended to keep the set within max.
func (f *fenceSet) add(name string, now time.Time) (evicted int) {
	f.prune(now)
	if el, ok := f.byKey[name]; ok {
		el.Value.(*fenceEntry).until = now.Add(f.hold)
		f.order.MoveToBack(el)
		return 0
	}
	f.byKey[name] = f.order.PushBack(&fenceEntry{name: name, until: now.Add(f.hold)})
	for f.order.Len() > f.max {
		f.removeEl(f.order.Front())
		evicted++
	}
	return evicted
}

// has reports whether name is fenced at now.
func (f *fenceSet) has(name string, now time.Time) bool {
	f.prune(now)
	_, ok := f.byKey[name]
	return ok
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
