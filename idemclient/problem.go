package idemclient

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
)

// maxProblemBytes bounds the body ProblemOf reads: a problem document is
// a few hundred bytes, and an answer that claims to be one and is larger is
// not worth holding.
const maxProblemBytes = 64 << 10

// A Problem is an RFC 9457 problem document (application/problem+json), as
// servers that follow the Idempotency-Key draft answer with, idem's
// included. It is an error, so that a caller can return the document that
// explains a refusal: a key reused for another request (idem: 422, type
// ".../problems/key-mismatch"), a request in progress (409), an outcome
// unknown (503, type ".../problems/outcome-unknown": retry with the same
// key, never with a new one).
type Problem struct {
	// Type is a URI reference that names the problem; "about:blank" when
	// the document has none. idem's are relative: "/problems/in-progress".
	Type string `json:"type"`
	// Title is a short summary of the problem type.
	Title string `json:"title"`
	// Status is the answer's HTTP status code (the header's, when the
	// document names none).
	Status int `json:"status"`
	// Detail explains this occurrence.
	Detail string `json:"detail"`
	// Instance is a URI reference that names this occurrence.
	Instance string `json:"instance"`
}

func (p *Problem) Error() string {
	msg := fmt.Sprintf("idemclient: %d %s", p.Status, p.Title)
	if p.Detail != "" {
		msg += ": " + p.Detail
	}
	return msg + " (" + p.Type + ")"
}

// ProblemOf returns the problem document of resp, an answer with a status of
// 400 or more and Content-Type application/problem+json, or nil for any
// other answer and for a body that is not such a document. It reads the
// body (up to 64 KiB) and puts back an unread copy, so the caller can still
// read it.
func ProblemOf(resp *http.Response) *Problem {
	if resp == nil || resp.StatusCode < 400 || resp.Body == nil {
		return nil
	}
	if mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); err != nil || mt != "application/problem+json" {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxProblemBytes+1))
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), resp.Body), resp.Body}
	if err != nil || len(body) > maxProblemBytes {
		return nil
	}
	var p Problem
	if json.Unmarshal(body, &p) != nil {
		return nil
	}
	if p.Type == "" {
		p.Type = "about:blank" // RFC 9457, section 3.1.1
	}
	if p.Status == 0 {
		p.Status = resp.StatusCode
	}
	return &p
}
