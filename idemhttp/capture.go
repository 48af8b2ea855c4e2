package idemhttp

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/idemhq/idem/internal/httpenvelope"
)

// capture is the http.ResponseWriter handed to the handler. It holds the
// whole response until the transaction has ended, so the client never sees a
// success that did not commit.
//
// It implements neither http.Flusher nor http.Hijacker, and has no Unwrap:
// http.ResponseController reports flushing and hijacking as unsupported.
type capture struct {
	header   http.Header
	sent     http.Header // header as it was at WriteHeader, as net/http sends it
	status   int
	body     bytes.Buffer
	limit    int64
	overflow bool // the handler wrote more than limit bytes
	replaced int  // the status a later, worse status replaced; 0 if none
}

func newCapture(limit int64) *capture { return &capture{header: make(http.Header), limit: limit} }

// Header returns the header map the handler fills.
func (c *capture) Header() http.Header { return c.header }

// WriteHeader records the status of the first call with a final status.
// Informational (1xx) statuses are dropped: nothing reaches the client
// before the transaction ends.
//
// A later call is dropped, as net/http drops it, unless its status is of a
// worse class (4xx after 2xx or 3xx, 5xx after anything below 500): the
// handler failed after it began to answer, as http.Error after a partial
// body does. net/http would send the first status with the error text
// appended, and the middleware would store a success whose writes must not
// commit. Nothing has reached the client yet, so the later status replaces
// the response: what was written before it is discarded.
func (c *capture) WriteHeader(status int) {
	if status < 100 || status > 999 {
		// The same contract as net/http's own writers.
		panic(fmt.Sprintf("invalid WriteHeader code %v", status))
	}
	if status < 200 {
		return
	}
	if c.status != 0 {
		if class(status) <= class(c.status) {
			return
		}
		if c.replaced == 0 {
			c.replaced = c.status
		}
		c.body.Reset()
		// The headers that described the discarded response, or named
		// what it created, and that the handler has not set again since,
		// belong to that response: a Location naming a row that rolls
		// back must not reach the client, nor be stored with a refusal.
		for _, name := range describing {
			if v, ok := c.sent[name]; ok && slices.Equal(v, c.header[name]) {
				delete(c.header, name)
			}
		}
	}
	c.status = status
	c.sent = c.header.Clone()
}

// describing are the headers that describe a response's representation or
// name the resource it created: those of a discarded response are dropped
// with it.
var describing = []string{
	"Content-Type", "Content-Encoding", "Content-Language", "Content-Disposition", "Content-Length",
	"Content-Location", "Location", "Etag", "Last-Modified",
}

// class orders statuses for WriteHeader: success and redirection, client
// error, server error.
func class(status int) int {
	switch {
	case status >= 500:
		return 2
	case status >= 400:
		return 1
	}
	return 0
}

// errResponseTooLarge is what Write returns, and the call fails with, once
// the handler has written more than the limit: the response is neither held
// nor stored.
var errResponseTooLarge = errors.New("idemhttp: the response exceeds MaxResponseBytes")

// Write appends to the buffered body, up to the limit.
func (c *capture) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if c.overflow || int64(c.body.Len())+int64(len(p)) > c.limit {
		c.overflow = true
		c.body = bytes.Buffer{} // hold no more than the limit, for no one
		return 0, errResponseTooLarge
	}
	return c.body.Write(p)
}

// finish settles what net/http would have settled on the first write: the
// status defaults to 200, and a body without Content-Type gets a sniffed
// one, so the first response and its replays carry the same type.
// Changes to the header map after WriteHeader are dropped, as net/http drops
// them.
func (c *capture) finish() {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	c.header = c.sent
	if _, set := c.header["Content-Type"]; !set && c.body.Len() > 0 && c.header.Get("Content-Encoding") == "" {
		c.header.Set("Content-Type", http.DetectContentType(c.body.Bytes()))
	}
}

// full is the captured response as the handler wrote it.
func (c *capture) full() response {
	return response{httpenvelope.Response{Status: c.status, Header: c.header, Body: c.body.Bytes()}}
}

// stored is the captured response reduced to the headers that are replayed.
func (c *capture) stored(names []string) response {
	h := make(http.Header)
	for _, name := range names {
		if v, ok := c.header[name]; ok && len(v) > 0 {
			h[name] = slices.Clone(v)
		}
	}
	return response{httpenvelope.Response{Status: c.status, Header: h, Body: c.body.Bytes()}}
}
