// Package writeset holds what the in-process engines (engines/loopback,
// engines/cudacopy) check the same way about the writes they post and
// the writes in flight into them: a post's shape, and whether memory may
// be deregistered while writes are in flight.
package writeset

import (
	"fmt"

	"github.com/bouncekv/bounce/transfer"
)

// Write is one posted operation an engine keeps in its in-flight sets.
type Write interface {
	comparable
	// Writes returns the operation's writes (not to be modified).
	Writes() []transfer.WriteOp
	// From names the engine that posted it, To the peer it writes into.
	From() string
	To() string
}

// CheckPost checks a post's shape before any registry is consulted: at
// least one write, every descriptor of a kind x declares
// (transfer.CheckKinds; host memory when x declares none), and every
// source as long as its destination and not empty (ErrOutOfBounds).
func CheckPost(x any, what string, ops []transfer.WriteOp) error {
	if len(ops) == 0 {
		return fmt.Errorf("no writes")
	}
	for i, w := range ops {
		if err := transfer.CheckKinds(x, what, []transfer.Desc{w.Src, w.Dst}); err != nil {
			return fmt.Errorf("write %d: %w", i, err)
		}
		if w.Src.Len == 0 || w.Src.Len != w.Dst.Len {
			return fmt.Errorf("write %d: source length %d, destination length %d: %w", i, w.Src.Len, w.Dst.Len, transfer.ErrOutOfBounds)
		}
	}
	return nil
}

// InUse reports (wrapping ErrInUse) why d may not be deregistered: it
// overlaps the source of a write in out (posted by the engine) or the
// destination of a write in in (targeting it). Nil when neither.
func InUse[W Write](d transfer.Desc, out, in map[W]struct{}) error {
	for o := range out {
		for _, w := range o.Writes() {
			if Overlaps(w.Src, d) {
				return fmt.Errorf("source of a write to %q in flight: %w", o.To(), transfer.ErrInUse)
			}
		}
	}
	for o := range in {
		for _, w := range o.Writes() {
			if Overlaps(w.Dst, d) {
				return fmt.Errorf("destination of a write from %q in flight: %w", o.From(), transfer.ErrInUse)
			}
		}
	}
	return nil
}

// Overlaps reports whether a and b share a byte.
func Overlaps(a, b transfer.Desc) bool { return a.Addr < b.Addr+b.Len && b.Addr < a.Addr+a.Len }
