package integration_test

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

func aeadSealer(t *testing.T) idem.Sealer {
	t.Helper()
	block, err := aes.NewCipher(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	return idem.NewAEADSealer(aead)
}

// With a sealer, everything a replay trusts is sealed: editing a row's
// status, request hash or result, or moving a result to another key, makes
// the replay fail with ErrCorruptRecord instead of replaying a forgery; and
// the refusal is not stored in plain text.
func TestSealedRowsResistTampering(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setupSealed := func(t *testing.T) (*setup, *idem.Client) {
		s := newSetup(t)
		keys, err := idem.NewClient(s.pool, &idem.Config{Sealer: aeadSealer(t)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := idem.Do(ctx, keys, "paid", "hash-paid", func(pgx.Tx) (string, error) { return "receipt 42", nil }); err != nil {
			t.Fatal(err)
		}
		_, err = idem.Do(ctx, keys, "declined", "hash-declined", func(pgx.Tx) (string, error) {
			return "", idem.Refuse("card_declined", "the card was declined; contact 555-0100")
		})
		if r := (*idem.Refusal)(nil); !errors.As(err, &r) {
			t.Fatalf("refusal: %v", err)
		}
		return s, keys
	}
	replay := func(keys *idem.Client, key, hash string) error {
		_, err := idem.Do(ctx, keys, key, hash, func(pgx.Tx) (string, error) { return "ran again", nil })
		return err
	}
	corrupt := func(t *testing.T, err error, what string) {
		t.Helper()
		if !errors.Is(err, idem.ErrCorruptRecord) {
			t.Fatalf("%s: %v, want ErrCorruptRecord", what, err)
		}
	}

	t.Run("nothing readable at rest", func(t *testing.T) {
		t.Parallel()
		s, _ := setupSealed(t)
		// A sealed row's refusal column holds only the marker "sealed".
		if n := s.count(`SELECT count(*) FROM idempotency_keys WHERE refusal IS DISTINCT FROM '"sealed"' OR position('receipt'::bytea in response) > 0 OR position('declined'::bytea in response) > 0`); n != 0 {
			t.Fatalf("%d rows hold a result or refusal in plain text", n)
		}
	})
	t.Run("status flipped", func(t *testing.T) {
		t.Parallel()
		s, keys := setupSealed(t)
		s.exec("UPDATE idempotency_keys SET status = CASE status WHEN 'refused' THEN 'completed' ELSE 'refused' END")
		corrupt(t, replay(keys, "paid", "hash-paid"), "a success turned into a refusal")
		corrupt(t, replay(keys, "declined", "hash-declined"), "a refusal turned into a success")
	})
	t.Run("request hash rewritten", func(t *testing.T) {
		t.Parallel()
		s, keys := setupSealed(t)
		s.exec("UPDATE idempotency_keys SET request_hash = 'hash-attacker' WHERE idempotency_key = 'paid'")
		corrupt(t, replay(keys, "paid", "hash-attacker"), "another request replaying the stored answer")
	})
	t.Run("result moved to another key", func(t *testing.T) {
		t.Parallel()
		s, keys := setupSealed(t)
		s.exec(`UPDATE idempotency_keys AS d SET response = p.response, status = p.status, request_hash = p.request_hash
			FROM idempotency_keys AS p WHERE p.idempotency_key = 'paid' AND d.idempotency_key = 'declined'`)
		corrupt(t, replay(keys, "declined", "hash-paid"), "a sealed result copied to another key")
		if _, err := keys.Lookup(ctx, "", "declined"); !errors.Is(err, idem.ErrCorruptRecord) {
			t.Fatalf("Lookup of the moved row: %v", err)
		}
	})
	t.Run("untouched rows replay", func(t *testing.T) {
		t.Parallel()
		_, keys := setupSealed(t)
		got, err := idem.Do(ctx, keys, "paid", "hash-paid", func(pgx.Tx) (string, error) { return "ran again", nil })
		if err != nil || got != "receipt 42" {
			t.Fatalf("replay = %q, %v", got, err)
		}
		err = replay(keys, "declined", "hash-declined")
		var r *idem.Refusal
		if !errors.As(err, &r) || r.Code != "card_declined" || r.Message != "the card was declined; contact 555-0100" {
			t.Fatalf("replayed refusal = %v", err)
		}
		rec, err := keys.Lookup(ctx, "", "declined")
		if err != nil || rec.Refusal == nil || rec.Refusal.Code != "card_declined" {
			t.Fatalf("Lookup = %+v, %v", rec, err)
		}
	})
}

func (s *setup) exec(sql string, args ...any) {
	s.t.Helper()
	if _, err := s.pool.Exec(context.Background(), sql, args...); err != nil {
		s.t.Fatalf("%s: %v", sql, err)
	}
}
