package integration_test

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
)

// linFaults is what the fault injector did.
type linFaults struct {
	attempts int            // rounds of terminations tried
	byApp    map[string]int // backends pg_terminate_backend ended, by application_name
	err      error          // why it stopped early, if it did
}

// terminateBackends ends one random backend under test of each of apps
// (application_name, in this database only) every 20 to 150 ms on conn,
// until stop is closed: one victim per application, so that the clients of
// one are hit as often whether or not the others run beside them. The
// backend may be anywhere in a call: claiming, in fn, in a step, renewing
// a lease, or between COMMIT and its reply.
func terminateBackends(conn *pgx.Conn, seed uint64, apps []string, stop <-chan struct{}) linFaults {
	rng := rand.New(rand.NewPCG(seed, 1<<32))
	f := linFaults{byApp: map[string]int{}}
	for {
		pause := time.NewTimer(time.Duration(20+rng.IntN(131)) * time.Millisecond)
		select {
		case <-stop:
			pause.Stop()
			return f
		case <-pause.C:
		}
		rows, err := conn.Query(context.Background(), `
			SELECT application_name, pg_terminate_backend(pid)
			FROM (SELECT DISTINCT ON (application_name) application_name, pid
			      FROM pg_stat_activity
			      WHERE datname = current_database() AND pid <> pg_backend_pid()
			        AND application_name = ANY($1)
			      ORDER BY application_name, random()) AS victim`, apps)
		var (
			app   string
			ended bool
		)
		if err == nil {
			_, err = pgx.ForEachRow(rows, []any{&app, &ended}, func() error {
				if ended {
					f.byApp[app]++
				}
				return nil
			})
		}
		if err != nil {
			f.err = err
			return f
		}
		f.attempts++
	}
}
