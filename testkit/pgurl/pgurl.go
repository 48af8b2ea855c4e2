// Package pgurl edits PostgreSQL connection strings for the programs that
// create databases of their own: the test harness, the load test and the
// demo.
package pgurl

import (
	"net/url"
	"os"
	"regexp"
	"strings"
)

// WithDatabase returns the connection string u pointed at database db. u may
// be a URL (postgres:// or postgresql://) or a keyword/value string.
func WithDatabase(u, db string) string {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "postgres" && p.Scheme != "postgresql") {
		return u + " dbname=" + db
	}
	p.Path = "/" + db
	return p.String()
}

// Redact returns the host and database of u, without user or password, for
// messages and logs.
func Redact(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.Host == "" {
		return "a connection string"
	}
	return p.Host + p.Path
}

// kvPassword matches the password of a keyword/value connection string, its
// value plain or single-quoted.
var kvPassword = regexp.MustCompile(`\s*\bpassword\s*=\s*(?:'(?:\\.|[^'\\])*'|\S*)`)

// WithoutPassword returns u, a URL or a keyword/value string, with its
// password removed: a connection string that is safe to log and still works
// with psql, which then takes the password from PGPASSWORD or ~/.pgpass, or
// asks for it.
func WithoutPassword(u string) string {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "postgres" && p.Scheme != "postgresql") {
		return strings.TrimSpace(kvPassword.ReplaceAllString(u, ""))
	}
	if p.User != nil {
		p.User = url.User(p.User.Username())
	}
	if q := p.Query(); q.Has("password") {
		q.Del("password")
		p.RawQuery = q.Encode()
	}
	return p.String()
}

// Local is the server on the machine itself, as these machines run it:
// 127.0.0.1:5432, trust authentication, user postgres.
const Local = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Server returns the server a benchmark or tool should use: the first of
// IDEM_TEST_DATABASE_URL and DATABASE_URL that is set, else Local.
func Server() string {
	for _, env := range []string{"IDEM_TEST_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(env); u != "" {
			return u
		}
	}
	return Local
}
