package idem

import (
	"encoding/json"
	"fmt"
)

// Refusal is a terminal business failure: the operation was understood and
// refused for good (insufficient funds, card declined, order limit reached),
// so every retry must get the same answer.
//
// When fn returns an error that wraps a *Refusal, Do rolls back fn's writes,
// commits the key with the refusal (and with the value fn returned beside it),
// and returns fn's error unchanged. A replay returns the stored value and a
// new *Refusal with the same Code, Message and Status. Any other error from
// fn is a technical failure and is never stored.
//
// Declare refusals as sentinels and compare them with errors.Is, which
// matches two refusals by Code; this holds for first runs and replays alike:
//
//	var ErrInsufficientFunds = idem.Refuse("insufficient_funds", "insufficient funds")
//	...
//	if errors.Is(err, ErrInsufficientFunds) { ... }
type Refusal struct {
	// Code is the stable, machine-readable reason, e.g. "insufficient_funds".
	// It identifies the refusal for errors.Is. Required.
	Code string `json:"code"`
	// Message is the human-readable explanation.
	Message string `json:"message,omitempty"`
	// Status is an optional HTTP status hint, e.g. 402.
	Status int `json:"status,omitempty"`
}

// Refuse returns a refusal with the given code and message.
func Refuse(code, message string) *Refusal {
	return &Refusal{Code: code, Message: message}
}

// WithStatus returns a copy of r with Status set to status.
func (r *Refusal) WithStatus(status int) *Refusal {
	c := *r
	c.Status = status
	return &c
}

// Error returns "refused: <code>: <message>".
func (r *Refusal) Error() string {
	if r.Message == "" {
		return "refused: " + r.Code
	}
	return fmt.Sprintf("refused: %s: %s", r.Code, r.Message)
}

// Is reports whether target is a *Refusal with the same Code.
func (r *Refusal) Is(target error) bool {
	t, ok := target.(*Refusal)
	return ok && t != nil && r != nil && t.Code == r.Code
}

func (r *Refusal) marshal() ([]byte, error) { return json.Marshal(r) }
