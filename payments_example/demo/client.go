package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemhq/idem/payments_example/api"
)

// A payment the client wants made exactly once.
type payment struct {
	key    string // the Idempotency-Key, the same on every retry
	amount int64  // in cents
}

// newRetryingClient returns the HTTP client a careful payer uses: it
// retries what may not have gone through (a broken connection, a 5xx, a
// 409 while the first attempt still runs, a service restarting) with a
// short backoff, sends through wrap(transport) (nil: the transport), and
// counts the retries.
func newRetryingClient(retries *atomic.Int64, wrap func(http.RoundTripper) http.RoundTripper) *retryablehttp.Client {
	c := retryablehttp.NewClient()
	// One connection per attempt. With keep-alive, net/http resends a
	// request that carries an Idempotency-Key by itself when a reused
	// connection breaks, and that retry would go uncounted here.
	var transport http.RoundTripper = &http.Transport{DisableKeepAlives: true}
	if wrap != nil {
		transport = wrap(transport)
	}
	c.HTTPClient = &http.Client{Transport: transport, Timeout: 10 * time.Second}
	// Up to about 10 s of retries: long enough to outlast a restart of
	// the service.
	c.RetryMax = 25
	c.RetryWaitMin = 5 * time.Millisecond
	c.RetryWaitMax = 500 * time.Millisecond
	c.Logger = nil
	c.RequestLogHook = func(_ retryablehttp.Logger, _ *http.Request, attempt int) {
		if attempt > 0 {
			retries.Add(1)
		}
	}
	c.CheckRetry = func(ctx context.Context, res *http.Response, err error) (bool, error) {
		if err == nil && res.StatusCode == http.StatusConflict && ctx.Err() == nil {
			return true, nil // the first attempt is still running: ask again
		}
		return retryablehttp.DefaultRetryPolicy(ctx, res, err)
	}
	return c
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
