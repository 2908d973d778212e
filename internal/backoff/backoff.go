// Package backoff spaces out the retries of a failing operation.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Backoff is a wait that doubles from Min to Max, with equal jitter: each
// wait is half the step, fixed, plus a uniform random part of up to the
// other half, so a fleet of nodes that failed together does not retry in
// step. Backoff{Min: m, Max: M} is ready to use; it is not safe for
// concurrent use.
type Backoff struct {
	Min, Max time.Duration
	step     time.Duration
}

// Next returns the wait before the next try, in [step/2, step], where step
// is Min on the first call (and the first after Reset), then 2*Min, 4*Min,
// ... up to Max.
func (b *Backoff) Next() time.Duration {
	switch {
	case b.step == 0:
		b.step = b.Min
	case b.step > b.Max/2:
		b.step = b.Max
	default:
		b.step *= 2
	}
	return b.step/2 + rand.N(b.step/2+1)
}

// Reset starts the next wait at Min again (after a success).
func (b *Backoff) Reset() { b.step = 0 }
