package processor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/google/uuid"
)

// A Charge is what the service asks the processor to charge: the body of
// POST /charges.
type Charge struct {
	PaymentID uuid.UUID `json:"payment_id"`
	AccountID uuid.UUID `json:"account_id"`
	Amount    int64     `json:"amount"` // in cents
	Currency  string    `json:"currency"`
}

// ErrRejected means the processor refused the request itself (a 4xx other
// than 408, 409 and 429: a malformed request, or a key reused for another
// charge): sending it again cannot succeed. Any other error from
// Client.Charge leaves the outcome unknown.
var ErrRejected = errors.New("processor: request rejected")

// maxAnswerBytes bounds what Charge reads of an answer.
const maxAnswerBytes = 64 << 10

// maxIDBytes bounds a charge id: it is stored with the payment.
const maxIDBytes = 255

// A Client charges through the processor at a base URL. It is safe for
// concurrent use.
type Client struct {
	charges string // {base}/charges
	http    *http.Client
}

// ErrInsecureURL means a processor base URL is plain http on a host other
// than the loopback interface: the charge, its idempotency key and the
// processor's answer would cross the network readable and forgeable by
// anyone in the path.
var ErrInsecureURL = errors.New("processor: the base URL must be https unless its host is loopback")

// NewClient returns a client of the processor at baseURL ("/charges" is
// appended to its path), sending through a copy of hc, or of
// http.DefaultClient when hc is nil. baseURL must be an absolute https URL;
// plain http is accepted only for a loopback host (localhost, 127.0.0.0/8,
// ::1), as a local fake processor is, and is otherwise refused with
// ErrInsecureURL. Bound each call with its ctx.
//
// The copy never follows redirects (Charge fails on a 3xx): a charge is
// sent to the processor's own address or not at all. net/http would
// otherwise resend a 307 or 308's body and Idempotency-Key to wherever
// the answer points, an internal address included, and take that
// address's answer for the processor's.
func NewClient(baseURL string, hc *http.Client) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("processor: base URL %q must be an absolute http or https URL", baseURL)
	}
	if u.Scheme == "http" && !isLoopback(u.Hostname()) {
		return nil, fmt.Errorf("%w: %q", ErrInsecureURL, baseURL)
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	noRedirects := *hc
	noRedirects.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Client{charges: strings.TrimSuffix(u.String(), "/") + "/charges", http: &noRedirects}, nil
}

// isLoopback reports whether host names the loopback interface: localhost
// or a loopback IP address.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Charge asks the processor to charge c under the idempotency key and
// returns the processor's charge id. ctx bounds the call.
//
// The same key and charge always get the same id back, however often they
// are sent: when Charge returns an error other than ErrRejected (a 5xx, a redirect, a
// timeout, a lost answer), the charge may or may not have been made, and
// the only safe next step is to call Charge again with the same key and
// the same charge. A key must never be sent with another charge: the
// processor refuses it (ErrRejected).
func (c *Client) Charge(ctx context.Context, key string, ch Charge) (string, error) {
	body, err := json.Marshal(ch)
	if err != nil {
		return "", fmt.Errorf("processor: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.charges, bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("processor: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	res, err := c.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("processor: charge: %w", err)
	}
	defer res.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(res.Body, maxAnswerBytes))
	if err != nil {
		return "", fmt.Errorf("processor: charge: reading the answer: %w", err)
	}
	switch {
	case res.StatusCode == http.StatusCreated:
	case res.StatusCode >= 300 && res.StatusCode < 400:
		// Not followed (see NewClient). Whatever the processor meant, it
		// did not answer a charge: the outcome is unknown, and a retry
		// sends the same key to the same address.
		return "", fmt.Errorf("processor: charge: status %d (a redirect, not followed)", res.StatusCode)
	case res.StatusCode == http.StatusRequestTimeout, res.StatusCode == http.StatusConflict,
		res.StatusCode == http.StatusTooManyRequests, res.StatusCode >= 500:
		return "", fmt.Errorf("processor: charge: status %d", res.StatusCode)
	default:
		return "", fmt.Errorf("%w: status %d", ErrRejected, res.StatusCode)
	}
	var created struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(answer, &created); err != nil || created.ID == "" || len(created.ID) > maxIDBytes {
		return "", fmt.Errorf("processor: charge: the answer holds no valid charge id")
	}
	return created.ID, nil
}
