package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
)

// The charge of the -operations mode, done three ways: reserve (a database
// write), charge (a call to the fake processor), receipt (a database
// write). Do holds one transaction across all three; an idem.Operation and
// a DBOS workflow make each database write a step of its own and call the
// processor with no transaction open. Each way has its own tables.
const (
	opTablesSQL = `
CREATE SCHEMA held;
CREATE TABLE held.reservations (key text NOT NULL, amount bigint NOT NULL);
CREATE TABLE held.receipts (key text NOT NULL, charge_id text NOT NULL);
CREATE SCHEMA steps;
CREATE TABLE steps.reservations (key text NOT NULL, amount bigint NOT NULL);
CREATE TABLE steps.receipts (key text NOT NULL, charge_id text NOT NULL);
ALTER TABLE idempotency_keys RESET (autovacuum_enabled);
`
	// dbosTablesSQL runs in DBOS's own database: its transactions commit
	// their writes with DBOS's step records only there.
	dbosTablesSQL = `
CREATE TABLE reservations (key text NOT NULL, amount bigint NOT NULL);
CREATE TABLE receipts (key text NOT NULL, charge_id text NOT NULL);
`
)

type chargeSQL struct{ reserve, receipt string }

func chargeIn(schema string) chargeSQL {
	return chargeSQL{
		reserve: "INSERT INTO " + schema + "reservations (key, amount) VALUES ($1, $2)",
		receipt: "INSERT INTO " + schema + "receipts (key, charge_id) VALUES ($1, $2)",
	}
}

var (
	heldSQL  = chargeIn("held.")
	stepsSQL = chargeIn("steps.")
	dbosSQL  = chargeIn("")
)

const chargeAmount = 100

type chargeReq struct {
	Amount int64 `json:"amount"`
}

type chargeResp struct {
	ChargeID string `json:"charge_id"`
	Amount   int64  `json:"amount"`
}

// heldCharge is the charge in one idem.Do transaction: the processor call
// runs inside fn, holding the transaction, its connection and the key.
func heldCharge(ctx context.Context, db idem.Beginner, proc *processor, key string) (chargeResp, error) {
	return idem.Do(ctx, db, key, reqHash, func(tx pgx.Tx) (chargeResp, error) {
		if _, err := tx.Exec(ctx, heldSQL.reserve, key, chargeAmount); err != nil {
			return chargeResp{}, err
		}
		id, err := proc.Charge(ctx, idem.CallKey{Key: key}.Derive("charge"), chargeAmount)
		if err != nil {
			return chargeResp{}, err
		}
		if _, err := tx.Exec(ctx, heldSQL.receipt, key, id); err != nil {
			return chargeResp{}, err
		}
		return chargeResp{ChargeID: id, Amount: chargeAmount}, nil
	})
}

// heldReserve is one Do with one write: what a database step is compared
// with.
func heldReserve(ctx context.Context, db idem.Beginner, key string) (int64, error) {
	return idem.Do(ctx, db, key, reqHash, func(tx pgx.Tx) (int64, error) {
		_, err := tx.Exec(ctx, heldSQL.reserve, key, chargeAmount)
		return chargeAmount, err
	})
}

// newChargeOp is the charge as an idem.Operation.
func newChargeOp(c *idem.Client, proc *processor) (*idem.Operation[chargeReq, chargeResp], error) {
	return idem.NewOperation(c, "charge", func(s *idem.Steps, req chargeReq) (chargeResp, error) {
		key := s.Key().Key
		if _, err := idem.Step(s, "reserve", func(ctx context.Context, tx pgx.Tx) (int64, error) {
			_, err := tx.Exec(ctx, stepsSQL.reserve, key, req.Amount)
			return req.Amount, err
		}); err != nil {
			return chargeResp{}, err
		}
		id, err := idem.External(s, "charge", func(ctx context.Context, pkey string) (string, error) {
			return proc.Charge(ctx, pkey, req.Amount)
		})
		if err != nil {
			return chargeResp{}, err
		}
		return idem.Step(s, "receipt", func(ctx context.Context, tx pgx.Tx) (chargeResp, error) {
			_, err := tx.Exec(ctx, stepsSQL.receipt, key, id)
			return chargeResp{ChargeID: id, Amount: req.Amount}, err
		})
	}, nil)
}

// newReserveOp is an operation of one database step: the write heldReserve
// makes.
func newReserveOp(c *idem.Client) (*idem.Operation[chargeReq, int64], error) {
	return idem.NewOperation(c, "reserve", func(s *idem.Steps, req chargeReq) (int64, error) {
		key := s.Key().Key
		return idem.Step(s, "reserve", func(ctx context.Context, tx pgx.Tx) (int64, error) {
			_, err := tx.Exec(ctx, stepsSQL.reserve, key, req.Amount)
			return req.Amount, err
		})
	}, nil)
}

// runOp runs op and fails unless it executed (or, with replay, replayed).
func runOp[Resp any](ctx context.Context, op *idem.Operation[chargeReq, Resp], key string, replay bool) error {
	_, outcome, err := op.Run(ctx, key, chargeReq{Amount: chargeAmount})
	if err != nil {
		return err
	}
	want := idem.OutcomeExecuted
	if replay {
		want = idem.OutcomeReplayed
	}
	if outcome != want {
		return fmt.Errorf("operation %s: %v, want %v", key, outcome, want)
	}
	return nil
}

