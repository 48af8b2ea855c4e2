package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/idemhq/idem/testkit/pgurl"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// localURL is the server tried when no URL is set in the environment; the
// tests resolve their server the same way.
const localURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// serverURL returns IDEM_TEST_DATABASE_URL, else DATABASE_URL, else
// localURL.
func serverURL() string {
	for _, env := range []string{"IDEM_TEST_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(env); u != "" {
			return u
		}
	}
	return localURL
}

// freshDatabase creates an empty database for this run on the server at
// server and returns a pool on it (its URL: pool.Config().ConnString()),
// and a function that closes the pool and drops the database.
func freshDatabase(ctx context.Context, server string) (*pgxpool.Pool, func(), error) {
	name := fmt.Sprintf("idem_demo_%d", os.Getpid())
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to PostgreSQL (set DATABASE_URL, or run `make postgres`): %w", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if _, err := admin.Exec(ctx, "drop database if exists "+name+" with (force)"); err != nil {
		return nil, nil, err
	}
	if _, err := admin.Exec(ctx, "create database "+name); err != nil {
		return nil, nil, err
	}
	drop := func() {
		// Runs after an interrupt too: a cancelled ctx must not keep the
		// database from being dropped.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, server)
		if err != nil {
			fmt.Fprintf(os.Stderr, "demo: drop database %s: %v\n", name, err)
			return
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "drop database if exists "+name+" with (force)"); err != nil {
			fmt.Fprintf(os.Stderr, "demo: drop database %s: %v\n", name, err)
		}
	}
	pool, err := pgxpool.New(ctx, pgurl.WithDatabase(server, name))
	if err != nil {
		drop()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); drop() }, nil
}
