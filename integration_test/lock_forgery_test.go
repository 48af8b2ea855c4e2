package integration_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// The two keys share hashtext(scope || 0x1f || key), the 32-bit lock the
// claim once took: found by a birthday search over 200,000 keys per scope.
const (
	victimScope, victimKey     = "account:1", "4208"
	attackerScope, attackerKey = "account:2", "x112018"
)

// TestLockKeyCannotBeForged holds a victim's claim while a key chosen to
// collide with it under the old 32-bit lock is claimed in the attacker's
// own scope: the attacker's call must run (its lock is another), and
// Lookup must not report the attacker's never-used key in progress. It also
// checks that the claim holds the lock docs/SECURITY.md describes: 64 bits
// of SHA-256 over scope, 0x1f and key, XOR the table's oid in the high half.
func TestLockKeyCannotBeForged(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var hv, ha int32
	if err := s.pool.QueryRow(ctx, "SELECT hashtext($1 || E'\\x1f' || $2), hashtext($3 || E'\\x1f' || $4)",
		victimScope, victimKey, attackerScope, attackerKey).Scan(&hv, &ha); err != nil || hv != ha {
		t.Fatalf("the pair no longer collides under hashtext (%d, %d, %v): find another", hv, ha, err)
	}
	held, release := make(chan struct{}), make(chan struct{})
	victim := make(chan error, 1)
	go func() {
		_, err := idem.Do(idem.ContextWithScope(ctx, victimScope), s.pool, victimKey, "h", func(pgx.Tx) (int, error) {
			close(held)
			<-release
			return 1, nil
		})
		victim <- err
	}()
	<-held

	keys, err := idem.NewClient(s.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Lookup(ctx, attackerScope, attackerKey); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Lookup of the attacker's unused key while the victim's is held: %v; want ErrNotFound", err)
	}
	sum := sha256.Sum256([]byte(victimScope + "\x1f" + victimKey))
	var table uint32
	if err := s.pool.QueryRow(ctx, "SELECT 'idempotency_keys'::regclass::oid").Scan(&table); err != nil {
		t.Fatal(err)
	}
	want := binary.BigEndian.Uint64(sum[:8]) ^ uint64(table)<<32
	if n := s.count(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted
		AND classid = $1::bigint::oid AND objid = $2::bigint::oid`, int64(want>>32), int64(want&0xffffffff)); n != 1 {
		t.Errorf("the victim's claim holds no lock %#x (SHA-256 of scope and key, XOR the table's oid)", want)
	}
	_, outcome, err := idem.Run(idem.ContextWithScope(ctx, attackerScope), s.pool, attackerKey, "h",
		func(context.Context, pgx.Tx) (int, error) { return 2, nil })
	close(release)
	if err != nil || outcome != idem.OutcomeExecuted {
		t.Fatalf("the attacker's own key while the victim's is held: %v, %v; want it executed (its lock is not the victim's)", outcome, err)
	}
	if err := <-victim; err != nil {
		t.Fatal(err)
	}
}
