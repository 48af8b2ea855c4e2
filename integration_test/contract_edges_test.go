package integration_test

// Edges of the contract: result and request types that JSON does not carry
// exactly, transaction options, observers on panics, typed-nil databases
// and Lookup inside an outer transaction.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
)

// A result type stored with its own MarshalBinary (time.Time is one) is
// returned by the first call in its stored form, as every replay returns it:
// the monotonic reading and the named zone are not stored, and the first call
// does not keep them either.
func TestBinaryResultFirstCallEqualsReplay(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	zone, err := time.LoadLocation("America/New_York")
	if err != nil {
		zone = time.FixedZone("EST", -5*3600) // still a named zone
	}
	fn := func(pgx.Tx) (time.Time, error) { return time.Now().In(zone), nil }
	first, err := idem.Do(ctx, s.pool, "k", "h", fn)
	if err != nil {
		t.Fatal(err)
	}
	replay, err := idem.Do(ctx, s.pool, "k", "h", fn)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(first, replay) {
		t.Fatalf("first call and replay of a time.Time differ:\n first  %#v\n replay %#v", first, replay)
	}
}

// stampedEvent embeds time.Time, whose MarshalBinary (and MarshalJSON) are
// promoted to the struct: encoding it would store the time only and lose
// Note, so the type is refused before fn runs.
type stampedEvent struct {
	time.Time
	Note string
}

func TestEmbeddedMarshalerRefused(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	fn := func(pgx.Tx) (stampedEvent, error) { return stampedEvent{Time: at, Note: "refund 42"}, nil }
	first, err := idem.Do(ctx, s.pool, "k", "h", fn)
	if err != nil {
		// Refusing the type up front would be a correct answer too.
		if errors.Is(err, idem.ErrInvalidOption) {
			return
		}
		t.Fatal(err)
	}
	replay, err := idem.Do(ctx, s.pool, "k", "h", fn)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(first, replay) || replay.Note != "refund 42" {
		t.Fatalf("a struct embedding time.Time was accepted and does not replay exactly:\n first  Note %q\n replay Note %q", first.Note, replay.Note)
	}
}

// onlyMarshals has MarshalJSON but no UnmarshalJSON: encoding/json writes
// its own form and decodes by reflection into the exported fields, which do
// not match, so the type is refused.
type onlyMarshals struct {
	Cents int64
}

func (o onlyMarshals) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]string{"amount": fmt.Sprintf("%d.%02d", o.Cents/100, o.Cents%100)})
}

// shadowed has two fields that encoding/json leaves out without an error:
// Base.ID is shadowed by the outer ID, and A.Ref and B.Ref conflict at the
// same depth, so neither would be encoded; the type is refused.
type shadowBase struct{ ID int64 }
type shadowA struct{ Ref string }
type shadowB struct{ Ref string }
type shadowed struct {
	shadowBase
	shadowA
	shadowB
	ID int64
}

func TestLossyResultTypesRefused(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	v, err := idem.Do(ctx, s.pool, "k1", "h", func(pgx.Tx) (onlyMarshals, error) { return onlyMarshals{Cents: 1234}, nil })
	switch {
	case errors.Is(err, idem.ErrInvalidOption):
	case err != nil:
		t.Fatal(err)
	case v.Cents != 1234:
		t.Errorf("fn returned onlyMarshals{Cents: 1234}; Do returned %+v, without an error (a MarshalJSON without UnmarshalJSON is accepted)", v)
	}
	w, err := idem.Do(ctx, s.pool, "k2", "h", func(pgx.Tx) (shadowed, error) {
		return shadowed{shadowBase{7}, shadowA{"a"}, shadowB{"b"}, 9}, nil
	})
	switch {
	case errors.Is(err, idem.ErrInvalidOption):
	case err != nil:
		t.Fatal(err)
	case w.shadowBase.ID != 7 || w.shadowA.Ref != "a" || w.shadowB.Ref != "b":
		t.Errorf("fn returned shadowed{{7}, {a}, {b}, 9}; Do returned %+v, without an error (fields JSON drops are accepted)", w)
	}
}

// withBlank uses the blank-field idiom that forces keyed literals; a blank
// field holds nothing, and the type is accepted.
type withBlank struct {
	_      struct{}
	Amount int64
}

