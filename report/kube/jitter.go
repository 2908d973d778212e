package kube

import (
	"math/rand/v2"
	"time"
)

// jitter returns d lengthened by up to 10 %: heartbeats are never more
// frequent than configured, and a fleet does not write in step.
func jitter(d time.Duration) time.Duration {
	return d + rand.N(d/10+1)
}
