package payments

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/idemhq/idem/idemhttp"
)

// MaxBodyBytes is the largest request body the service accepts: 1 MiB.
// idemhttp enforces it on requests with a key; decode enforces it on the
// others.
const MaxBodyBytes = 1 << 20

// decode reads r's body as exactly one JSON object into v, rejecting
// unknown fields: a misspelt "amount" must not become a charge of zero.
// It returns a reply to send when the body is unacceptable.
func decode(r *http.Request, v any) (reply, bool) {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, MaxBodyBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, trailing := dec.Token(); !errors.Is(trailing, io.EOF) {
			err = errors.New("the body holds more than one JSON value")
		}
	}
	var tooLarge *http.MaxBytesError
	switch {
	case err == nil:
		return reply{}, true
	case errors.As(err, &tooLarge):
		return fail(http.StatusRequestEntityTooLarge, idemhttp.ProblemBodyTooLarge,
			fmt.Sprintf("the body is larger than %d bytes", MaxBodyBytes)), false
	default:
		return fail(http.StatusBadRequest, ProblemInvalidRequest, "invalid JSON body: "+err.Error()), false
	}
}
