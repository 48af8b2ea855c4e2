package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
)

// crashFigures is what a crash run did and what the database says about it.
type crashFigures struct {
	ops      map[string]int // operations by class
	answered int
	attempts int
	sum      opResult // the failure counts, summed
	replayed int      // answers served from a stored result
	// Operations with an attempt whose answer was lost (no answer, or 503
	// outcome-unknown) before the answer: replayedAfterLoss found the work
	// committed by the lost attempt, executedAfterLoss found it rolled back.
	replayedAfterLoss, executedAfterLoss int
	maxAttempts                          int

	keys         int // distinct keys sent
	ledgerRows   int
	keysByStatus map[string]int
	accounts     int
	faults       []faultSummary
	elapsed      time.Duration

	// The service's own figures, printed after the common ones, and what
	// the run proved when it has no violation.
	rows []figure
	ok   string

	violations []string
}

// figure is one labelled figure of a run.
type figure struct {
	label string
	value any
}

// keyRows is the key table's rows by status, in_progress always included.
func (f *crashFigures) keyRows() []figure {
	statuses := make([]string, 0, len(f.keysByStatus))
	for s := range f.keysByStatus {
		statuses = append(statuses, s)
	}
	if _, ok := f.keysByStatus["in_progress"]; !ok {
		statuses = append(statuses, "in_progress")
	}
	slices.Sort(statuses)
	out := make([]figure, 0, len(statuses))
	for _, s := range statuses {
		out = append(out, figure{"key rows " + s, f.keysByStatus[s]})
	}
	return out
}

// faultSummary is one fault and how the clients came through it.
type faultSummary struct {
	faultRecord
	inFlight int           // operations sent before the crash and answered after it
	settled  time.Duration // from the crash until the last of them was answered
	first    time.Duration // from the crash until the first answer to an attempt sent after it
}

func (f *crashFigures) violate(format string, args ...any) {
	if len(f.violations) < 20 {
		f.violations = append(f.violations, fmt.Sprintf(format, args...))
	} else if len(f.violations) == 20 {
		f.violations = append(f.violations, "... (further violations not listed)")
	}
}

// tally counts what the clients went through and checks what needs no
// database: every operation answered; every retry of a key already
// answered replayed; every planned fault injected, without error, with
// operations in flight.
func tally(results [][]opResult, records []faultRecord, planned int) *crashFigures {
	fig := &crashFigures{ops: map[string]int{}, keysByStatus: map[string]int{}}
	var all []*opResult
	for _, rs := range results {
		for i := range rs {
			r := &rs[i]
			all = append(all, r)
			fig.ops[r.class]++
			fig.attempts += r.attempts
			fig.maxAttempts = max(fig.maxAttempts, r.attempts)
			fig.sum.refused += r.refused
			fig.sum.noAnswer += r.noAnswer
			fig.sum.inProgress += r.inProgress
			fig.sum.outcomeUnknown += r.outcomeUnknown
			fig.sum.unavailable += r.unavailable
			fig.sum.failed += r.failed
			if r.err != "" {
				fig.violate("%s: never answered: %s", r.opKey, r.err)
				continue
			}
			fig.answered++
			if r.replayed {
				fig.replayed++
			}
			if r.lostBefore() {
				if r.replayed {
					fig.replayedAfterLoss++
				} else {
					fig.executedAfterLoss++
				}
			}
			if r.class == classRetry && !r.replayed {
				fig.violate("%s: a retry of a key already answered ran the operation again", r.opKey)
			}
		}
	}
	for _, f := range records {
		s := summarize(f, all)
		fig.faults = append(fig.faults, s)
		if f.err != nil {
			fig.violate("fault %v: %v", f.fault, f.err)
		}
		if s.inFlight == 0 {
			fig.violate("fault %v: no operation was in flight when it hit; it tested nothing", f.fault)
		}
	}
	if len(records) < planned {
		fig.violate("%d of %d faults injected: the run ended first", len(records), planned)
	}
	return fig
}

