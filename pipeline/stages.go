package pipeline

import "time"

// Stages is where a bounce request's time went on the sender, summed over
// its chunks (chunks overlap, so the stages add up to more than the
// request's latency): Plan is building the plan at Submit; GrantWait runs
// from the WANT to the first GRANT; Gather, Write and Data are the gather
// ops, the bulk writes (until landed) and sending the DATA messages;
// AckWait runs from each DATA to its ACK, and so holds the receiver's
// scatter and the ACK's trip back. A direct request has only Plan at 0 and
// Write (its one engine post, until Done).
type Stages struct {
	Plan, GrantWait, Gather, Write, Data, AckWait time.Duration
}

// Add returns s plus o, stage by stage.
func (s Stages) Add(o Stages) Stages {
	return Stages{
		Plan: s.Plan + o.Plan, GrantWait: s.GrantWait + o.GrantWait, Gather: s.Gather + o.Gather,
		Write: s.Write + o.Write, Data: s.Data + o.Data, AckWait: s.AckWait + o.AckWait,
	}
}

// Div returns s with every stage divided by n (n < 1 returns s).
func (s Stages) Div(n int) Stages {
	if n < 1 {
		return s
	}
	d := time.Duration(n)
	return Stages{Plan: s.Plan / d, GrantWait: s.GrantWait / d, Gather: s.Gather / d, Write: s.Write / d, Data: s.Data / d, AckWait: s.AckWait / d}
}
