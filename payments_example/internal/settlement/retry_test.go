package settlement_test

import (
	"testing"
	"time"

	"github.com/riverqueue/river/rivertype"

	"github.com/idemhq/idem/payments_example/internal/settlement"
)

// TestBackoff: the wait doubles from RetryMin per earlier failure, is
// capped at RetryMax (under River's 5 s scheduler interval) even after
// thousands of failures, and loses at most a fifth to jitter.
func TestBackoff(t *testing.T) {
	b := settlement.Backoff{Min: settlement.RetryMin, Max: settlement.RetryMax}
	for _, tc := range []struct {
		failures int
		want     time.Duration
	}{
		{0, 250 * time.Millisecond},
		{1, 500 * time.Millisecond},
		{2, time.Second},
		{3, 2 * time.Second},
		{4, 4 * time.Second},
		{5, 4 * time.Second},
		{64, 4 * time.Second},
		{settlement.MaxAttempts, 4 * time.Second},
	} {
		job := &rivertype.JobRow{Errors: make([]rivertype.AttemptError, tc.failures)}
		for range 20 {
			before := time.Now()
			at := b.NextRetry(job)
			// NextRetry reads the clock between the two: a stall there
			// widens the bound, never the test's verdict.
			d, took := at.Sub(before), time.Since(before)
			if d > tc.want+took || d < tc.want*4/5 {
				t.Fatalf("after %d failures: %v, want %v less up to a fifth", tc.failures, d, tc.want)
			}
		}
	}
	if settlement.RetryMax >= 5*time.Second || settlement.RescueStuckJobsAfter <= settlement.JobTimeout || settlement.JobTimeout <= settlement.CallTimeout {
		t.Fatal("the settings no longer keep RetryMax < 5s < ... and CallTimeout < JobTimeout < RescueStuckJobsAfter")
	}
}
