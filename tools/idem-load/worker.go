package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
)

// The classes of call a worker records.
const (
	classFresh    = "fresh"     // a new key
	classRetry    = "retry"     // a key this client used before
	classRace     = "race"      // a new key sent by every racer at once
	classRaceWait = "race-wait" // a race loser asking again, willing to wait
)

// entry is the result of one logical operation: the ledger row it wrote.
type entry struct {
	ID     int64 `json:"id"`
	Amount int64 `json:"amount"`
}

// answer is what one call returned.
type answer struct {
	class    string
	key      string
	outcome  string // "ok", "in_progress" or "error"
	replayed bool
	entry    entry
	detail   string
}

func (a answer) line() string {
	detail := strings.NewReplacer("\t", " ", "\n", " ").Replace(a.detail)
	return fmt.Sprintf("%s\t%s\t%s\t%t\t%d\t%d\t%s\n", a.class, a.key, a.outcome, a.replayed, a.entry.ID, a.entry.Amount, detail)
}

func parseAnswer(line string) (answer, error) {
	f := strings.SplitN(line, "\t", 7)
	if len(f) != 7 {
		return answer{}, fmt.Errorf("malformed answer %q", line)
	}
	a := answer{class: f[0], key: f[1], outcome: f[2], replayed: f[3] == "true", detail: f[6]}
	var err1, err2 error
	a.entry.ID, err1 = strconv.ParseInt(f[4], 10, 64)
	a.entry.Amount, err2 = strconv.ParseInt(f[5], 10, 64)
	return a, errors.Join(err1, err2)
}

// runWorker is one worker process: its clients and racers run the plan's
// share of calls through one pool, and the answers go to out.
func runWorker(p plan, w int, dbURL, out string) error {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(p.clients + p.raceWidth)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	answers := make([][]answer, p.clients+p.raceWidth)
	var wg sync.WaitGroup
	for c := range p.clients {
		wg.Go(func() { answers[c] = runClient(ctx, pool, p, w, c) })
	}
	var barrierErr error
	if p.races() > 0 {
		ready := make(chan struct{})
		start := make([]chan struct{}, p.raceWidth)
		for i := range start {
			start[i] = make(chan struct{})
		}
		for i := range p.raceWidth {
			wg.Go(func() { answers[p.clients+i] = runRacer(ctx, pool, p, ready, start[i]) })
		}
		wg.Go(func() {
			if barrierErr = barrier(ctx, p, ready, start); barrierErr != nil {
				cancel()
			}
		})
	}
	wg.Wait()

	f, err := os.Create(out)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	for _, as := range answers {
		for _, a := range as {
			// A failed write sticks: Flush reports it.
			_, _ = bw.WriteString(a.line())
		}
	}
	if err := errors.Join(bw.Flush(), f.Close()); err != nil {
		return err
	}
	if barrierErr != nil {
		return fmt.Errorf("race barrier: %w", barrierErr)
	}
	return ctx.Err()
}

// barrier holds this worker's racers until the racers of every worker are
// ready: it tells the parent on stdout, and the parent answers on stdin once
// all workers have.
func barrier(ctx context.Context, p plan, ready <-chan struct{}, start []chan struct{}) error {
	in := bufio.NewScanner(os.Stdin)
	for r := range p.races() {
		for range p.raceWidth {
			select {
			case <-ready:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		fmt.Fprintf(os.Stdout, "ready %d\n", r)
		if !in.Scan() {
			err := in.Err()
			if err == nil {
				err = io.EOF
			}
			return fmt.Errorf("the parent went away at race %d: %w", r, err)
		}
		if got, want := in.Text(), fmt.Sprintf("go %d", r); got != want {
			return fmt.Errorf("the parent said %q, want %q", got, want)
		}
		for _, s := range start {
			s <- struct{}{}
		}
	}
	return nil
}

// runClient makes client c's calls: fresh keys, and retries of keys it used
// before (a retry expects the first answer back).
func runClient(ctx context.Context, pool *pgxpool.Pool, p plan, w, c int) []answer {
	rng := p.clientRand(w, c)
	n := p.clientCalls(w, c)
	out := make([]answer, 0, n)
	var used []string
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		class, key := classFresh, p.freshKey(w, c, i)
		if len(used) > 0 && rng.Float64() < p.retryProb() {
			class, key = classRetry, used[rng.IntN(len(used))]
		} else {
			used = append(used, key)
		}
		out = append(out, call(ctx, pool, class, key))
	}
	return out
}

// runRacer takes part in every race: it waits at the barrier, sends the
// race key at once, and if another racer held the key, asks again willing
// to wait, expecting the winner's answer.
func runRacer(ctx context.Context, pool *pgxpool.Pool, p plan, ready chan<- struct{}, start <-chan struct{}) []answer {
	var out []answer
	for r := range p.races() {
		select {
		case ready <- struct{}{}:
		case <-ctx.Done():
			return out
		}
		select {
		case <-start:
		case <-ctx.Done():
			return out
		}
		key := p.raceKey(r)
		a := call(ctx, pool, classRace, key)
		out = append(out, a)
		if a.outcome == "in_progress" {
			out = append(out, call(ctx, pool, classRaceWait, key, idem.WithWait(30*time.Second)))
		}
	}
	return out
}

// call is one logical operation: idem.Do inserting the key's ledger row.
func call(ctx context.Context, pool *pgxpool.Pool, class, key string, opts ...idem.Option) answer {
	amount := amountOf(key)
	a := answer{class: class, key: key}
	hash, err := idem.HashJSON(struct {
		Key    string `json:"key"`
		Amount int64  `json:"amount"`
	}{key, amount})
	if err != nil {
		a.outcome, a.detail = "error", err.Error()
		return a
	}
	var outcome idem.Outcome
	a.entry, outcome, err = idem.Run(ctx, pool, key, hash, func(ctx context.Context, tx pgx.Tx) (entry, error) {
		e := entry{Amount: amount}
		err := tx.QueryRow(ctx, "INSERT INTO ledger (idem_key, amount) VALUES ($1, $2) RETURNING id", key, amount).Scan(&e.ID)
		return e, err
	}, opts...)
	a.replayed = outcome == idem.OutcomeReplayed
	switch {
	case err == nil:
		a.outcome = "ok"
	case errors.Is(err, idem.ErrInProgress):
		a.outcome = "in_progress"
	default:
		a.outcome, a.detail = "error", err.Error()
	}
	return a
}
