package idemhttp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
)

// response is what the middleware stores under a key: the handler's status,
// the replayable subset of its headers, and its body.
//
// It encodes itself in a compact binary form, so a body is stored as its
// bytes rather than as base64 inside JSON:
//
//	version byte (1)
//	uvarint status
//	uvarint number of header fields
//	per field: uvarint len, name, uvarint len, value (names sorted)
//	body: the remaining bytes
type response struct {
	status int
	header http.Header
	body   []byte
}

const responseVersion = 1

// MarshalBinary encodes r in the form described on response.
func (r response) MarshalBinary() ([]byte, error) {
	names := make([]string, 0, len(r.header))
	fields := 0
	for name, values := range r.header {
		names = append(names, name)
		fields += len(values)
	}
	slices.Sort(names)
	size := 1 + 2*binary.MaxVarintLen64 + len(r.body)
	for _, name := range names {
		for _, v := range r.header[name] {
			size += 2*binary.MaxVarintLen64 + len(name) + len(v)
		}
	}
	b := make([]byte, 0, size)
	b = append(b, responseVersion)
	b = binary.AppendUvarint(b, uint64(r.status))
	b = binary.AppendUvarint(b, uint64(fields))
	for _, name := range names {
		for _, v := range r.header[name] {
			b = appendString(b, name)
			b = appendString(b, v)
		}
	}
	return append(b, r.body...), nil
}

// UnmarshalBinary decodes the form MarshalBinary produces.
func (r *response) UnmarshalBinary(data []byte) error {
	if len(data) == 0 || data[0] != responseVersion {
		return errors.New("idemhttp: stored response: unknown version")
	}
	d := decoder{b: data[1:]}
	status := d.uvarint()
	fields := d.uvarint()
	if d.err == nil && (status < 100 || status > 999) {
		return fmt.Errorf("idemhttp: stored response: status %d", status)
	}
	// Every field takes at least two bytes, which bounds the allocation.
	if d.err == nil && fields > uint64(len(d.b)/2) {
		return errors.New("idemhttp: stored response: truncated")
	}
	var header http.Header
	if fields > 0 && d.err == nil {
		header = make(http.Header)
	}
	for i := uint64(0); i < fields && d.err == nil; i++ {
		name, value := d.string(), d.string()
		header[name] = append(header[name], value)
	}
	if d.err != nil {
		return d.err
	}
	*r = response{status: int(status), header: header, body: bytes.Clone(d.b)}
	return nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

type decoder struct {
	b   []byte
	err error
}

var errTruncated = errors.New("idemhttp: stored response: truncated")

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errTruncated
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.err = errTruncated
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// writeTo sends r to w, with Idempotent-Replayed: true when replayed.
func (r response) writeTo(w http.ResponseWriter, replayed bool) {
	h := w.Header()
	for name, values := range r.header {
		h[name] = values
	}
	if replayed {
		h.Set(HeaderReplayed, "true")
	}
	w.WriteHeader(r.status)
	// A write error means the client left; the outcome is already settled.
	_, _ = w.Write(r.body)
}

// capture is the http.ResponseWriter handed to the handler. It holds the
// whole response until the transaction has ended, so the client never sees a
// success that did not commit.
//
// It implements neither http.Flusher nor http.Hijacker, and has no Unwrap:
// http.ResponseController reports flushing and hijacking as unsupported.
type capture struct {
	header http.Header
	sent   http.Header // header as it was at WriteHeader, as net/http sends it
	status int
	body   bytes.Buffer
}

func newCapture() *capture { return &capture{header: make(http.Header)} }

// Header returns the header map the handler fills.
func (c *capture) Header() http.Header { return c.header }

// WriteHeader records the status of the first call with a final status.
// Informational (1xx) statuses are dropped: nothing reaches the client
// before the transaction ends.
func (c *capture) WriteHeader(status int) {
	if status < 100 || status > 999 {
		// The same contract as net/http's own writers.
		panic(fmt.Sprintf("invalid WriteHeader code %v", status))
	}
	if c.status != 0 || status < 200 {
		return
	}
	c.status = status
	c.sent = c.header.Clone()
}

// Write appends to the buffered body.
func (c *capture) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
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
	return response{status: c.status, header: c.header, body: c.body.Bytes()}
}

// stored is the captured response reduced to the headers that are replayed.
func (c *capture) stored(names []string) response {
	h := make(http.Header)
	for _, name := range names {
		if v, ok := c.header[name]; ok && len(v) > 0 {
			h[name] = slices.Clone(v)
		}
	}
	return response{status: c.status, header: h, body: c.body.Bytes()}
}
