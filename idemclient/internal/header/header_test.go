package header

import (
	"net/http"
	"testing"
	"time"
)

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tt := range []struct {
		value string
		want  time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"1", time.Second},
		{" 120 ", 2 * time.Minute},
		{"-1", 0},
		{"1.5", 0},
		{"soon", 0},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
		{"99999999999999999999", 0}, // not an int64
		{"9999999999999", time.Duration(1<<62/time.Second) * time.Second},
	} {
		resp := &http.Response{Header: http.Header{}}
		if tt.value != "" {
			resp.Header.Set("Retry-After", tt.value)
		}
		if got := RetryAfter(resp, now); got != tt.want {
			t.Errorf("Retry-After %q: %v, want %v", tt.value, got, tt.want)
		}
	}
	if RetryAfter(nil, now) != 0 {
		t.Error("nil response: want 0")
	}
}

// FuzzRetryAfter: any header value gives a wait of zero or more, and never
// a panic.
func FuzzRetryAfter(f *testing.F) {
	for _, v := range []string{"1", "120", "-5", "Wed, 21 Oct 2015 07:28:00 GMT", "9223372036854775807", " 3 ", ""} {
		f.Add(v)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		resp := &http.Response{Header: http.Header{"Retry-After": {v}}}
		if d := RetryAfter(resp, now); d < 0 {
			t.Fatalf("Retry-After %q: %v", v, d)
		}
	})
}
