// Package pgurl edits PostgreSQL connection strings for the programs that
// create databases of their own: the test harness, the load test and the
// demo.
package pgurl

import "net/url"

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
