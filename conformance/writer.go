package conformance

import (
	"errors"
	"fmt"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

// WriterFixture is what a WriterFactory returns: a fresh writer, the peer
// it writes to, and the ways to make memory readable locally and writable
// at the peer.
type WriterFixture struct {
	Writer transfer.Writer
	// Peer is the peer argument of every Write.
	Peer string
	// RegisterSource makes local memory readable by Write.
	RegisterSource func(d transfer.Desc) error
	// Grant makes memory writable at Peer (registered there and, if the
	// writer needs it, announced to the writer).
	Grant func(d transfer.Desc) error
	// Alloc, if set, provides the host memory the suite uses; nil means
	// mem.Alloc.
	Alloc AllocFunc
	// Memory is the memory the rules write from and into; the zero value
	// is host memory.
	Memory Memory
	// Cleanup, if set, releases the writer and its peer after each rule.
	Cleanup func()
}

// WriterFactory returns a fresh WriterFixture for one rule.
type WriterFactory func() (WriterFixture, error)

// Writer runs the writer rules against fixtures from newFixture as
// subtests of t.
func Writer(t *testing.T, newFixture WriterFactory, cfg Config) {
	t.Helper()
	writerSuite(newFixture).test(t, cfg)
}

// CheckWriter runs the writer rules and returns the report.
func CheckWriter(newFixture WriterFactory, cfg Config) Report {
	return writerSuite(newFixture).check(cfg)
}

func writerSuite(newFixture WriterFactory) suite[*writeRig] {
	return suite[*writeRig]{
		kind:  "writer",
		rules: dataRules("writer", "write", func(_ *rc, w *writeRig) (rig, error) { return w, nil }),
		open: func() (opened[*writeRig], error) {
			if newFixture == nil {
				return opened[*writeRig]{}, errors.New("nil WriterFactory")
			}
			f, err := newFixture()
			if err != nil {
				return opened[*writeRig]{}, err
			}
			cleanup := f.Cleanup
			if cleanup == nil {
				cleanup = func() {}
			}
			if f.Memory.Unavailable != "" {
				return opened[*writeRig]{cleanup: cleanup, memory: f.Memory}, nil
			}
			if f.Writer == nil || f.RegisterSource == nil || f.Grant == nil {
				return opened[*writeRig]{cleanup: cleanup}, errors.New("WriterFixture.Writer, RegisterSource or Grant is nil")
			}
			w := f.Writer
			return opened[*writeRig]{
				f: &writeRig{
					regSrc: f.RegisterSource,
					regDst: f.Grant,
					write: func(src, dst transfer.Desc) (transfer.Op, error) {
						return w.Write(f.Peer, src, dst)
					},
				},
				cleanup: cleanup,
				alloc:   f.Alloc,
				memory:  f.Memory,
				subject: fmt.Sprintf("%T", w),
			}, nil
		},
	}
}
