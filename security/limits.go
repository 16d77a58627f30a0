package security

import "time"

// Bucket is a token bucket: Rate tokens per second, at most Burst saved.
// It is pure logic: the caller passes the time.
type Bucket struct {
	Rate  float64
	Burst float64

	tokens float64
	last   time.Time
	primed bool
}

// Allow takes one token at now and reports whether there was one. A Rate of
// 0 or less means unlimited.
func (b *Bucket) Allow(now time.Time) bool {
	if b.Rate <= 0 {
		return true
	}
	if !b.primed {
		b.tokens, b.last, b.primed = b.Burst, now, true
	}
	if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.tokens = min(b.Burst, b.tokens+dt*b.Rate)
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
