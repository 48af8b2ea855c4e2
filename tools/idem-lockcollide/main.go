// Command idem-lockcollide runs, for a bounded time, the attack on the
// claim's advisory lock that docs/SECURITY.md describes: given a victim's
// scope and key, find a key in the attacker's own scope whose lock is the
// victim's, so that the attacker's call answers the victim "in progress".
//
// The lock was hashtext(scope || 0x1f || key): 32 bits, unkeyed, and
// invertible, found in milliseconds. It is now 64 bits of SHA-256 (idem's
// lockKey), which has no inverse to take, so the only attack left is brute
// force. The command first checks, against a real claim on the server, that
// it computes the lock idem takes, then hashes candidate keys for -duration
// and prints the rate, the hits and the expected time to a first hit.
//
//	go run ./idem-lockcollide -duration 30s
package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"flag"
	"fmt"
	"log"
	"math"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/pgurl"
)

func main() {
	duration := flag.Duration("duration", 30*time.Second, "how long to search")
	victimScope := flag.String("victim-scope", "account:1", "the victim's scope (assumed known to the attacker)")
	victimKey := flag.String("victim-key", "7b0c3f0e-6d43-4c8e-9a59-3f1c2b8d4e11", "the victim's key")
	attackerScope := flag.String("attacker-scope", "account:2", "the attacker's own scope")
	verify := flag.Bool("verify", true, "check the computed lock against a real claim on the server first")
	flag.Parse()

	if *verify {
		if err := verifyLock(*victimScope, *victimKey); err != nil {
			log.Fatal(err)
		}
	}
	target := lockKey(*victimScope, *victimKey)
	var tried, hits atomic.Uint64
	deadline := time.Now().Add(*duration)
	var wg sync.WaitGroup
	for w := range runtime.NumCPU() {
		wg.Go(func() {
			buf := make([]byte, 0, 64)
			for n := uint64(w); time.Now().Before(deadline); {
				for range 4096 {
					buf = strconv.AppendUint(buf[:0], n, 36)
					if lockKey(*attackerScope, string(buf)) == target {
						hits.Add(1)
					}
					n += uint64(runtime.NumCPU())
				}
				tried.Add(4096)
			}
		})
	}
	wg.Wait()
	rate := float64(tried.Load()) / duration.Seconds()
	years := math.Pow(2, 64) / rate / (365.25 * 24 * 3600)
	fmt.Printf("searched %v on %d CPUs: %d candidate keys, %.3g keys/s, %d hits\n", *duration, runtime.NumCPU(), tried.Load(), rate, hits.Load())
	fmt.Printf("expected time to a first hit at this rate: 2^64 / %.3g keys/s = %.3g years\n", rate, years)
}

// lockKey is idem's (idem/lockkey.go): the first eight bytes of SHA-256
// over scope, 0x1f and key. The claim XORs the table's oid into the high
// half, which is the same for the victim's key and the attacker's.
func lockKey(scope, key string) int64 {
	h := sha256.New()
	h.Write([]byte(scope))
	h.Write([]byte{0x1f})
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	return int64(binary.BigEndian.Uint64(h.Sum(sum[:0])))
}

// verifyLock holds a real claim of (scope, key) on the server and checks
// that pg_locks shows the lock lockKey predicts.
func verifyLock(scope, key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, pgurl.Server())
	if err != nil {
		return err
	}
	defer pool.Close()
	var table uint32
	if err := pool.QueryRow(ctx, "SELECT 'idempotency_keys'::regclass::oid").Scan(&table); err != nil {
		return fmt.Errorf("the key table (apply schema/001_idempotency_keys.sql): %w", err)
	}
	held, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := idem.Do(idem.ContextWithScope(ctx, scope), pool, key, "h", func(pgx.Tx) (int, error) {
			close(held)
			<-release
			return 0, fmt.Errorf("rolled back on purpose")
		})
		done <- err
	}()
	select {
	case <-held:
	case err := <-done:
		return fmt.Errorf("the claim: %w", err)
	}
	defer func() {
		close(release)
		if err := <-done; err == nil {
			log.Print("the claim that held the lock committed; it should have rolled back")
		}
	}()
	want := uint64(lockKey(scope, key)) ^ uint64(table)<<32
	var n int
	err = pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted
		AND classid = $1::bigint::oid AND objid = $2::bigint::oid`, int64(want>>32), int64(want&math.MaxUint32)).Scan(&n)
	if err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("no lock %#x held by the claim of %q in scope %q: lockKey is not the lock idem takes", want, key, scope)
	}
	fmt.Printf("verified: the claim of the victim's key holds lock %#x (64 bits of SHA-256 XOR the table's oid)\n", want)
	return nil
}
