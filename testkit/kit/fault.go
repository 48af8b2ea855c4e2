package kit

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

var (
	//go:embed sql/fault_install.sql
	faultInstallSQL string
	//go:embed sql/fault_remove.sql
	faultRemoveSQL string
	//go:embed sql/fault_arm.sql
	faultArmSQL string
	//go:embed sql/fault_disarm.sql
	faultDisarmSQL string
)

// A Fault makes the transaction of an armed key fail after its work ran: a
// trigger on the key table raises an error when the key's row is completed,
// just before COMMIT, so the work, the key and the answer all roll back.
// It works whatever runs the work (idem.Do, idem.Wrap, idemhttp, in this
// process or another one on the same database) and needs nothing installed
// in the code under test, only the right to create a trigger on the key
// table.
type Fault struct {
	db                      *DB
	armTable, function, trg string // the fault's own objects
	arm, disarm, removeSQL  string

	removeOnce sync.Once
	removeErr  error
}

// InstallFault creates the fault's table, function and trigger, with names
// of its own (idemtest_fault_<random>) in the key table's schema. Remove
// drops them.
func (d *DB) InstallFault(ctx context.Context) (*Fault, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "idemtest_fault_" + hex.EncodeToString(b[:])
	table := pgx.Identifier(strings.Split(d.table, ".")).Sanitize()
	f := &Fault{db: d, armTable: d.schema + "." + name, function: d.schema + "." + name, trg: name}
	r := strings.NewReplacer("{{table}}", table, "{{arm}}", f.armTable, "{{function}}", f.function, "{{trigger}}", f.trg)
	f.arm, f.disarm, f.removeSQL = r.Replace(faultArmSQL), r.Replace(faultDisarmSQL), r.Replace(faultRemoveSQL)
	err := pgx.BeginFunc(ctx, d.db, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, r.Replace(faultInstallSQL))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cannot inject a failure: creating a trigger on the key table %s failed (the kit needs the right to create tables, functions and triggers there): %w", d.table, err)
	}
	return f, nil
}

// Arm makes the next completion of key fail until Disarm.
func (f *Fault) Arm(ctx context.Context, key string) error {
	return pgx.BeginFunc(ctx, f.db.db, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, f.arm, key)
		return err
	})
}

// Disarm lets key complete again.
func (f *Fault) Disarm(ctx context.Context, key string) error {
	return pgx.BeginFunc(ctx, f.db.db, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, f.disarm, key)
		return err
	})
}

// Remove drops the trigger, its function and its table. Only the first call
// does anything.
func (f *Fault) Remove(ctx context.Context) error {
	f.removeOnce.Do(func() {
		f.removeErr = pgx.BeginFunc(ctx, f.db.db, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, f.removeSQL)
			return err
		})
	})
	return f.removeErr
}