func TestBlankFieldAccepted(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	v, err := idem.Do(context.Background(), s.pool, "k", "h", func(pgx.Tx) (withBlank, error) { return withBlank{Amount: 5}, nil })
	if err != nil || v.Amount != 5 {
		t.Fatalf("a struct with a blank (_) field: %+v, %v; want it stored", v, err)
	}
}

// beginOnly is a Beginner that is neither a pool nor a connection and has no
// BeginTx: a tracing wrapper, say.
type beginOnly struct{ pool *pgxpool.Pool }

func (b beginOnly) Begin(ctx context.Context) (pgx.Tx, error) { return b.pool.Begin(ctx) }

// WithTxOptions sets the isolation level of the transaction Do begins, also
// on a Beginner without BeginTx (a tracing wrapper): the modes are then set
// with SET TRANSACTION before the claim.
func TestTxOptionsWithoutBeginTx(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	level, err := idem.Do(context.Background(), beginOnly{s.pool}, "k", "h", func(tx pgx.Tx) (string, error) {
		var level string
		err := tx.QueryRow(context.Background(), "SHOW transaction_isolation").Scan(&level)
		return level, err
	}, idem.WithTxOptions(pgx.TxOptions{IsoLevel: pgx.Serializable}))
	if err == nil && level != "serializable" {
		t.Fatalf("WithTxOptions(Serializable) on a Beginner without BeginTx: fn ran at %q, without an error", level)
	}
}

// countingObserver counts CallStart and CallEnd.
type countingObserver struct {
	mu           sync.Mutex
	starts, ends int
}

func (o *countingObserver) CallStart(ctx context.Context, _ idem.CallStart) context.Context {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.starts++
	return ctx
}

func (o *countingObserver) CallEnd(context.Context, idem.CallEnd) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ends++
}

// CallEnd runs once per CallStart, also when fn panics: a span begun in
// CallStart is ended and the failure counted, and the panic goes on.
func TestObserverEndsWhenFnPanics(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	obs := &countingObserver{}
	func() {
		defer func() { _ = recover() }()
		_, _, _ = idem.Run(context.Background(), s.pool, "k", "h", func(context.Context, pgx.Tx) (int, error) {
			panic("boom")
		}, idem.WithObserver(obs))
	}()
	if obs.starts != 1 || obs.ends != 1 {
		t.Fatalf("fn panicked: %d CallStart, %d CallEnd; want one of each", obs.starts, obs.ends)
	}
}

// Do without a function fails validation and reports it to the Observer as
// OutcomeInvalid, like every other validation failure.
func TestObserverSeesNilFn(t *testing.T) {
	t.Parallel()
	obs := &countingObserver{}
	_, err := idem.Do[int](context.Background(), nil, "k", "h", nil, idem.WithObserver(obs))
	if !errors.Is(err, idem.ErrInvalidOption) {
		t.Fatal(err)
	}
	if obs.starts != 1 || obs.ends != 1 {
		t.Fatalf("Do with a nil fn: %d CallStart, %d CallEnd; want one of each, as for any invalid call", obs.starts, obs.ends)
	}
}

// Wrap never panics: a nil *pgxpool.Pool (a package-level Wrap built
// before the pool is opened) or a nil *idem.Client makes every call fail
// with ErrInvalidOption, as Do and Run do.
func TestTypedNilDatabase(t *testing.T) {
	t.Parallel()
	method := func(context.Context, pgx.Tx, int) (int, error) { return 1, nil }
	for name, db := range map[string]idem.Beginner{
		"nil *pgxpool.Pool": (*pgxpool.Pool)(nil),
		"nil *idem.Client":  (*idem.Client)(nil),
	} {
		t.Run(name, func(t *testing.T) {
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("Wrap(%s) call panicked: %v", name, p)
					}
				}()
				_, _, err = idem.Wrap(db, "op", method)(context.Background(), "k", 1)
			}()
			if !errors.Is(err, idem.ErrInvalidOption) {
				t.Fatalf("Wrap(%s): %v, want ErrInvalidOption", name, err)
			}
		})
	}
}

// onlyUnmarshals has UnmarshalJSON but no MarshalJSON: encoding/json writes
// the fields by reflection and reads them with the method, which expects
// another form. The type is refused before fn runs, rather than failing
// every call after the work.
type onlyUnmarshals struct {
	Cents int64
}

