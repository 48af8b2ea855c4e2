package idemhttptest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/testkit/kit"
)

// run is one Run of a Suite.
type run struct {
	suite   Suite
	client  *http.Client
	base    *url.URL
	replay  []string // the headers a replay must repeat
	session *kit.Session
}

// defaultReplayHeaders are the headers idemhttp always stores and replays.
var defaultReplayHeaders = []string{
	"Content-Type", "Content-Encoding", "Content-Language", "Content-Disposition",
	"Content-Location", "Location", "Etag", "Last-Modified",
}

func replayHeaders(extra []string) []string {
	var names []string
	for _, name := range append(slices.Clone(defaultReplayHeaders), extra...) {
		name = http.CanonicalHeaderKey(name)
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return names
}

// answer is a response as the kit compares it.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) ok() bool       { return a.status >= 200 && a.status < 300 }
func (a answer) replayed() bool { return a.header.Get(idemhttp.HeaderReplayed) == "true" }

// inProgress reports an answer that says the key is held by a request in
// flight: 409 and not a replay (a stored 409 replays with the header).
func (a answer) inProgress() bool { return a.status == http.StatusConflict && !a.replayed() }

func (a answer) String() string {
	s := fmt.Sprintf("%d", a.status)
	if a.replayed() {
		s += " (replayed)"
	}
	if body := strings.Join(strings.Fields(kit.Excerpt(a.body)), " "); body != "" {
		s += " " + body
	}
	return s
}

// differs returns how b differs from a in what a replay must repeat, or "".
func (r *run) differs(a, b answer) string {
	if a.status != b.status {
		return fmt.Sprintf("status %d, want %d", b.status, a.status)
	}
	if !bytes.Equal(a.body, b.body) {
		return fmt.Sprintf("body %q, want %q", kit.Excerpt(b.body), kit.Excerpt(a.body))
	}
	for _, name := range r.replay {
		if !slices.Equal(a.header.Values(name), b.header.Values(name)) {
			return fmt.Sprintf("header %s %q, want %q", name, b.header.Values(name), a.header.Values(name))
		}
	}
	return ""
}

// build returns a request from Request (or its changed form), ready to send
// with key.
func (r *run) build(t testing.TB, key string, changed bool) *http.Request {
	t.Helper()
	req := r.suite.Request(t)
	if req == nil {
		t.Fatalf("Request returned nil")
	}
	if changed {
		if r.suite.Change != nil {
			req = r.suite.Change(t, req)
			if req == nil {
				t.Fatalf("Change returned nil")
			}
		} else {
			req = changeBody(t, req)
		}
	}
	req = req.WithContext(t.Context())
	if req.URL.Host == "" {
		u := *req.URL
		u.Scheme, u.Host = r.base.Scheme, r.base.Host
		u.Path = strings.TrimSuffix(r.base.Path, "/") + u.Path
		if u.RawPath != "" {
			u.RawPath = strings.TrimSuffix(r.base.EscapedPath(), "/") + u.RawPath
		}
		req.URL = &u
		req.Host = ""
	}
	req.RequestURI = "" // set by httptest.NewRequest; client requests must not carry it
	if req.Header == nil {
		req.Header = http.Header{}
	}
	req.Header.Set(idemhttp.HeaderKey, key)
	return req
}

// changeBody is Change's default: see Suite.Change.
func changeBody(t testing.TB, req *http.Request) *http.Request {
	t.Helper()
	var body []byte
	if req.Body != nil {
		var err error
		body, err = io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			t.Fatalf("reading the body of the request from Request: %v", err)
		}
	}
	if len(body) == 0 {
		t.Fatalf("the request from Request has no body for the kit to change: set Suite.Change to say how another request with the same key looks")
	}
	mt, _, _ := mime.ParseMediaType(req.Header.Get("Content-Type"))
	if changed, err := kit.ChangeJSON(body); err == nil {
		body = changed
	} else if mt == "application/json" || strings.HasSuffix(mt, "+json") {
		t.Fatalf("the request's %s body cannot be changed: %v; set Suite.Change", mt, err)
	} else {
		body = append(body, '\n')
	}
	req = req.Clone(req.Context())
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return req
}

// do sends req and returns its answer; a request that gets no answer ends
// the scenario.
func (r *run) do(t testing.TB, req *http.Request) answer {
	t.Helper()
	a, err := r.roundTrip(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	return a
}

func (r *run) roundTrip(req *http.Request) (answer, error) {
	res, err := r.client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return answer{}, fmt.Errorf("reading the answer: %w", err)
	}
	return answer{status: res.StatusCode, header: res.Header, body: body}, nil
}

// send builds a request with key and sends it.
func (r *run) send(t testing.TB, key string) answer {
	t.Helper()
	return r.do(t, r.build(t, key, false))
}

// settle sends requests with key until one is not answered "in progress",
// as a client retries a 409, and returns that answer.
func (r *run) settle(t testing.TB, key string) answer {
	t.Helper()
	deadline := time.Now().Add(kit.Settle)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 250*time.Millisecond) {
		a := r.send(t, key)
		if !a.inProgress() || time.Now().After(deadline) {
			return a
		}
		select {
		case <-t.Context().Done():
			return a
		case <-time.After(wait):
		}
	}
}

// sendLost sends a request with key and drops its answer: it closes the
// connection as soon as the first byte of the answer arrives, without
// reading it. idemhttp writes no byte before the transaction has ended, so
// by then the service has committed (or rolled back) and the client never
// learns which.
func (r *run) sendLost(t testing.TB, key string) {
	t.Helper()
	req := r.build(t, key, false)
	ctx, cancel := context.WithCancel(req.Context())
	defer cancel()
	var answered atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotFirstResponseByte: func() {
			answered.Store(true)
			cancel()
		},
	})
	res, err := r.client.Do(req.WithContext(ctx))
	if err == nil {
		// The head was read before the cancellation took effect; the body
		// is closed unread, which closes the connection.
		_ = res.Body.Close()
	}
	if !answered.Load() {
		t.Fatalf("%s %s: no answer: %v", req.Method, req.URL, err)
	}
}