// dbosBench is DBOS Transact on a pool of its own in its own database: the
// system database, where its step records are kept, holds the charge's
// tables too, so that each database step is one transaction (a DataSource
// on the system database's pool), as each of an idem.Operation's is.
type dbosBench struct {
	ctx  dbos.Context
	pool *pgxpool.Pool
	ds   *dbos.DataSource
	proc *processor
}

// startDBOS launches DBOS on pool as executor (each DBOS context of a run
// has its own, so that none recovers another's workflows).
func startDBOS(ctx context.Context, pool *pgxpool.Pool, proc *processor, executor string) (*dbosBench, error) {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dctx, err := dbos.NewContext(ctx, dbos.Config{
		AppName:      "idem-bench",
		SystemDBPool: pool,
		Logger:       log,
		ExecutorID:   executor,
	})
	if err != nil {
		return nil, fmt.Errorf("DBOS: %w", err)
	}
	d := &dbosBench{ctx: dctx, pool: pool, proc: proc}
	if d.ds, err = dbos.NewDataSource(dctx, pool, dbos.WithDataSourceName("charges")); err != nil {
		_ = dbos.Shutdown(dctx, 10*time.Second)
		return nil, fmt.Errorf("DBOS data source: %w", err)
	}
	dbos.RegisterWorkflow(dctx, d.charge, dbos.WithWorkflowName("charge"))
	dbos.RegisterWorkflow(dctx, d.reserve, dbos.WithWorkflowName("reserve"))
	if err := dbos.Launch(dctx); err != nil {
		return nil, fmt.Errorf("DBOS launch: %w", err)
	}
	return d, nil
}

func (d *dbosBench) shutdown() {
	if err := dbos.Shutdown(d.ctx, 10*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "idem-bench: DBOS shutdown:", err)
	}
	d.pool.Close()
}

// charge is the charge as a DBOS workflow: RunAsTransaction for each
// database step, RunAsStep for the processor call, the workflow id as the
// idempotency key's root, as DBOS's documentation advises.
func (d *dbosBench) charge(ctx dbos.Context, req chargeReq) (chargeResp, error) {
	id, err := dbos.GetWorkflowID(ctx)
	if err != nil {
		return chargeResp{}, err
	}
	if _, err := dbos.RunAsTransaction(ctx, d.ds, func(ctx context.Context, tx dbos.Tx) (int64, error) {
		_, err := tx.Exec(ctx, dbosSQL.reserve, id, req.Amount)
		return req.Amount, err
	}, dbos.WithStepName("reserve")); err != nil {
		return chargeResp{}, err
	}
	chargeID, err := dbos.RunAsStep(ctx, func(ctx context.Context) (string, error) {
		return d.proc.Charge(ctx, id+"/charge", req.Amount)
	}, dbos.WithStepName("charge"))
	if err != nil {
		return chargeResp{}, err
	}
	return dbos.RunAsTransaction(ctx, d.ds, func(ctx context.Context, tx dbos.Tx) (chargeResp, error) {
		_, err := tx.Exec(ctx, dbosSQL.receipt, id, chargeID)
		return chargeResp{ChargeID: chargeID, Amount: req.Amount}, err
	}, dbos.WithStepName("receipt"))
}

// reserve is a workflow of one database step, as newReserveOp's.
func (d *dbosBench) reserve(ctx dbos.Context, req chargeReq) (int64, error) {
	id, err := dbos.GetWorkflowID(ctx)
	if err != nil {
		return 0, err
	}
	return dbos.RunAsTransaction(ctx, d.ds, func(ctx context.Context, tx dbos.Tx) (int64, error) {
		_, err := tx.Exec(ctx, dbosSQL.reserve, id, req.Amount)
		return req.Amount, err
	}, dbos.WithStepName("reserve"))
}

// runCharge starts the charge workflow under id and waits for its result,
// on ctx (which, when it ends, cancels the workflow, as DBOS documents).
func (d *dbosBench) runCharge(ctx context.Context, id string, req chargeReq, opts ...dbos.WorkflowOption) (chargeResp, error) {
	h, err := dbos.RunWorkflow(dbos.From(d.ctx, ctx), d.charge, req, append(opts, dbos.WithWorkflowID(id))...)
	if err != nil {
		return chargeResp{}, err
	}
	return h.GetResult()
}

func (d *dbosBench) runReserve(ctx context.Context, id string) error {
	h, err := dbos.RunWorkflow(dbos.From(d.ctx, ctx), d.reserve, chargeReq{Amount: chargeAmount}, dbos.WithWorkflowID(id))
	if err != nil {
		return err
	}
	_, err = h.GetResult()
	return err
}

// dbosRejectExisting is DBOS's option to refuse a workflow id that exists.
func dbosRejectExisting() dbos.WorkflowOption {
	return dbos.WithWorkflowIDReusePolicy(dbos.WorkflowIDReusePolicyReject)
}

// dbosVersion is the version of DBOS Transact built in.
func dbosVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == "github.com/dbos-inc/dbos-transact-golang" {
				return m.Version
			}
		}
	}
	return "(version unknown)"
}

// errNoCharge is a charge that returned no charge id.
var errNoCharge = errors.New("the charge returned no charge id")

func checkCharge(r chargeResp, err error) error {
	if err == nil && r.ChargeID == "" {
		return errNoCharge
	}
	return err
}
