package pipeline

// parkQueue holds the sender's parked requests (chunks waiting for staging
// bytes or a copy context) in the order they first parked. A request keeps
// its place while it stays parked, however often it is retried, so the
// oldest waiter is always retried first and none is passed over for a
// newer one of the same size. The links live in sendReq: push, remove and
// has are O(1) and allocate nothing.
type parkQueue struct {
	head, tail *sendReq
	n          int
}

func (p *parkQueue) len() int { return p.n }

func (p *parkQueue) has(q *sendReq) bool { return q.parked }

// push appends q unless it is queued already (then it keeps its place).
func (p *parkQueue) push(q *sendReq) {
	if q.parked {
		return
	}
	q.parked, q.parkPrev, q.parkNext = true, p.tail, nil
	if p.tail != nil {
		p.tail.parkNext = q
	} else {
		p.head = q
	}
	p.tail = q
	p.n++
}

// remove takes q out of the queue; a request not queued is left alone.
func (p *parkQueue) remove(q *sendReq) {
	if !q.parked {
		return
	}
	if q.parkPrev != nil {
		q.parkPrev.parkNext = q.parkNext
	} else {
		p.head = q.parkNext
	}
	if q.parkNext != nil {
		q.parkNext.parkPrev = q.parkPrev
	} else {
		p.tail = q.parkPrev
	}
	q.parked, q.parkPrev, q.parkNext = false, nil, nil
	p.n--
}

// appendTo appends the queued requests to dst, oldest first.
func (p *parkQueue) appendTo(dst []*sendReq) []*sendReq {
	for q := p.head; q != nil; q = q.parkNext {
		dst = append(dst, q)
	}
	return dst
}
