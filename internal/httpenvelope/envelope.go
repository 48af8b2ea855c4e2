// Package httpenvelope is the binary form in which idemhttp stores an HTTP
// response under a key, shared with the idem command, which shows stored
// rows (idem inspect).
package httpenvelope

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
)

// Response is what idemhttp stores under a key: the handler's status, the
// replayable subset of its headers, and its body.
//
// It encodes itself in a compact binary form, so a body is stored as its
// bytes rather than as base64 inside JSON:
//
//	version byte (1)
//	uvarint status
//	uvarint number of header fields
//	per field: uvarint len, name, uvarint len, value (names sorted)
//	body: the remaining bytes
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

const responseVersion = 1

// MarshalBinary encodes r in the form described on Response.
func (r Response) MarshalBinary() ([]byte, error) {
	names := make([]string, 0, len(r.Header))
	fields := 0
	for name, values := range r.Header {
		names = append(names, name)
		fields += len(values)
	}
	slices.Sort(names)
	size := 1 + 2*binary.MaxVarintLen64 + len(r.Body)
	for _, name := range names {
		for _, v := range r.Header[name] {
			size += 2*binary.MaxVarintLen64 + len(name) + len(v)
		}
	}
	b := make([]byte, 0, size)
	b = append(b, responseVersion)
	b = binary.AppendUvarint(b, uint64(r.Status))
	b = binary.AppendUvarint(b, uint64(fields))
	for _, name := range names {
		for _, v := range r.Header[name] {
			b = appendString(b, name)
			b = appendString(b, v)
		}
	}
	return append(b, r.Body...), nil
}

// UnmarshalBinary decodes the form MarshalBinary produces.
func (r *Response) UnmarshalBinary(data []byte) error {
	if len(data) == 0 || data[0] != responseVersion {
		return errors.New("idemhttp: stored response: unknown version")
	}
	d := decoder{b: data[1:]}
	status := d.uvarint()
	fields := d.uvarint()
	// Only final statuses are ever stored; anything else is a tampered row.
	if d.err == nil && (status < 200 || status > 599) {
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
	*r = Response{Status: int(status), Header: header, Body: bytes.Clone(d.b)}
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
