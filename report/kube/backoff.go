package kube

import (
	"math/rand/v2"
	"time"
)

// backoff doubles from min to max, with full jitter (a uniform wait in
// [d/2, d]) so that a fleet of nodes does not retry in step after an API
// server outage.
type backoff struct {
	min, max time.Duration
	cur      time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	return b.cur/2 + rand.N(b.cur/2+1)
}

func (b *backoff) reset() { b.cur = 0 }

// jitter returns d lengthened by up to 10 %: heartbeats are never more
// frequent than configured, and a fleet does not write in step.
func jitter(d time.Duration) time.Duration {
	return d + rand.N(d/10+1)
}
