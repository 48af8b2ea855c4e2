package idemhttp

import (
	"net/http"

	"github.com/idemhq/idem/internal/httpenvelope"
)

// response is what the middleware stores under a key, in the binary form
// of httpenvelope (a body is stored as its bytes, not as base64 in JSON).
type response struct{ httpenvelope.Response }

// MarshalBinary is the envelope's. idem trusts only a MarshalBinary the
// type declares, not one promoted from an embedded field.
func (r response) MarshalBinary() ([]byte, error) { return r.Response.MarshalBinary() }

// UnmarshalBinary is the envelope's.
func (r *response) UnmarshalBinary(data []byte) error { return r.Response.UnmarshalBinary(data) }

// writeTo sends r to w, with Idempotent-Replayed: true when replayed, and
// returns the status. allow, if not nil, lists the headers a stored response
// may carry: a row edited in the table cannot make a replay set a cookie.
func (r response) writeTo(w http.ResponseWriter, replayed bool, allow map[string]bool) int {
	h := w.Header()
	for name, values := range r.Header {
		if allow == nil || allow[name] {
			h[name] = values
		}
	}
	if replayed {
		h.Set(HeaderReplayed, "true")
	}
	w.WriteHeader(r.Status)
	// A write error means the client left; the outcome is already settled.
	_, _ = w.Write(r.Body)
	return r.Status
}
