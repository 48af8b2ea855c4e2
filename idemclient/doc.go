// Package idemclient is the client half of idempotency keys: it retries a
// request that may not have gone through with the same Idempotency-Key and
// the same body, and knows which answers must not be retried.
//
// A retry is only safe with the key of the first attempt: a server that
// stores results by key (idem's idemhttp, Stripe, any server that follows
// the IETF draft "The Idempotency-Key HTTP Header Field",
// draft-ietf-httpapi-idempotency-key-header) answers it with the stored
// result instead of running the operation again. A key made anew for each
// attempt, a body that differs, or a retried 422 turns the retry into a
// second operation or a stream of refusals.
//
//	client, err := idemclient.NewClient(nil, nil) // http.DefaultTransport, the default Policy
//	...
//	req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(`{"amount":500}`))
//	resp, err := client.Do(req) // one key, kept across every attempt
//	res, _ := idemclient.ResultOf(resp) // res.Key, res.Attempts, res.Replayed
//
// # One key per logical operation
//
// The Transport gives a POST or PATCH a key once, before the first attempt,
// and sends it with every attempt: the Idempotency-Key the request already
// carries, else the key of its context (ContextWithKey: a key stored with
// the order it pays, say, so that a restarted process retries with it),
// else a new UUID (Policy.UUIDVersion: 4 or 7). The body is sent again
// from req.GetBody; a request with a body and no GetBody is refused with
// ErrBodyNotReplayable before anything is sent.
//
// # What is retried
//
//	a transport error (refused, reset, timeout before the answer)  retried
//	409 Conflict: a request with the key is still in progress        retried after Retry-After
//	425 Too Early, 429 Too Many Requests                           retried after Retry-After
//	500, 502, 503 (idem's outcome-unknown answer too), 504           retried after Retry-After
//	400, 401, 403, 404, 422, every other 4xx, 501                   returned at once
//	the caller's context cancelled, a TLS certificate refused        returned at once
//
// A 500 is retried, though idem's middleware answers it for failures no
// retry cures, because idem's operation handler answers it for an
// operation whose step failed, which a retry with the same key resumes,
// and the key makes the retry safe either way.
//
// Each wait is the jittered exponential backoff of the Policy, or the
// answer's Retry-After when that is longer. The attempts are bounded by
// Policy.MaxAttempts and the time by the request's context: when the next
// wait would pass its deadline, or a Retry-After is longer than
// Policy.MaxRetryAfter, the caller receives the last answer (or error) at
// once rather than an error about a deadline. A 503 that says the outcome
// is unknown (idem's type ".../problems/outcome-unknown") must only ever
// be retried with the same key: the operation may have committed.
//
// What the caller receives is the last answer, whatever its status, with
// ResultOf saying which key was sent, how many attempts were made and
// whether the answer was replayed (Idempotent-Replayed: true); or, when
// no attempt was answered, a *RetryError. ProblemOf reads an answer's RFC
// 9457 problem document, such as the one idem sends with a 422 for a key
// used with another request: that is a caller's bug, never retried.
//
// # The draft and Stripe
//
// Where the draft and Stripe's documented behaviour differ, this package
// follows the draft:
//
//   - A key reused with another request: the draft answers 422, Stripe 400
//     (an idempotency_error). Neither is retried.
//   - A key whose first request is still running: both answer 409 (the
//     draft names it; Stripe's code is idempotency_key_in_use), and it is
//     retried after Retry-After, when the stored answer will be there.
//   - The header's value: the draft makes it an RFC 8941 string, so a key
//     this package makes is sent in double quotes; Stripe takes any string,
//     quotes included, and treats it the same on every attempt. A server
//     that wants bare keys gets them when the caller sets the header
//     itself, which the Transport sends as it is.
//
// docs/CLIENTS.md in the repository says more.
//
// # net/http's own retry
//
// net/http's Transport already re-sends, once and by itself, a request
// that carries an Idempotency-Key header (and whose body it can get again)
// when a kept-alive connection turns out to be dead before any answer
// came. That re-send has the same key and body, so it is as safe as this
// package's retries, but it happens below the Transport and is not counted
// in Result.Attempts. A caller that needs every request on the wire
// counted uses a transport with DisableKeepAlives.
//
// Packages retryablehttp (for github.com/hashicorp/go-retryablehttp) and
// grpcclient (a gRPC unary client interceptor) apply the same Policy to
// those clients.
package idemclient
