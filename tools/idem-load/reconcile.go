package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
)

// figures is what the run did and what the database says about it.
type figures struct {
	calls      map[string]int // answered calls by class
	executed   int            // calls that ran fn and committed
	replayed   int            // calls answered from a stored result
	inProgress int            // calls answered ErrInProgress
	errors     int            // calls answered any other error
	firstError string

	keys           int // logical operations: distinct keys sent
	ledgerRows     int
	keysByStatus   map[string]int
	racesOneWinner int // races in which exactly one contender ran fn
	racesContended int // races in which a contender saw ErrInProgress
	elapsed        time.Duration

	violations []string
}

// keyState gathers every answer for one key.
type keyState struct {
	executed int
	oks      []entry
	errors   int
	race     bool
	sawBusy  bool
}

func (f *figures) violate(format string, args ...any) {
	if len(f.violations) < 20 {
		f.violations = append(f.violations, fmt.Sprintf(format, args...))
	} else if len(f.violations) == 20 {
		f.violations = append(f.violations, "... (further violations not listed)")
	}
}

// reconcile checks the answers against the database: every key committed
// at most once and exactly once if any call succeeded, every answer equal to
// the ledger row, no key left in progress, no call missing.
func reconcile(ctx context.Context, p plan, dbURL string, files []string) (*figures, error) {
	fig := &figures{calls: map[string]int{}, keysByStatus: map[string]int{}}
	keys := map[string]*keyState{}
	for _, file := range files {
		if err := readAnswers(file, func(a answer) {
			fig.calls[a.class]++
			k := keys[a.key]
			if k == nil {
				k = &keyState{}
				keys[a.key] = k
			}
			k.race = k.race || a.class == classRace
			switch a.outcome {
			case "ok":
				k.oks = append(k.oks, a.entry)
				if a.replayed {
					fig.replayed++
				} else {
					k.executed++
					fig.executed++
				}
				if a.entry.Amount != amountOf(a.key) {
					fig.violate("key %s: answer amount %d, want %d", a.key, a.entry.Amount, amountOf(a.key))
				}
			case "in_progress":
				fig.inProgress++
				k.sawBusy = k.sawBusy || a.class == classRace
			default:
				k.errors++
				fig.errors++
				if fig.firstError == "" {
					fig.firstError = a.key + ": " + a.detail
				}
			}
		}); err != nil {
			return nil, err
		}
	}
	fig.keys = len(keys)
	scheduled := p.regularCalls() + p.races()*p.contenders()
	if answered := fig.calls[classFresh] + fig.calls[classRetry] + fig.calls[classRace]; answered != scheduled {
		fig.violate("%d calls answered, %d scheduled", answered, scheduled)
	}

	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)

	// The ledger: one row per committed operation.
	ledger := map[string][]entry{}
	rows, _ := conn.Query(ctx, "SELECT idem_key, id, amount FROM ledger")
	var (
		key string
		e   entry
	)
	if _, err := pgx.ForEachRow(rows, []any{&key, &e.ID, &e.Amount}, func() error {
		ledger[key] = append(ledger[key], e)
		fig.ledgerRows++
		return nil
	}); err != nil {
		return nil, err
	}
	// The key table: one completed row per committed operation.
	stored := map[string]string{}
	var status string
	rows, _ = conn.Query(ctx, "SELECT idempotency_key, status FROM idempotency_keys")
	if _, err := pgx.ForEachRow(rows, []any{&key, &status}, func() error {
		stored[key] = status
		fig.keysByStatus[status]++
		return nil
	}); err != nil {
		return nil, err
	}

	for key, rows := range ledger {
		if len(rows) > 1 {
			fig.violate("key %s committed %d times", key, len(rows))
		}
		if keys[key] == nil {
			fig.violate("ledger row for key %s that no call sent", key)
		}
		if rows[0].Amount != amountOf(key) {
			fig.violate("key %s: ledger amount %d, want %d", key, rows[0].Amount, amountOf(key))
		}
	}
	for key, k := range keys {
		committed := len(ledger[key])
		switch {
		case k.executed > committed:
			fig.violate("key %s: %d calls ran fn and reported success, %d ledger rows", key, k.executed, committed)
		case k.executed < committed && k.errors == 0:
			fig.violate("key %s: %d ledger rows, but no call reported running fn", key, committed)
		}
		if committed == 1 {
			for _, got := range k.oks {
				if got != ledger[key][0] {
					fig.violate("key %s: answered %+v, ledger holds %+v", key, got, ledger[key][0])
				}
			}
			if stored[key] != "completed" {
				fig.violate("key %s: committed, but its key row is %q", key, stored[key])
			}
		} else if _, ok := stored[key]; ok && committed == 0 {
			fig.violate("key %s: key row %q without a ledger row", key, stored[key])
		}
		if committed == 0 && len(k.oks) > 0 {
			fig.violate("key %s: %d successful answers, no ledger row", key, len(k.oks))
		}
		if k.race {
			if k.executed == 1 {
				fig.racesOneWinner++
			}
			if k.sawBusy {
				fig.racesContended++
			}
		}
	}
	if n := fig.keysByStatus["in_progress"]; n > 0 {
		fig.violate("%d keys left in_progress", n)
	}
	if len(stored) != len(ledger) {
		fig.violate("%d key rows, %d committed operations", len(stored), len(ledger))
	}
	return fig, nil
}

