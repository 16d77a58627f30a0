// Package costmodel predicts how long one request takes on the bounce path
// (gather, one bulk write per chunk, scatter) and on the direct path (one
// engine post per descriptor), so that route auto can take the faster one.
//
// The prediction is built from a few costs: the engine's (Engine: what it
// costs to post one descriptor, the fixed cost of one write, its bulk
// bandwidth), declared by the engine and refined by a probe, and the host
// pipeline's (Host: copy bandwidth, per-run copy cost, per-chunk control
// cost, the WANT/GRANT round trip), calibrated by a short copy probe when
// the agent starts. A Model then refreshes itself from what transfers
// actually took: it keeps a correction for the bounce path and two for the
// engine as the direct path sees it (posting cost, learned from
// fragmented direct requests and those bound by posting, and bandwidth,
// from bulk-shaped ones bound by it), each the median of the
// last three observed factors, so systematic error (CPU contention, a
// slower network than declared, a transport that emulates RMA) is learned
// within a few requests rather than assumed away.
//
// Because only the chosen path is observed, Decide sometimes picks the
// other one on purpose while the two predictions are close (see
// Model.ExploreEvery), so both corrections stay fresh.
//
// Like the credit and plan packages it is pure logic: no clocks,
// goroutines or IO; callers measure and pass durations. A Model is not
// safe for concurrent use.
package costmodel

import (
	"fmt"
	"math"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// Engine are the costs of a transfer engine.
type Engine struct {
	// PostPerDesc is the sender's cost of posting one descriptor of a
	// direct, per-descriptor write (building and handing it to the
	// transport), overlapped with the bytes already moving.
	PostPerDesc time.Duration
	// PerWrite is the fixed cost of one write, post to completion,
	// whatever its size: the latency of one bulk write of the bounce path.
	PerWrite time.Duration
	// Bandwidth is the engine's bulk bandwidth, bytes per second.
	Bandwidth float64
}

// Validate reports a cost that makes no prediction possible.
func (e Engine) Validate() error {
	if e.PostPerDesc < 0 || e.PerWrite < 0 || !(e.Bandwidth > 0) || math.IsInf(e.Bandwidth, 0) {
		return fmt.Errorf("costmodel: engine costs %+v: want non-negative times and a positive, finite bandwidth", e)
	}
	return nil
}

// Host are the bounce path's own costs on this machine.
type Host struct {
	// CopyBandwidth is the host copy bandwidth of one gather or scatter,
	// bytes per second.
	CopyBandwidth float64
	// PerRun is the copy cost of one run beyond its bytes (one descriptor
	// of a fragmented transfer).
	PerRun time.Duration
	// PerChunk is the control cost of one chunk: its WANT share, GRANT,
	// DATA and ACK handled on both sides.
	PerChunk time.Duration
	// RoundTrip is the WANT to GRANT delay before the first write.
	RoundTrip time.Duration
	// Serial says the gather, write and scatter of different chunks do not
	// overlap (a machine with too few cores for three stages and the
	// engine): the steady state is their sum, not their maximum.
	Serial bool
}

// Validate reports a cost that makes no prediction possible.
func (h Host) Validate() error {
	if h.PerRun < 0 || h.PerChunk < 0 || h.RoundTrip < 0 || !(h.CopyBandwidth > 0) || math.IsInf(h.CopyBandwidth, 0) {
		return fmt.Errorf("costmodel: host costs %+v: want non-negative times and a positive, finite copy bandwidth", h)
	}
	return nil
}

// Shape is what the model needs to know about one request.
type Shape struct {
	// Descs is the number of non-empty descriptors (direct posts).
	Descs int
	// Bytes is the payload.
	Bytes uint64
	// Runs is the number of copy runs of the bounce path (at most Descs:
	// adjacent descriptors merge; see Runs).
	Runs int
	// Chunks is the number of bounce chunks (bulk writes).
	Chunks int
}

// Prediction is the predicted time of one request on each path.
type Prediction struct {
	Bounce, Direct time.Duration
}

// Faster reports whether the bounce path is predicted faster.
func (p Prediction) Faster() bool { return p.Bounce < p.Direct }

// Ratio is Direct over Bounce: how much faster bounce is predicted to be
// (below 1: slower).
func (p Prediction) Ratio() float64 {
	if p.Bounce <= 0 {
		return math.Inf(1)
	}
	return float64(p.Direct) / float64(p.Bounce)
}

// seconds converts a byte count at bw bytes per second to a duration.
func seconds(n float64, bw float64) float64 { return n / bw }

// DirectTime predicts the direct path: posting overlaps the bytes moving, so it
// takes the longer of the two, plus one write's fixed cost.
func DirectTime(e Engine, s Shape) time.Duration {
	post := float64(s.Descs) * e.PostPerDesc.Seconds()
	wire := seconds(float64(s.Bytes), e.Bandwidth)
	return e.PerWrite + dur(math.Max(post, wire))
}

// BounceTime predicts the bounce path: the WANT/GRANT round trip, the first
// chunk's gather (fill) and the last chunk's scatter (drain) around a
// steady state limited by its slowest stage (or, Serial, by their sum).
func BounceTime(e Engine, h Host, s Shape) time.Duration {
	if s.Chunks < 1 {
		s.Chunks = 1
	}
	copyT := seconds(float64(s.Bytes), h.CopyBandwidth) + float64(s.Runs)*h.PerRun.Seconds()
	write := float64(s.Chunks)*e.PerWrite.Seconds() + seconds(float64(s.Bytes), e.Bandwidth)
	control := float64(s.Chunks) * h.PerChunk.Seconds()
	var steady float64
	if h.Serial {
		steady = 2*copyT + write + control
	} else {
		steady = math.Max(math.Max(copyT, write), control)
	}
	per := copyT / float64(s.Chunks) // one chunk's gather, and one's scatter
	if h.Serial {
		per = 0 // already in the sum
	}
	return h.RoundTrip + dur(steady+2*per)
}

func dur(s float64) time.Duration {
	if s > float64(math.MaxInt64)/1e9 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s * 1e9)
}

// Runs counts the copy runs of a request pairing src[i] with dst[i]: a new
// run starts where either side is not contiguous with the previous
// non-empty descriptor. It is an upper bound on the runs the planner makes
// (which also merges uniform strides) and costs one comparison per
// descriptor.
func Runs(src, dst []transfer.Desc) int {
	runs := 0
	var ps, pd transfer.Desc
	for i := range src {
		s, d := src[i], dst[i]
		if s.Len == 0 {
			continue
		}
		if runs == 0 || s.Addr != ps.Addr+ps.Len || d.Addr != pd.Addr+pd.Len {
			runs++
		}
		ps, pd = s, d
	}
	return runs
}
