package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemhq/idem/idemclient"
	"github.com/idemhq/idem/payments_example/api"
)

// A payment the client wants made exactly once.
type payment struct {
	key    string // the Idempotency-Key, the same on every retry
	amount int64  // in cents
}

// newRetryingClient returns the HTTP client a careful payer uses: an
// idemclient.Transport, which retries what may not have gone through (a
// broken connection, a 5xx but 501, a 409 while the first attempt
// still runs) with the same Idempotency-Key and body and a short backoff,
// and returns at once what must not be retried (a 422). It sends through
// wrap(transport) (nil: the transport) and counts the retries.
func newRetryingClient(retries *atomic.Int64, wrap func(http.RoundTripper) http.RoundTripper) *http.Client {
	// One connection per attempt. With keep-alive, net/http resends a
	// request that carries an Idempotency-Key by itself when a reused
	// connection breaks, and that retry would go uncounted here. An
	// attempt that hangs is given up after 10 s, and retried.
	var transport http.RoundTripper = &http.Transport{DisableKeepAlives: true, ResponseHeaderTimeout: 10 * time.Second}
	if wrap != nil {
		transport = wrap(transport)
	}
	retrying, err := idemclient.NewTransport(transport, &idemclient.Policy{
		// Up to about 10 s of retries: long enough to outlast a restart
		// of the service.
		MaxAttempts: 26,
		MinBackoff:  5 * time.Millisecond,
		MaxBackoff:  500 * time.Millisecond,
	})
	if err != nil {
		panic(err) // the policy above is valid
	}
	return &http.Client{Transport: retryCounter{retrying, retries}, Timeout: time.Minute}
}

// newNaiveClient returns the client the demo compares idemclient with:
// go-retryablehttp with its defaults (4 retries, 1 s to 30 s apart, of
// connection errors, 429 and 5xx) and a new Idempotency-Key on every
// attempt, the mistake a hand-written retry makes. It sends through
// wrap(transport) (nil: the transport), one connection per attempt as
// newRetryingClient does, and counts the retries.
func newNaiveClient(retries *atomic.Int64, wrap func(http.RoundTripper) http.RoundTripper) *http.Client {
	c := retryablehttp.NewClient()
	var transport http.RoundTripper = &http.Transport{DisableKeepAlives: true}
	if wrap != nil {
		transport = wrap(transport)
	}
	c.HTTPClient = &http.Client{Transport: transport, Timeout: 10 * time.Second}
	c.Logger = nil
	c.RequestLogHook = func(_ retryablehttp.Logger, req *http.Request, attempt int) {
		if attempt > 0 {
			retries.Add(1)
			req.Header.Set("Idempotency-Key", uuid.NewString())
		}
	}
	return c.StandardClient()
}

// retryCounter adds the retries of each request sent through next, an
// idemclient.Transport, to retries.
type retryCounter struct {
	next    http.RoundTripper
	retries *atomic.Int64
}

func (c retryCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	var noAnswer *idemclient.RetryError
	if res, ok := idemclient.ResultOf(resp); ok {
		c.retries.Add(int64(res.Attempts - 1))
	} else if errors.As(err, &noAnswer) {
		c.retries.Add(int64(noAnswer.Attempts - 1))
	}
	return resp, err
}

// newAPIClient returns the client generated from the service's spec
// (package api) for the service at baseURL, sending requests through doer
// and apiKey, if any, as the Bearer token.
func newAPIClient(baseURL, apiKey string, doer api.HttpRequestDoer) (*api.ClientWithResponses, error) {
	return api.NewClientWithResponses(baseURL,
		api.WithHTTPClient(doer),
		api.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
			if apiKey != "" {
				req.Header.Set("Authorization", "Bearer "+apiKey)
			}
			return nil
		}))
}

// A result is what one payment came to: the payment answered 201, or
// the error that ended its retries.
type result struct {
	payment api.Payment
	err     error
}

// payAll sends every payment of plan from workers goroutines through client
// and returns what each came to, counting the payments answered in
// answered as it goes.
func payAll(ctx context.Context, client *api.ClientWithResponses, accountID uuid.UUID, plan []payment, workers int, answered *atomic.Int64) []result {
	results := make([]result, len(plan))
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				results[i].payment, results[i].err = pay(ctx, client, accountID, plan[i])
				answered.Add(1)
			}
		})
	}
	for i := range plan {
		next <- i
	}
	close(next)
	wg.Wait()
	return results
}

// pay makes one payment. The retries happen underneath, in the retrying
// client, which resends the same request: the same Idempotency-Key, the
// same body.
func pay(ctx context.Context, client *api.ClientWithResponses, accountID uuid.UUID, p payment) (api.Payment, error) {
	res, err := client.CreatePaymentWithResponse(ctx,
		&api.CreatePaymentParams{IdempotencyKey: p.key},
		api.CreatePaymentJSONRequestBody{AccountId: accountID, Amount: p.amount, Currency: api.USD})
	if err != nil {
		return api.Payment{}, err
	}
	if res.JSON201 == nil {
		return api.Payment{}, fmt.Errorf("payment %s: status %d", p.key, res.StatusCode())
	}
	return *res.JSON201, nil
}
