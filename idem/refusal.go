package idem

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
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

// storedRefusal is a Refusal as the refusal column (jsonb) holds it. jsonb
// cannot hold U+0000, even escaped (SQLSTATE 22P05), nor invalid UTF-8: a
// refusal whose code or message holds either is stored with both in base64
// ("enc": "base64"), so that it is stored and replayed exactly, rather than
// failing every attempt with an error any client that chooses the message's
// text could provoke.
type storedRefusal struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
	Status  int    `json:"status,omitempty"`
	Enc     string `json:"enc,omitempty"`
}

const refusalBase64 = "base64"

func (r *Refusal) marshal() ([]byte, error) {
	s := storedRefusal{Code: r.Code, Message: r.Message, Status: r.Status}
	if !jsonbText(r.Code) || !jsonbText(r.Message) {
		enc := base64.StdEncoding.EncodeToString
		s.Code, s.Message, s.Enc = enc([]byte(r.Code)), enc([]byte(r.Message)), refusalBase64
	}
	return json.Marshal(s)
}

// unmarshalRefusal reads what marshal stored.
func unmarshalRefusal(data []byte) (*Refusal, error) {
	var s storedRefusal
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, err
	}
	switch s.Enc {
	case "":
	case refusalBase64:
		code, err := base64.StdEncoding.DecodeString(s.Code)
		if err != nil {
			return nil, err
		}
		msg, err := base64.StdEncoding.DecodeString(s.Message)
		if err != nil {
			return nil, err
		}
		s.Code, s.Message = string(code), string(msg)
	default:
		return nil, fmt.Errorf("unknown refusal encoding %q", s.Enc)
	}
	if s.Code == "" {
		return nil, fmt.Errorf("a refusal without a code")
	}
	return &Refusal{Code: s.Code, Message: s.Message, Status: s.Status}, nil
}

// jsonbText reports whether jsonb can hold s as it is.
func jsonbText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }
