package pipeline

import (
	"errors"
	"fmt"
	"time"

	"github.com/bouncekv/bounce/pipeline/credit"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// Pull by READ. Where the puller's PULL says it reads (both agents'
// engines read and serve reads, bounce.pull_read is not off at either
// end), the holder gathers each chunk into its own staging region as for
// a write, grants the puller a read of that region alone (readGuard) and
// sends STAGED — the region and the chunk's DATA — instead of writing.
// The puller checks the DATA as it would a written one (its grant, its
// runs or piece range), marks its granted region busy, reads the staged
// region into it, then scatters and ACKs. The ACK, or any failure of the
// pull, revokes the read grant (fenced: no read of the region is served
// after) before the holder reuses the staging.
//
// Failure semantics are the write path's: the puller's cancel, timeout,
// peer loss or forget fail both batches; a read still in flight when the
// puller gives up lands only in its own arena region, which stays out of
// use until the read is terminal, and its scatter never starts; the
// holder's give-up revokes the grant, cutting a read being served.

// readTask is a read of a holder's staged region in flight; its scatter
// task t is queued (in reactor.tasks) but not handed to the workers yet.
type readTask struct {
	t  *scatterTask
	op transfer.Op
}

// offerStaged offers chunk k, gathered into its staging region, to the
// puller to read (the holder's half of the write in postWrite).
func (r *reactor) offerStaged(q *sendReq, k int) {
	c := &q.ch[k]
	ch := q.plan.Chunks[k]
	data := wire.Data{Request: q.wireID(), Chunk: uint32(k), Region: c.credit.Region, Runs: ch.Scatter}
	if ch.Count > 0 { // the block-table form: the piece range, no runs
		data.Pieces = wire.PieceRange{First: ch.First, Count: ch.Count}
	}
	src := r.regionDesc(c.off, ch.Bytes)
	r.a.rguard.grant(q.peer, c.off, ch.Bytes)
	c.offered = true
	r.a.obs.dataSending(q, k, &data)
	sending := time.Now()
	err := r.send(q.peer, &wire.Staged{Src: src, Data: data})
	c.phase = time.Now()
	q.stages.Data += c.phase.Sub(sending)
	r.a.obs.dataSent(q, k, &data, err)
	q.plan.RecycleScatter(k, &r.runPool) // encoded: nothing reads the runs any more
	c.st = cDataSent
	if err != nil {
		r.a.obs.chunkFailed(q, k, err)
		r.fail(q, fmt.Errorf("pipeline: send STAGED for chunk %d: %w", k, err))
		return
	}
	q.lastProgress = r.clock.Now()
	r.a.stats.bounceBytes.Add(ch.Payload)
	r.a.stats.pullReadOffers.Add(1)
}

// endOffer revokes chunk c's read grant: no read of its staging region is
// admitted from now on. The region is freed once the reads already being
// served ended (readFenced): the fence runs off the reactor, which never
// waits for a puller.
func (r *reactor) endOffer(c *sendChunk) {
	c.offered = false
	fencing := r.a.rguard.revoke(c.off) // whatever else holds the region
	if !c.staged {
		return
	}
	if !fencing {
		r.dropStaging(c) // no grant was in force: nothing to wait for
		return
	}
	c.staged = false // the fence owns the region now
	r.readFencing[c.off] = struct{}{}
}

// readFenced frees the staging region at off once the fence of its
// revoked read grant returned: no read of it is served any more.
func (r *reactor) readFenced(off uint64) {
	if _, ok := r.readFencing[off]; !ok {
		r.log.Error("fenced staging region was not waiting for its fence", "off", off)
		return
	}
	delete(r.readFencing, off)
	r.releaseLocal(off)
}

// onStaged takes a holder's offer to read a pull's chunk: a pull of this
// agent that asked to read, and a staged region no larger than the
// granted one; then the chunk is handled as a DATA (onData) whose scatter
// waits for the read.
func (r *reactor) onStaged(peer string, m *wire.Staged) {
	key := credit.FlowKey{Peer: peer, Request: m.Data.Request}
	if pr := r.pulls[key]; pr == nil || !pr.read {
		// Reading is this agent's choice (its PULL said so): a peer
		// cannot make it read.
		r.a.stats.badMessages.Add(1)
		r.a.obs.reject(r, peer, rejectUnexpected)
		r.log.Warn("STAGED for no pull that reads dropped", "peer", peer, "request", m.Data.Request)
		return
	}
	if g, ok := r.sched.Region(m.Data.Region); ok && !g.Orphan && g.Flow == key && m.Src.Len > g.Len {
		why := fmt.Sprintf("staged region of %d bytes passes the %d-byte granted region", m.Src.Len, g.Len)
		r.a.stats.badRuns.Add(1)
		r.a.obs.reject(r, peer, rejectBadRuns)
		r.refuseData(peer, key, &m.Data, fmt.Errorf("chunk %d: %w: %s", m.Data.Chunk, ErrRefused, why), wire.NackBadRuns, "STAGED refused: "+why)
		return
	}
	r.offered = &m.Src
	r.onData(peer, &m.Data)
	r.offered = nil // not consumed when the DATA was dropped or refused
}

// startRead reads the staged region src into t's granted region; t's
// scatter is handed to the workers once the read is done.
func (r *reactor) startRead(t *scatterTask, src transfer.Desc) {
	if need := t.extent(); src.Len < need {
		// The scatter would copy bytes the read never brought: whatever
		// the region held before (another flow's, maybe).
		r.readEnded(t, fmt.Errorf("chunk %d: %w: the staged region of %d bytes is shorter than the %d bytes its DATA scatters", t.chunk, ErrRefused, src.Len, need))
		return
	}
	dst := transfer.Desc{Addr: t.region.Addr, Len: src.Len, Kind: t.region.Kind, Device: t.region.Device}
	rd, ok := r.a.set.Engine.(transfer.Reader)
	if !ok {
		r.readEnded(t, fmt.Errorf("the engine cannot read: %w", transfer.ErrUnsupported))
		return
	}
	op, err := rd.PostRead(t.key.Peer, []transfer.ReadOp{{Src: src, Dst: dst}})
	if err != nil {
		r.readEnded(t, err)
		return
	}
	t.reading = true
	r.reads = append(r.reads, readTask{t: t, op: op})
}

// pollReads polls the reads in flight and ends each terminal one.
func (r *reactor) pollReads() bool {
	progressed := false
	keep := r.reads[:0]
	for _, rt := range r.reads {
		st, err := rt.op.Poll()
		if st == transfer.Pending {
			keep = append(keep, rt)
			continue
		}
		progressed = true
		if rerr := rt.op.Release(); rerr != nil {
			r.log.Warn("release read op", "err", rerr)
		}
		if st == transfer.Done {
			err = nil
		} else if err == nil {
			err = errors.New("read failed without a cause")
		}
		r.readEnded(rt.t, err)
	}
	clear(r.reads[len(keep):])
	r.reads = keep
	return progressed
}

// readEnded hands a read chunk to the scatter workers (a task its flow
// cancelled meanwhile is skipped by them and its region freed), or ends a
// failed read: nothing is scattered, the region is freed (never, when the
// engine could not prove the read stopped) and the flow fails.
func (r *reactor) readEnded(t *scatterTask, err error) {
	t.reading = false
	if err == nil {
		if pr := r.pulls[t.key]; pr != nil {
			pr.lastProgress = r.clock.Now()
		}
		r.a.stats.pullReads.Add(1)
		r.jobs <- t
		return
	}
	r.scatters--
	delete(r.tasks, t.off)
	r.a.stats.failedReads.Add(1)
	r.a.obs.scatterEnded(r, t, err, false)
	if errors.Is(err, transfer.ErrNotQuiescent) {
		// The engine may still write the region: it never goes back to
		// the pool (its BeginScatter is never ended).
		r.log.Error("read of a staged region ended without proof that it stopped: its region is retired", "peer", t.key.Peer, "request", t.key.Request, "chunk", t.chunk, "err", err)
	} else if _, _, eerr := r.sched.EndScatter(t.off); eerr != nil {
		r.log.Error("end read region", "region", t.off, "err", eerr)
	}
	r.recycleRuns(t.runs)
	t.runs = nil
	if len(r.pullQuiet) > 0 {
		r.pullScatterEnded(t.key)
	}
	r.flowFailed(t.key, fmt.Errorf("chunk %d: read the holder's staged region: %w", t.chunk, err))
	r.schedule()
}
