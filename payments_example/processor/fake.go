package processor

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"unicode/utf8"

	"github.com/google/uuid"
)

// FakeConfig says how a Fake misbehaves. The zero value is a processor
// that always answers.
type FakeConfig struct {
	// FailRate is the share of calls answered 503 before anything is
	// charged, in [0, 1).
	FailRate float64
	// LoseRate is the share of the remaining calls whose charge is made
	// (or found, for a known key) and whose answer is then lost: the
	// connection is closed without a response. In [0, 1).
	LoseRate float64
	// Seed decides which calls fail and which answers are lost. The
	// decision depends only on the seed, the key and how many calls the
	// key has had, so that runs repeat.
	Seed uint64
}

// A Fake is an in-memory payment processor that honours idempotency keys
// (one charge per key; the same answer for the same key and body; 422 for
// the same key with another body) and fails or loses answers as its
// FakeConfig says. It serves POST /charges (the protocol of the package
// doc) and, for people, GET /charges: the statistics and every charge, as
// JSON. It is safe for concurrent use; its state lives as long as it does.
type Fake struct {
	cfg FakeConfig

	mu      sync.Mutex
	byKey   map[string]*FakeCharge
	calls   map[string]int // calls per key, charged or not
	charges []*FakeCharge  // in the order they were made
	stats   FakeStats
}

// A FakeCharge is a charge a Fake made.
type FakeCharge struct {
	ID  string `json:"id"`
	Key string `json:"idempotency_key"`
	Charge
	// Calls counts the calls that asked for this charge under its key:
	// the first, and every retry, answered or not.
	Calls int `json:"calls"`
}

// FakeStats counts what a Fake did.
type FakeStats struct {
	Calls    int `json:"calls"`     // POST /charges received
	Charges  int `json:"charges"`   // charges made: one per key
	Replays  int `json:"replays"`   // calls answered with an existing charge
	Failed   int `json:"failed"`    // calls answered 503 before charging
	Lost     int `json:"lost"`      // calls whose answer was dropped after charging
	Rejected int `json:"rejected"`  // calls refused 400 or 422
	Reused   int `json:"key_reuse"` // of which 422: a known key with another body
}

// NewFake returns a Fake configured by cfg.
func NewFake(cfg FakeConfig) (*Fake, error) {
	for _, r := range []float64{cfg.FailRate, cfg.LoseRate} {
		if r < 0 || r >= 1 {
			return nil, fmt.Errorf("processor: fail and lose rates must be in [0, 1), got %v", r)
		}
	}
	return &Fake{cfg: cfg, byKey: map[string]*FakeCharge{}, calls: map[string]int{}}, nil
}

// Stats returns what the fake has done so far.
func (f *Fake) Stats() FakeStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}

// Charges returns a copy of every charge made so far, in order.
func (f *Fake) Charges() []FakeCharge {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]FakeCharge, len(f.charges))
	for i, c := range f.charges {
		out[i] = *c
	}
	return out
}

// maxKeyBytes bounds an idempotency key, as most processors do.
const maxKeyBytes = 255

func (f *Fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/charges" && r.Method == http.MethodPost:
		f.charge(w, r)
	case r.URL.Path == "/charges" && r.Method == http.MethodGet:
		f.mu.Lock()
		state := struct {
			Stats   FakeStats     `json:"stats"`
			Charges []*FakeCharge `json:"charges"`
		}{f.stats, slices.Clone(f.charges)}
		body, err := json.Marshal(state)
		f.mu.Unlock()
		if err != nil {
			http.Error(w, "encoding the state", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	default:
		http.NotFound(w, r)
	}
}

func (f *Fake) charge(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		f.reject(w, http.StatusBadRequest, "the body could not be read")
		return
	}
	var c Charge
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	switch {
	case key == "" || len(key) > maxKeyBytes || !utf8.ValidString(key):
		f.reject(w, http.StatusBadRequest, "an Idempotency-Key of 1 to 255 bytes is required")
		return
	case dec.Decode(&c) != nil:
		f.reject(w, http.StatusBadRequest, "the body is not a charge")
		return
	case c.PaymentID == uuid.Nil || c.AccountID == uuid.Nil || c.Amount <= 0 || c.Currency != "USD":
		f.reject(w, http.StatusBadRequest, "payment_id and account_id must be set, amount positive, currency USD")
		return
	}

	f.mu.Lock()
	n := f.calls[key]
	f.calls[key]++
	f.stats.Calls++
	fail, lose := f.decide(key, n)
	if fail {
		f.stats.Failed++
		f.mu.Unlock()
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	}
	ch, known := f.byKey[key]
	switch {
	case known && ch.Charge != c:
		f.stats.Rejected++
		f.stats.Reused++
		f.mu.Unlock()
		http.Error(w, "this Idempotency-Key was used for another charge", http.StatusUnprocessableEntity)
		return
	case known:
		f.stats.Replays++
	default:
		ch = &FakeCharge{ID: newChargeID(), Key: key, Charge: c}
		f.byKey[key] = ch
		f.charges = append(f.charges, ch)
		f.stats.Charges++
	}
	ch.Calls++
	id := ch.ID
	if lose {
		f.stats.Lost++
	}
	f.mu.Unlock()

	if lose {
		// The charge is made; the caller never hears of it.
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
			return
		}
		panic(http.ErrAbortHandler) // HTTP/2: abort the stream instead
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(struct {
		ID string `json:"id"`
	}{id})
}

// reject answers a request the fake refuses; nothing is charged.
func (f *Fake) reject(w http.ResponseWriter, status int, msg string) {
	f.mu.Lock()
	f.stats.Calls++
	f.stats.Rejected++
	f.mu.Unlock()
	http.Error(w, msg, status)
}

// newChargeID returns a charge id that no other fake, in this process or
// another, hands out: a processor's ids are unique across its merchants.
func newChargeID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return "ch_" + hex.EncodeToString(b)
}

// decide draws whether the n-th call (from 0) with key fails before
// charging, and whether its answer is lost after charging.
func (f *Fake) decide(key string, n int) (fail, lose bool) {
	sum := sha256.Sum256(fmt.Appendf(nil, "%d/%s/%d", f.cfg.Seed, key, n))
	u := func(b []byte) float64 { return float64(binary.BigEndian.Uint64(b)>>11) / (1 << 53) }
	return u(sum[0:8]) < f.cfg.FailRate, u(sum[8:16]) < f.cfg.LoseRate
}
