package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
)

// components prices the pieces of idem's protocol in server CPU: one
// connection replays the protocol's statements with one piece left out at a
// time, and the backend's CPU time per operation is read from /proc around
// each run. Runs interleave over rounds; the table shows medians. It reads
// the SQL from idem/sql, so run it from the repository root.
func (b *bench) components(ctx context.Context, w io.Writer) error {
	read := func(name string) (string, error) {
		raw, err := os.ReadFile(filepath.Join("idem", "sql", name))
		return string(raw), err
	}
	sql := map[string]string{}
	for _, name := range []string{"claim.sql", "assert_claimed.sql", "complete.sql", "claim_deferred.sql", "assert_deferred.sql", "complete_deferred.sql"} {
		text, err := read(name)
		if err != nil {
			return fmt.Errorf("run from the repository root: %w", err)
		}
		sql[name] = text
	}
	claim, assert, complete := sql["claim.sql"], sql["assert_claimed.sql"], sql["complete.sql"]
	claimDeferred, assertDeferred, completeDeferred := sql["claim_deferred.sql"], sql["assert_deferred.sql"], sql["complete_deferred.sql"]
	if err := b.reset(ctx); err != nil {
		return err
	}
	pool, err := b.pool(ctx, 1, "")
	if err != nil {
		return err
	}
	defer pool.Close()
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer pc.Release()
	conn := pc.Conn()
	var backend int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return err
	}
	if backendCPU(backend) == 0 {
		return fmt.Errorf("the server's backend is not readable in /proc: run on the server's machine")
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS peer.plain_keys (LIKE idempotency_keys INCLUDING ALL) WITH (fillfactor = 80)`); err != nil {
		return err
	}

	seq := 0
	send := func(qs ...[]any) error {
		batch := &pgx.Batch{}
		for _, q := range qs {
			batch.Queue(q[0].(string), q[1:]...)
		}
		return execAll(conn.SendBatch(ctx, batch), len(qs))
	}
	work := func(i int) error {
		var balance, id int64
		account := int64(1 + i%accounts)
		if err := conn.QueryRow(ctx, doWork.debit, account, int64(1)).Scan(&balance); err != nil {
			return err
		}
		return conn.QueryRow(ctx, doWork.ledger, account, int64(1)).Scan(&id)
	}
	q := func(sql string, args ...any) []any { return append([]any{sql}, args...) }
	protocol := func(savepoint, assertClaimed bool) func(int) error {
		return func(i int) error {
			seq++
			key := "component-" + strconv.Itoa(seq)
			first := [][]any{q(claim, "", key, reqHash, int64(86400e6))}
			if assertClaimed {
				first = append(first, q(assert, "", key))
			}
			first = append(first, q("begin"))
			if savepoint {
				first = append(first, q("savepoint idem_work"))
			}
			if err := send(first...); err != nil {
				return err
			}
			if err := work(i); err != nil {
				return err
			}
			return send(q(complete, "", key, "completed", []byte(`{}`), nil), q("commit"))
		}
	}
	deferred := func(savepoint bool) func(int) error {
		return func(i int) error {
			seq++
			key := "component-" + strconv.Itoa(seq)
			first := [][]any{q(claimDeferred, "", key), q(assertDeferred, "", key, nil), q("begin")}
			if savepoint {
				first = append(first, q("savepoint idem_work"))
			}
			if err := send(first...); err != nil {
				return err
			}
			if err := work(i); err != nil {
				return err
			}
			return send(q(completeDeferred, "", key, reqHash, "completed", []byte(`{}`), nil, int64(86400e6)), q("commit"))
		}
	}
	pieces := []struct {
		name string
		op   func(int) error
	}{
		{"bare: BEGIN; work; COMMIT", func(i int) error {
			if err := send(q("begin")); err != nil {
				return err
			}
			if err := work(i); err != nil {
				return err
			}
			return send(q("commit"))
		}},
		{"deferred: claim_deferred, assert_deferred, BEGIN, SAVEPOINT; work; complete_deferred, COMMIT", deferred(true)},
		{"  without SAVEPOINT", deferred(false)},
		{"eager: claim, assert_claimed, BEGIN, SAVEPOINT; work; complete, COMMIT", protocol(true, true)},
		{"  without SAVEPOINT", protocol(false, true)},
		{"  without assert_claimed", protocol(true, false)},
		{"plain key row: INSERT, work, UPDATE", func(i int) error {
			seq++
			key := "component-" + strconv.Itoa(seq)
			if err := send(q(`INSERT INTO peer.plain_keys (scope, idempotency_key, request_hash, expires_at) VALUES ('', $1, $2, now() + interval '1 day')`, key, reqHash), q("begin")); err != nil {
				return err
			}
			if err := work(i); err != nil {
				return err
			}
			return send(q(`UPDATE peer.plain_keys SET status = 'completed', response = $2, completed_at = now() WHERE scope = '' AND idempotency_key = $1`, key, []byte(`{}`)), q("commit"))
		}},
		{"key row INSERTed once, with COMMIT", func(i int) error {
			seq++
			key := "component-" + strconv.Itoa(seq)
			if err := send(q("begin")); err != nil {
				return err
			}
			if err := work(i); err != nil {
				return err
			}
			return send(q(`INSERT INTO peer.plain_keys (scope, idempotency_key, request_hash, status, response, completed_at, expires_at) VALUES ('', $1, $2, 'completed', $3, now(), now() + interval '1 day')`, key, reqHash, []byte(`{}`)), q("commit"))
		}},
	}
	const ops, rounds = 1500, 5
	got := make([][]float64, len(pieces))
	for r := 0; r < rounds; r++ {
		for i, p := range pieces {
			for j := 0; j < 50; j++ { // prepares the statements
				if err := p.op(j); err != nil {
					return fmt.Errorf("%s: %w", p.name, err)
				}
			}
			t0 := backendCPU(backend)
			for j := 0; j < ops; j++ {
				if err := p.op(j); err != nil {
					return fmt.Errorf("%s: %w", p.name, err)
				}
			}
			got[i] = append(got[i], float64(backendCPU(backend)-t0)/float64(time.Microsecond)/ops)
		}
	}
	fmt.Fprintf(w, "Server CPU per operation by protocol piece (one connection, median of %d interleaved rounds of %d):\n", rounds, ops)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "statements\tµs/op\tvs bare\trange µs\t")
	base := median(got[0])
	for i, p := range pieces {
		fmt.Fprintf(tw, "%s\t%.0f\t%.2f\t%.0f–%.0f\t\n", p.name, median(got[i]), median(got[i])/base, slices.Min(got[i]), slices.Max(got[i]))
	}
	return tw.Flush()
}

// execAll reads n results and reports the first failure.
func execAll(br pgx.BatchResults, n int) error {
	var first error
	for i := 0; i < n; i++ {
		if _, err := br.Exec(); err != nil && first == nil {
			first = err
		}
	}
	if err := br.Close(); err != nil && first == nil {
		first = err
	}
	return first
}
