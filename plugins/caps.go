package plugins

import (
	"time"

	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	"github.com/bouncekv/bounce/transfer"
)

// The optional engine capabilities the protocol carries, as the methods an
// in-process engine declares them with.
type (
	notifyLimiter interface{ MaxNotifySize() int }
	costDeclarer  interface {
		RouteCosts() (postPerDesc, perWrite time.Duration, bandwidth float64)
	}
)

// caps are an engine's optional capabilities as its plugin declared them
// when the host opened it. They are static: an engine answers
// FencesForgottenPeers, MaxNotifySize and RouteCosts the same for its
// whole life.
type caps struct {
	notifier, fencer, fences bool
	maxNotify                int
	postPerDesc, perWrite    time.Duration
	bandwidth                float64
}

// fencing is the transfer.Fencer a host-side engine declares for its
// plugin's engine.
type fencing struct{ fences bool }

// FencesForgottenPeers answers what the plugin's engine answered.
func (f fencing) FencesForgottenPeers() bool { return f.fences }

func (c caps) fencing() fencing { return fencing{c.fences} }

// describe is the Open reply for engine e: its name and every optional
// capability it declares.
func describe(e transfer.Engine) *pb.OpenReply {
	_, notifier := e.(transfer.Notifier)
	pc := &pb.Capabilities{}
	if f, ok := e.(transfer.Fencer); ok {
		pc.Fencer, pc.Fences = true, f.FencesForgottenPeers()
	}
	if l, ok := e.(notifyLimiter); ok && notifier {
		pc.MaxNotifySize = int64(max(l.MaxNotifySize(), 0))
	}
	if d, ok := e.(costDeclarer); ok {
		post, write, bw := d.RouteCosts()
		pc.RouteCosts, pc.PostPerDescNs, pc.PerWriteNs, pc.Bandwidth = true, int64(post), int64(write), bw
	}
	return &pb.OpenReply{Name: []byte(e.Name()), Notifier: notifier, Caps: pc}
}

// capsFrom reads the capabilities of an Open reply.
func capsFrom(rep *pb.OpenReply) caps {
	pc := rep.GetCaps()
	c := caps{notifier: rep.GetNotifier(), fencer: pc.GetFencer(), fences: pc.GetFences(), maxNotify: int(max(pc.GetMaxNotifySize(), 0))}
	if pc.GetRouteCosts() {
		c.postPerDesc, c.perWrite, c.bandwidth = time.Duration(pc.GetPostPerDescNs()), time.Duration(pc.GetPerWriteNs()), pc.GetBandwidth()
	}
	return c
}

var (
	_ transfer.Fencer        = (*remoteFencer)(nil)
	_ transfer.Fencer        = (*remoteNotifierFencer)(nil)
	_ transfer.Notifier      = (*remoteNotifierFencer)(nil)
	_ notifyLimiter          = (*remoteNotifier)(nil)
	_ costDeclarer           = (*remoteEngine)(nil)
	_ transfer.ContextPoster = (*remoteEngine)(nil)
)
