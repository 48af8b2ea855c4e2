package main

import (
	"context"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultConnectTimeout bounds each connection attempt when neither
// DATABASE_URL (connect_timeout) nor PGCONNECT_TIMEOUT sets a bound and
// -connect-timeout is not given: without one, a server that accepts the
// TCP connection and then says nothing holds the command forever.
const DefaultConnectTimeout = 10 * time.Second

// connect returns a pool on url. timeout bounds each connection attempt if
// set (explicit), or if url sets no bound of its own. It warns on stderr
// when url carries a password that may be sent without TLS.
func connect(ctx context.Context, url string, timeout time.Duration, explicit bool, stderr io.Writer) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cc := cfg.ConnConfig
	if explicit || cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = timeout
	}
	if cc.Password != "" && mayConnectInClear(cfg) {
		say(stderr, "idem: warning: DATABASE_URL has a password and lets the connection fall back to no TLS (sslmode prefer, pgx's default when none is given, or allow): a server, or anyone in the path, that declines TLS can ask for the password in clear. Add sslmode=verify-full (with sslrootcert), or at least sslmode=require.")
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// mayConnectInClear reports whether pgx would try TLS and fall back to a
// connection without it (sslmode prefer or allow: some attempts with TLS,
// some without). sslmode=disable, where no attempt uses TLS, is a choice
// the URL states, and is not warned about; nor is a Unix socket.
func mayConnectInClear(cfg *pgxpool.Config) bool {
	cc := cfg.ConnConfig
	withTLS, without := cc.TLSConfig != nil, cc.TLSConfig == nil
	for _, fb := range cc.Fallbacks {
		if fb.TLSConfig != nil {
			withTLS = true
		} else {
			without = true
		}
	}
	return withTLS && without
}
