package idemclient_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemhq/idem/idemclient"
)

// FuzzProblemOf: whatever the body, ProblemOf never panics, and the caller
// can still read the whole body afterwards.
func FuzzProblemOf(f *testing.F) {
	f.Add(`{"type":"/problems/key-mismatch","title":"t","status":422,"detail":"d"}`, "application/problem+json", 422)
	f.Add(`{"title":"no type"}`, "application/problem+json; charset=utf-8", 409)
	f.Add(`not json`, "application/problem+json", 503)
	f.Add(`{"type":"x"}`, "application/json", 422)
	f.Add(strings.Repeat("x", 70<<10), "application/problem+json", 400)
	f.Fuzz(func(t *testing.T, body, contentType string, status int) {
		resp := &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {contentType}},
			Body: io.NopCloser(strings.NewReader(body))}
		p := idemclient.ProblemOf(resp)
		if p != nil && (status < 400 || p.Type == "" || p.Status == 0) {
			t.Fatalf("status %d: problem %+v", status, p)
		}
		got, err := io.ReadAll(resp.Body)
		if err != nil || string(got) != body {
			t.Fatalf("the body read after ProblemOf differs (%d bytes of %d, %v)", len(got), len(body), err)
		}
	})
}
