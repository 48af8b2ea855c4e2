package idem

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// unclaimed answers a call that did not claim its key: a replay, a
// mismatch, or a key in progress.
func unclaimed[T any](ctx context.Context, q querier, c *call, cl claim) (T, Outcome, error) {
	var zero T
	if cl.rec == nil && cl.locked != nil && *cl.locked {
		// We held the lock yet could not claim: the row committed after our
		// snapshot was taken. A new statement sees it.
		rec, err := lookup(ctx, q, c)
		if err != nil {
			return zero, OutcomeFailed, err
		}
		cl.rec = rec
	}
	if cl.rec == nil {
		return zero, OutcomeInProgress, ErrInProgress
	}
	return replay[T](ctx, c, cl.rec)
}

func lookup(ctx context.Context, q querier, c *call) (*storedRow, error) {
	var rec storedRow
	err := q.QueryRow(ctx, c.stmts.lookup, c.scope, c.key).
		Scan(&rec.requestHash, &rec.status, &rec.response, &rec.refusal)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("idem: look up key: %w", err)
	}
	return &rec, nil
}

// replay returns what rec stores, if it was stored for this request.
func replay[T any](ctx context.Context, c *call, rec *storedRow) (T, Outcome, error) {
	var zero T
	if rec.status == statusUnfinished {
		// An operation made of steps holds the key until its last step.
		return zero, OutcomeInProgress, ErrInProgress
	}
	if rec.requestHash != c.reqHash {
		return zero, OutcomeMismatch, ErrMismatch
	}
	data, refusal, err := open(ctx, c.s, c.scope, c.key, rec)
	if err != nil {
		return zero, OutcomeFailed, err
	}
	v, err := decode[T](data)
	if err != nil {
		return zero, OutcomeFailed, fmt.Errorf("%w: %w", ErrCorruptRecord, err)
	}
	if refusal != nil {
		return v, OutcomeReplayed, refusal
	}
	return v, OutcomeReplayed, nil
}

// open returns the encoded result and the refusal a row stores, checking a
// sealed row's envelope against its columns.
func open(ctx context.Context, s *settings, scope, key string, rec *storedRow) ([]byte, *Refusal, error) {
	data, refusalJSON := rec.response, rec.refusal
	if s.sealer != nil {
		plain, err := s.sealer.Open(ctx, scope, key, rec.response)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: open: %w", ErrCorruptRecord, err)
		}
		env, err := unmarshalEnvelope(plain, scope, key)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %w", ErrCorruptRecord, err)
		}
		if env.status != rec.status || env.requestHash != rec.requestHash {
			return nil, nil, fmt.Errorf("%w: the row's status or request hash differs from what was sealed", ErrCorruptRecord)
		}
		data, refusalJSON = env.value, env.refusal
	} else if isSealed(rec.refusal) {
		return nil, nil, fmt.Errorf("%w: the row is sealed and the Client has no Sealer (Config.Sealer)", ErrCorruptRecord)
	}
	switch rec.status {
	case statusCompleted:
		return data, nil, nil
	case statusRefused:
		refusal, err := unmarshalRefusal(refusalJSON)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: refusal %q: %w", ErrCorruptRecord, refusalJSON, err)
		}
		return data, refusal, nil
	}
	return nil, nil, fmt.Errorf("%w: status %q", ErrCorruptRecord, rec.status)
}
