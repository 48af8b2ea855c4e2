package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-retryablehttp"
)

// A payment the client wants made exactly once.
type payment struct {
	key    string // the Idempotency-Key, the same on every retry
	amount int64  // in cents
}

// newClient returns the client a careful payer uses: it retries what may
// not have gone through (a broken connection, a 5xx, a 409 while the first
// attempt still runs) with a short backoff, and counts the retries.
func newClient(retries *atomic.Int64) *retryablehttp.Client {
	c := retryablehttp.NewClient()
	// One connection per attempt. With keep-alive, net/http resends a
	// request that carries an Idempotency-Key by itself when a reused
	// connection breaks, and that retry would go uncounted here.
	c.HTTPClient = &http.Client{
		Transport: &http.Transport{DisableKeepAlives: true},
		Timeout:   10 * time.Second,
	}
	c.RetryMax = 10
	c.RetryWaitMin = 5 * time.Millisecond
	c.RetryWaitMax = 100 * time.Millisecond
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

// payAll sends every payment to baseURL/payments from workers goroutines
// and returns, per payment, nil if it was answered 201 and the error
// otherwise.
func payAll(ctx context.Context, client *retryablehttp.Client, baseURL string, accountID int64, plan []payment, workers int) []error {
	errs := make([]error, len(plan))
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				errs[i] = pay(ctx, client, baseURL, accountID, plan[i])
			}
		})
	}
	for i := range plan {
		next <- i
	}
	close(next)
	wg.Wait()
	return errs
}

func pay(ctx context.Context, client *retryablehttp.Client, baseURL string, accountID int64, p payment) error {
	body := fmt.Appendf(nil, `{"account_id": %d, "amount": %d, "currency": "USD"}`, accountID, p.amount)
	req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/payments", body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", p.key) // retryablehttp resends the same headers and body
	res, err := client.Do(req)
	if err != nil {
		return err
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		return fmt.Errorf("payment %s: status %d", p.key, res.StatusCode)
	}
	return nil
}
