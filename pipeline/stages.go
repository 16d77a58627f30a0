package pipeline

import "time"

// Stages is where a bounce request's time went on the sender, summed over
// its chunks (chunks overlap, so the stages add up to more than the
// request's latency): Plan is laying the plan out at Submit (plan.Layout;
// each chunk's runs are emitted as it starts, counted in no stage); GrantWait runs
// from the WANT to the first GRANT; Gather, Write and Data are the gather
// ops, the bulk writes (until landed) and sending the DATA messages;
// Scatter is the receiver's time from each DATA's arrival to its scatter's
// end (queue wait included), as its ACK reports it; AckWait is the rest of
// each DATA→ACK interval (the DATA's and the ACK's trips). A direct request
// has only Plan at 0 and Write (its one engine post, until Done).
type Stages struct {
	Plan, GrantWait, Gather, Write, Data, Scatter, AckWait time.Duration
}

// Add returns s plus o, stage by stage.
func (s Stages) Add(o Stages) Stages {
	return Stages{
		Plan: s.Plan + o.Plan, GrantWait: s.GrantWait + o.GrantWait, Gather: s.Gather + o.Gather,
		Write: s.Write + o.Write, Data: s.Data + o.Data, Scatter: s.Scatter + o.Scatter, AckWait: s.AckWait + o.AckWait,
	}
}

// Div returns s with every stage divided by n (n < 1 returns s).
func (s Stages) Div(n int) Stages {
	if n < 1 {
		return s
	}
	d := time.Duration(n)
	return Stages{Plan: s.Plan / d, GrantWait: s.GrantWait / d, Gather: s.Gather / d, Write: s.Write / d, Data: s.Data / d, Scatter: s.Scatter / d, AckWait: s.AckWait / d}
}
