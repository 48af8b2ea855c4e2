// Package header reads the response headers that the client's retry
// decisions depend on.
package header

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RetryAfter returns the wait that resp's Retry-After header asks for
// (RFC 9110, section 10.2.3: delay-seconds or an HTTP-date), or 0 when resp
// is nil or has no valid Retry-After. A date in the past is a wait of 0.
func RetryAfter(resp *http.Response, now time.Time) time.Duration {
	if resp == nil {
		return 0
	}
	v := strings.TrimSpace(resp.Header.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0
		}
		// Past about 292 years a Duration overflows: such a wait is
		// simply longer than any policy's MaxRetryAfter.
		return time.Duration(min(secs, int64(1<<62/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