func readAnswers(file string, each func(answer)) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for s.Scan() {
		a, err := parseAnswer(s.Text())
		if err != nil {
			return err
		}
		each(a)
	}
	return s.Err()
}

func (f *figures) print(w io.Writer, p plan) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(label string, v any) { fmt.Fprintf(tw, "%s\t%v\t\n", label, v) }
	total := f.calls[classFresh] + f.calls[classRetry] + f.calls[classRace]
	row("calls (scheduled)", total)
	row("  fresh key", f.calls[classFresh])
	row("  retry of a used key", f.calls[classRetry])
	row("  race on a new key", f.calls[classRace])
	row("follow-up calls by race losers (WithWait)", f.calls[classRaceWait])
	row("answers: ran fn and committed", f.executed)
	row("answers: replayed", f.replayed)
	row("answers: ErrInProgress", f.inProgress)
	row("answers: other errors", f.errors)
	row("logical operations (distinct keys)", f.keys)
	row("ledger rows", f.ledgerRows)
	statuses := make([]string, 0, len(f.keysByStatus))
	for s := range f.keysByStatus {
		statuses = append(statuses, s)
	}
	slices.Sort(statuses)
	for _, s := range statuses {
		row("key rows "+s, f.keysByStatus[s])
	}
	if f.keysByStatus["in_progress"] == 0 {
		row("key rows in_progress", 0)
	}
	row(fmt.Sprintf("races (%d contenders each)", p.contenders()), p.races())
	row("  won by exactly one contender", f.racesOneWinner)
	row("  with a contender answered ErrInProgress", f.racesContended)
	row("violations", len(f.violations))
	row("wall time (workers)", f.elapsed.Round(100*time.Millisecond))
	row("calls per second", fmt.Sprintf("%.0f", float64(total+f.calls[classRaceWait])/f.elapsed.Seconds()))
	tw.Flush()
	if f.firstError != "" {
		fmt.Fprintf(w, "first error: %s\n", f.firstError)
	}
	for _, v := range f.violations {
		fmt.Fprintln(w, "VIOLATION:", v)
	}
	if len(f.violations) == 0 && f.errors == 0 {
		fmt.Fprintln(w, "idem-load: OK: every logical operation committed exactly once and every answer matches the ledger")
	} else {
		fmt.Fprintln(w, "idem-load: FAILED")
	}
}
