package pipeline

import (
	"errors"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// fenceJob asks for a lost sender to be fenced so that the regions its
// flows held (offs, quarantined when the loss was reported) may be used
// again at once instead of after the quarantine.
type fenceJob struct {
	peer  string
	offs  []uint64
	until time.Time // the end of their quarantine
}

// peerFencer fences lost senders off the reactor's goroutine: the
// engine's ForgetPeer waits for the peer's connections to stop serving (a
// read into local memory included, and up to the engine's fence timeout
// for its outgoing ones), which the reactor must not wait for. Once
// ForgetPeer returned, no write of the peer lands any more (the engine
// refuses its connections for the quarantine: transfer.Fencer), so done
// may release the regions.
type peerFencer struct {
	eng  transfer.Engine
	jobs <-chan fenceJob
	quit <-chan struct{}
	done func(j fenceJob, fenced bool) // runs on this goroutine; posts to the reactor
}

// run serves jobs until quit is closed.
func (f *peerFencer) run() {
	for {
		select {
		case j := <-f.jobs:
			err := f.eng.ForgetPeer(j.peer)
			// An unknown peer has nothing left to cut, and is refused all
			// the same from now on.
			f.done(j, err == nil || errors.Is(err, transfer.ErrUnknownPeer))
		case <-f.quit:
			return
		}
	}
}