func (o *onlyUnmarshals) UnmarshalJSON(b []byte) error {
	var v struct{ Amount string }
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	_, err := fmt.Sscanf(v.Amount, "%d", &o.Cents)
	return err
}

func TestOneWayJSONRefusedUpFront(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ran := false
	_, err := idem.Do(context.Background(), s.pool, "k", "h", func(pgx.Tx) (onlyUnmarshals, error) {
		ran = true
		return onlyUnmarshals{Cents: 5}, nil
	})
	if err != nil && ran && !errors.Is(err, idem.ErrInvalidOption) {
		t.Fatalf("a type with UnmarshalJSON but no MarshalJSON: fn ran, then the call failed: %v; want ErrInvalidOption before fn runs (or a working round trip)", err)
	}
}

// binaryByPointer has MarshalBinary/UnmarshalBinary with pointer receivers,
// the usual choice for a struct: it is stored with them, whatever fields it
// has.
type binaryByPointer struct {
	amount int64
}

func (b *binaryByPointer) MarshalBinary() ([]byte, error) {
	return []byte(fmt.Sprint(b.amount)), nil
}

func (b *binaryByPointer) UnmarshalBinary(p []byte) error {
	_, err := fmt.Sscan(string(p), &b.amount)
	return err
}

func TestPointerReceiverMarshalBinary(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	v, err := idem.Do(context.Background(), s.pool, "k", "h", func(pgx.Tx) (binaryByPointer, error) {
		return binaryByPointer{amount: 42}, nil
	})
	if err != nil || v.amount != 42 {
		t.Fatalf("a type with (*T).MarshalBinary and (*T).UnmarshalBinary: %+v, %v; want it stored with them", v, err)
	}
}

// money keeps its amount unexported (a common value-object style) and has no
// MarshalJSON: json.Marshal writes {} for every amount.
type money struct{ cents int64 }

type transferRequest struct {
	To     int64
	Amount money
}

// Wrap fingerprints req with HashJSON, which sees only what json.Marshal
// writes. A request type with parts JSON leaves out (unexported fields,
// json:"-", a value object like money) would hash equal for different
// requests and replay instead of answering ErrMismatch, so it is refused.
func TestWrapRefusesUnfingerprintableRequests(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	transfer := idem.Wrap(s.pool, "transfers.create", func(ctx context.Context, tx pgx.Tx, req transferRequest) (int64, error) {
		return req.Amount.cents, nil
	})
	ctx := context.Background()
	if _, _, err := transfer(ctx, "k", transferRequest{To: 2, Amount: money{500}}); err != nil {
		if errors.Is(err, idem.ErrInvalidOption) {
			return // refusing the request type is a fix
		}
		t.Fatal(err)
	}
	moved, outcome, err := transfer(ctx, "k", transferRequest{To: 2, Amount: money{500_000}})
	if !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("the same key with another amount: %d, %v, %v; want ErrMismatch (or the request type refused)", moved, outcome, err)
	}
}

// ownCodecEvent embeds time.Time but declares its own MarshalJSON and
// UnmarshalJSON, which encode every field: it is stored with them.
type ownCodecEvent struct {
	time.Time
	Note string
}

func (e ownCodecEvent) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		At   time.Time `json:"at"`
		Note string    `json:"note"`
	}{e.Time, e.Note})
}

func (e *ownCodecEvent) UnmarshalJSON(b []byte) error {
	var v struct {
		At   time.Time `json:"at"`
		Note string    `json:"note"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	e.Time, e.Note = v.At, v.Note
	return nil
}

func TestEmbeddedMarshalerWithOwnCodec(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	fn := func(pgx.Tx) (ownCodecEvent, error) { return ownCodecEvent{Time: at, Note: "refund 42"}, nil }
	first, err := idem.Do(ctx, s.pool, "k", "h", fn)
	if err != nil {
		t.Fatalf("a type with its own codec beside an embedded time.Time: %v", err)
	}
	replay, err := idem.Do(ctx, s.pool, "k", "h", fn)
	if err != nil || !reflect.DeepEqual(first, replay) || replay.Note != "refund 42" || !replay.Equal(at) {
		t.Fatalf("replay %+v (%v), first %+v", replay, err, first)
	}
}
