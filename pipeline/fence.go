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
	inc   uint64    // the lost sender's incarnation (its WANTs'); 0: unknown
}

// fencedSender is a lost sender the engine fenced: until when its WANTs
// are dropped, and the incarnation they are dropped for (0: every one). A
// WANT of another incarnation is the sender restarted with its key: it is
// served at once (its engine admits that incarnation too).
type fencedSender struct {
	until time.Time
	inc   uint64
}

// refuses says whether f drops a WANT of incarnation inc.
func (f fencedSender) refuses(inc uint64) bool { return f.inc == 0 || inc == 0 || inc == f.inc }

// peerFencer fences lost senders off the reactor's goroutine: the
// engine's ForgetPeer waits for the peer's connections to stop serving (a
// read into local memory included, and up to the engine's fence timeout
// for its outgoing ones), which the reactor must not wait for. Once
// ForgetPeer returned, no write of the peer lands any more (the engine
// refuses its connections for the quarantine: transfer.Fencer), so done
// may release the regions.
//
// The reactor checked that the peer was only learned when it queued the
// job; claim checks again when the job runs, and holds off a LoadPeer of
// the peer until the fence is over: a peer loaded in between is not
// fenced (that would drop the engine state LoadPeer just set up).
type peerFencer struct {
	eng   transfer.Engine
	jobs  <-chan fenceJob
	quit  <-chan struct{}
	claim func(peer string) (end func(), ok bool)
	done  func(j fenceJob, fenced bool) // runs on this goroutine; posts to the reactor
}

// run serves jobs until quit is closed.
func (f *peerFencer) run() {
	for {
		select {
		case j := <-f.jobs:
			f.fence(j)
		case <-f.quit:
			return
		}
	}
}

// fence runs one job; done is told before a LoadPeer held off by the
// claim may start, so the reactor sees the fence before the load.
func (f *peerFencer) fence(j fenceJob) {
	end, ok := f.claim(j.peer)
	if !ok {
		f.done(j, false)
		return
	}
	defer end()
	err := f.eng.ForgetPeer(j.peer)
	// An unknown peer has nothing left to cut, and is refused all the same
	// from now on.
	f.done(j, err == nil || errors.Is(err, transfer.ErrUnknownPeer))
}
