package integration_test

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
)

// linFaults is what the fault injector did.
type linFaults struct {
	attempts   int   // terminations tried
	terminated int   // backends pg_terminate_backend ended
	err        error // why it stopped early, if it did
}

// terminateBackends ends one random backend under test (application_name
// linClientApp, in this database only) every 20 to 150 ms on conn, until
// stop is closed. The backend may be anywhere in a call: claiming, in fn,
// or between COMMIT and its reply.
func terminateBackends(conn *pgx.Conn, seed uint64, stop <-chan struct{}) linFaults {
	rng := rand.New(rand.NewPCG(seed, 1<<32))
	var f linFaults
	for {
		pause := time.NewTimer(time.Duration(20+rng.IntN(131)) * time.Millisecond)
		select {
		case <-stop:
			pause.Stop()
			return f
		case <-pause.C:
		}
		var n int
		err := conn.QueryRow(context.Background(), `
			SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
			FROM (SELECT pid FROM pg_stat_activity
			      WHERE datname = current_database() AND pid <> pg_backend_pid()
			        AND application_name = $1
			      ORDER BY random() LIMIT 1) AS victim`, linClientApp).Scan(&n)
		if err != nil {
			f.err = err
			return f
		}
		f.attempts++
		f.terminated += n
	}
}
