package payments

import (
	"encoding/json"
	"net/http"

	"github.com/idemhq/idem/idemhttp"
)

// The problem types (RFC 9457) of the service's own error answers; clients
// branch on them. Like idemhttp's, they are relative references, resolved
// against the service's URL. Answers that idemhttp gives itself (a missing
// key, a key in progress, a key reused for another request) carry
// idemhttp's types; so do the service's 401 (idemhttp.ProblemUnauthorized),
// 503 (idemhttp.ProblemUnavailable) and 413 (idemhttp.ProblemBodyTooLarge,
// whether or not the request has a key). The spec (../../openapi.yaml)
// lists each type under the statuses that carry it.
const (
	// ProblemInvalidRequest: the body is not one JSON object of the
	// expected fields, or a field is out of range. 400, not stored.
	ProblemInvalidRequest = "/problems/payments/invalid-request"
	// ProblemNoSuchAccount: the account does not exist, or is not the API
	// key's. 404, never stored under an Idempotency-Key.
	ProblemNoSuchAccount = "/problems/payments/no-such-account"
	// ProblemNoSuchPayment: the payment does not exist, or is not the API
	// key's account's. 404.
	ProblemNoSuchPayment = "/problems/payments/no-such-payment"
	// ProblemInsufficientFunds: the balance does not cover the amount;
	// nothing was charged. 402.
	ProblemInsufficientFunds = "/problems/payments/insufficient-funds"
	// ProblemTooManyRequests: the account sent more POST /payments than
	// its rate limit allows; nothing ran. 429 with Retry-After, not
	// stored.
	ProblemTooManyRequests = "/problems/payments/too-many-requests"
)

var problemTitles = map[string]string{
	ProblemInvalidRequest:        "Invalid request",
	ProblemNoSuchAccount:         "No such account",
	ProblemNoSuchPayment:         "No such payment",
	ProblemInsufficientFunds:     "Insufficient funds",
	ProblemTooManyRequests:       "Too many requests",
	idemhttp.ProblemBodyTooLarge: "Request body too large",
	idemhttp.ProblemUnavailable:  "Service unavailable",
	idemhttp.ProblemMissingKey:   "Idempotency-Key required",
	idemhttp.ProblemUnauthorized: "Unauthorized",
}

// problem is an RFC 9457 problem detail, the body of every error answer.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// reply is what an endpoint answers. It is written only after the request's
// transaction is settled, so a client never sees a success that did not
// commit.
type reply struct {
	status int
	body   any
	header http.Header // extra headers, e.g. Location
}

func respond(status int, body any) reply { return reply{status: status, body: body} }

// fail answers a problem of type typ with a human-readable detail. The
// type "about:blank" says no more than the status.
func fail(status int, typ, detail string) reply {
	title, known := problemTitles[typ]
	if !known {
		title = http.StatusText(status)
	}
	return reply{status: status, body: problem{Type: typ, Title: title, Status: status, Detail: detail}}
}

func (rep reply) write(w http.ResponseWriter) {
	body, err := json.Marshal(rep.body)
	if err != nil {
		rep = fail(http.StatusInternalServerError, "about:blank", "the answer could not be encoded")
		body, _ = json.Marshal(rep.body)
	}
	h := w.Header()
	for k, v := range rep.header {
		h[k] = v
	}
	if _, isProblem := rep.body.(problem); isProblem {
		h.Set("Content-Type", "application/problem+json")
	} else {
		h.Set("Content-Type", "application/json")
	}
	if rep.status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(rep.status)
	_, _ = w.Write(append(body, '\n'))
}