// reconcileCrash checks the built-in application's answers (tallied in
// fig) against the database: one ledger row per key, equal to every
// answer given for it, with the key's amount; the key row completed; no
// key in progress; every balance the sum of the operations on it.
func reconcileCrash(ctx context.Context, dbURL string, results [][]opResult, fig *crashFigures) error {
	answers := map[string][]entry{}
	for _, rs := range results {
		for i := range rs {
			r := &rs[i]
			if _, ok := answers[r.key]; !ok {
				answers[r.key] = nil
			}
			if r.err != "" {
				continue
			}
			answers[r.key] = append(answers[r.key], r.entry)
			if r.entry.Amount != amountOf(r.key) {
				fig.violate("key %s: answer amount %d, want %d", r.key, r.entry.Amount, amountOf(r.key))
			}
		}
	}
	fig.keys = len(answers)

	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)

	type row struct {
		entry
		account int
	}
	ledger := map[string][]row{}
	rows, _ := conn.Query(ctx, "SELECT idem_key, id, account, amount FROM ledger")
	var (
		key string
		r   row
	)
	if _, err := pgx.ForEachRow(rows, []any{&key, &r.ID, &r.account, &r.Amount}, func() error {
		ledger[key] = append(ledger[key], r)
		fig.ledgerRows++
		return nil
	}); err != nil {
		return err
	}
	stored := map[string]string{}
	var status string
	rows, _ = conn.Query(ctx, "SELECT idempotency_key, status FROM idempotency_keys")
	if _, err := pgx.ForEachRow(rows, []any{&key, &status}, func() error {
		stored[key] = status
		fig.keysByStatus[status]++
		return nil
	}); err != nil {
		return err
	}
	balances := map[int]int64{}
	var (
		account int
		balance int64
	)
	rows, _ = conn.Query(ctx, "SELECT id, balance FROM accounts")
	if _, err := pgx.ForEachRow(rows, []any{&account, &balance}, func() error {
		balances[account] = balance
		return nil
	}); err != nil {
		return err
	}
	fig.accounts = len(balances)

	want := map[int]int64{} // the balance of each account from the answered keys
	for key, got := range answers {
		lrows := ledger[key]
		switch {
		case len(lrows) > 1:
			fig.violate("key %s committed %d times", key, len(lrows))
		case len(lrows) == 0 && len(got) > 0:
			fig.violate("key %s: answered %d times, no ledger row", key, len(got))
		}
		if len(lrows) == 0 {
			if _, ok := stored[key]; ok {
				fig.violate("key %s: key row %q without a ledger row", key, stored[key])
			}
			continue
		}
		l := lrows[0]
		for _, e := range got {
			if e != l.entry {
				fig.violate("key %s: answered %+v, ledger holds %+v", key, e, l.entry)
			}
		}
		if stored[key] != "completed" {
			fig.violate("key %s: committed, but its key row is %q", key, stored[key])
		}
		if l.account != accountOf(key) || l.Amount != amountOf(key) {
			fig.violate("key %s: ledger row on account %d for %d, want %d for %d", key, l.account, l.Amount, accountOf(key), amountOf(key))
		}
		want[accountOf(key)] += amountOf(key)
	}
	for key := range ledger {
		if _, ok := answers[key]; !ok {
			fig.violate("ledger row for key %s that no client sent", key)
		}
	}
	for account, b := range balances {
		if b != want[account] {
			fig.violate("account %d: balance %d, the answered operations sum to %d", account, b, want[account])
		}
	}
	if n := fig.keysByStatus["in_progress"]; n > 0 {
		fig.violate("%d keys left in_progress", n)
	}
	if len(stored) != len(ledger) {
		fig.violate("%d key rows, %d keys in the ledger", len(stored), len(ledger))
	}
	fig.rows = append(fig.rows,
		figure{"distinct keys", fig.keys},
		figure{"ledger rows", fig.ledgerRows})
	fig.rows = append(fig.rows, fig.keyRows()...)
	fig.rows = append(fig.rows, figure{"accounts checked", fig.accounts})
	fig.ok = "every operation answered, each key committed exactly once with the answer every client got, balances exact, no key in progress"
	return nil
}

// summarize measures how the clients came through fault f.
func summarize(f faultRecord, all []*opResult) faultSummary {
	s := faultSummary{faultRecord: f, first: -1}
	for _, r := range all {
		if r.err != "" {
			continue
		}
		if r.start.Before(f.dead) && r.end.After(f.dead) {
			s.inFlight++
			s.settled = max(s.settled, r.end.Sub(f.dead))
		}
		if !r.lastStart.Before(f.dead) {
			if d := r.end.Sub(f.dead); s.first < 0 || d < s.first {
				s.first = d
			}
		}
	}
	return s
}

func (f *crashFigures) print(w io.Writer, began time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(label string, v any) { fmt.Fprintf(tw, "%s\t%v\t\n", label, v) }
	row("operations", f.ops[classFresh]+f.ops[classRetry])
	row("  fresh key", f.ops[classFresh])
	row("  retry of an answered key", f.ops[classRetry])
	row("operations answered", f.answered)
	row("attempts (HTTP requests)", f.attempts)
	row("retries (attempts after the first)", f.attempts-f.answered)
	row("  no application listening", f.sum.refused)
	row("  connection lost after sending (outcome unknown to the client)", f.sum.noAnswer)
	row("  503 outcome-unknown (connection lost during COMMIT)", f.sum.outcomeUnknown)
	row("  503 unavailable (database unreachable, nothing done)", f.sum.unavailable)
	row("  503 from the operation (database error mid-way, nothing stored)", f.sum.failed)
	row("  409 in progress", f.sum.inProgress)
	row("most attempts for one operation", f.maxAttempts)
	row("answers replayed from the stored result", f.replayed)
	row("answers after a lost one: replayed (the lost attempt had committed)", f.replayedAfterLoss)
	row("answers after a lost one: executed (the lost attempt had rolled back)", f.executedAfterLoss)
	for _, r := range f.rows {
		row(r.label, r.value)
	}
	row("violations", len(f.violations))
	row("wall time", f.elapsed.Round(100*time.Millisecond))
	tw.Flush()
	fmt.Fprintln(w, "faults: at (since the start); crash (until certainly down: killed and reaped, or the stop command returned);")
	fmt.Fprintln(w, "  restart (from the crash until the restart command returned); in flight (operations sent before the crash and answered")
	fmt.Fprintln(w, "  after it); all answered (from the crash until the last of them was); first answer (from the crash, to an attempt sent after it)")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  fault\tat\tcrash\trestart\tin flight\tall answered\tfirst answer\t")
	for _, s := range f.faults {
		first := "-"
		if s.first >= 0 {
			first = s.first.Round(10 * time.Millisecond).String()
		}
		fmt.Fprintf(tw, "  %v\t%v\t%v\t%v\t%d\t%v\t%s\t\n", s.fault, s.at.Sub(began).Round(100*time.Millisecond),
			s.dead.Sub(s.at).Round(10*time.Millisecond), s.up.Sub(s.dead).Round(10*time.Millisecond),
			s.inFlight, s.settled.Round(10*time.Millisecond), first)
	}
	tw.Flush()
	for _, v := range f.violations {
		fmt.Fprintln(w, "VIOLATION:", v)
	}
	if len(f.violations) == 0 {
		fmt.Fprintln(w, "idem-load -crash: OK:", f.ok)
	} else {
		fmt.Fprintln(w, "idem-load -crash: FAILED")
	}
}
