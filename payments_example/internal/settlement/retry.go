package settlement

import (
	"math/rand/v2"
	"time"

	"github.com/riverqueue/river/rivertype"
)

// Backoff is a river.ClientRetryPolicy: the n-th retry of a job waits
// Min·2ⁿ⁻¹, capped at Max, less up to a fifth at random so that jobs that
// failed together do not all retry together.
//
// River's default waits attempt⁴ seconds (1 s, 16 s, 81 s, 4 min, ...):
// after a few failures, a processor that is back would wait minutes for
// the jobs it failed. The cap keeps every retry close; what it costs is
// one processor call per pending job every Max while the processor is
// down.
type Backoff struct {
	Min, Max time.Duration
}

// NextRetry returns when the failed job runs again.
func (b Backoff) NextRetry(job *rivertype.JobRow) time.Time {
	d := b.Max
	// len(job.Errors) counts the failures before this one, as River's
	// default policy does.
	if n := len(job.Errors); n < 30 && b.Min<<n < b.Max {
		d = b.Min << n
	}
	d -= time.Duration(rand.Int64N(int64(d)/5 + 1))
	return time.Now().Add(d)
}
