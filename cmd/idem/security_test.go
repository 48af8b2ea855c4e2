package main

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/testdb"
)

// hostile is what an attacker stores, or a hostile server says: clear the
// screen, set the window title, and print a reassuring line.
const hostile = "\x1b[2J\x1b[H\x1b]0;owned\x07all keys verified OK\r\n\u202e"

func wantEscaped(t *testing.T, what, out string) {
	t.Helper()
	for _, raw := range []string{"\x1b", "\x07", "\r", "\u202e"} {
		if strings.Contains(out, raw) {
			t.Fatalf("%s prints %q raw:\n%q", what, raw, out)
		}
	}
	if !strings.Contains(out, `\x1b[2J`) {
		t.Fatalf("%s does not show the escapes, escaped:\n%q", what, out)
	}
}

func TestInspectEscapesWhatItPrints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, keys, "refused", "h", func(pgx.Tx) (string, error) {
		return "", idem.Refuse("declined"+hostile, hostile).WithStatus(402)
	}); err == nil {
		t.Fatal("want the refusal")
	}
	if _, err := idem.Do(ctx, keys, "paid", "h", func(pgx.Tx) (string, error) { return hostile, nil }); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := idemCmd(ctx, url, "inspect", "refused")
	if code != exitOK {
		t.Fatalf("inspect: exit %d\n%s%s", code, out, errOut)
	}
	wantEscaped(t, "inspect of a refusal", out)
	if !strings.Contains(out, `all keys verified OK\r\n\u202e (status 402)`) {
		t.Fatalf("inspect does not show the refusal, escaped:\n%s", out)
	}
	// A JSON body escapes control characters itself; what JSON leaves raw
	// (U+202E) is escaped for the terminal.
	code, out, _ = idemCmd(ctx, url, "inspect", "paid")
	if code != exitOK || strings.Contains(out, "\u202e") || !strings.Contains(out, `body:         "\u001b[2J`) {
		t.Fatalf("inspect of a result: exit %d\n%q", code, out)
	}
}

// fakeServer accepts connections and answers each startup with msg, as a
// hostile or impersonated server would, or, with msg empty, says nothing.
func fakeServer(t *testing.T, msg string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { close(done); ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				if msg == "" {
					<-done
					return
				}
				be := pgproto3.NewBackend(conn, conn)
				for {
					m, err := be.ReceiveStartupMessage()
					if err != nil {
						return
					}
					if _, ok := m.(*pgproto3.SSLRequest); ok {
						if _, err := conn.Write([]byte("N")); err != nil {
							return
						}
						continue
					}
					break
				}
				be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "28000", Message: msg})
				be.Flush()
			}()
		}
	}()
	return "postgres://idem@" + ln.Addr().String() + "/x?sslmode=disable"
}

func TestServerErrorsAreEscaped(t *testing.T) {
	t.Parallel()
	url := fakeServer(t, hostile)
	for _, cmd := range []string{"stats", "count", "inspect", "check", "sweep"} {
		args := []string{cmd}
		if cmd == "inspect" {
			args = append(args, "k")
		}
		code, out, errOut := idemCmd(context.Background(), url, args...)
		if code != exitFailure {
			t.Fatalf("idem %s against a hostile server: exit %d\n%s%s", cmd, code, out, errOut)
		}
		wantEscaped(t, "idem "+cmd+"'s error", out+errOut)
	}
}

func TestConnectTimeout(t *testing.T) {
	t.Parallel()
	url := fakeServer(t, "")
	for _, c := range []struct {
		name string
		url  string
		args []string
	}{
		{"flag", url, []string{"stats", "-connect-timeout", "200ms"}},
		{"the URL's connect_timeout", url + "&connect_timeout=1", []string{"stats"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// Without a bound the command would wait for the silent
			// server until ctx ends.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			code, out, errOut := idemCmd(ctx, c.url, c.args...)
			if code != exitFailure || ctx.Err() != nil || !strings.Contains(errOut, "timeout") {
				t.Fatalf("exit %d, ctx %v\n%s%s", code, ctx.Err(), out, errOut)
			}
		})
	}
}

func TestPasswordWithoutTLSWarns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t) // trust authentication: the password is not checked
	withPassword := strings.Replace(url, "postgres@", "postgres:s3cret@", 1)
	noSSLMode := strings.Replace(withPassword, "sslmode=disable", "", 1)
	if noSSLMode == withPassword {
		t.Fatalf("the test URL %s has no sslmode=disable to remove", url)
	}
	cases := []struct {
		url  string
		warn bool
	}{
		{noSSLMode, true},
		{strings.Replace(withPassword, "sslmode=disable", "sslmode=prefer", 1), true},
		{strings.Replace(withPassword, "sslmode=disable", "sslmode=allow", 1), true},
		{withPassword, false}, // sslmode=disable: stated
		{strings.Replace(url, "sslmode=disable", "", 1), false}, // no password
	}
	for _, c := range cases {
		code, out, errOut := idemCmd(ctx, c.url, "stats")
		if code != exitOK {
			t.Fatalf("stats %s: exit %d\n%s%s", c.url, code, out, errOut)
		}
		if warned := strings.Contains(errOut, "sslmode=verify-full"); warned != c.warn {
			t.Errorf("%s: warned %v, want %v: %q", c.url, warned, c.warn, errOut)
		}
		if strings.Contains(errOut, "s3cret") {
			t.Errorf("the warning shows the password: %q", errOut)
		}
	}
}

func TestCheckCommand(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	code, out, errOut := idemCmd(context.Background(), url, "check", "-table", "nowhere")
	if code != exitFailure || !strings.Contains(errOut, "nowhere does not exist") || !strings.Contains(errOut, "idem migrate") {
		t.Fatalf("check of a missing table: exit %d\n%s%s", code, out, errOut)
	}
	// Each problem on a line of its own.
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), "CREATE TABLE bad (scope text, idempotency_key text)"); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = idemCmd(context.Background(), url, "check", "-table", "bad")
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if code != exitFailure || len(lines) != 2 || !strings.Contains(lines[0], "lacks columns") || !strings.Contains(lines[1], "no unique index") || !strings.HasPrefix(lines[1], "idem check: ") {
		t.Fatalf("check of a table that is not idem's: exit %d\n%s", code, errOut)
	}
	for _, cmd := range []string{"sweep", "stats", "count"} {
		code, out, errOut := idemCmd(context.Background(), url, cmd, "-table", "nowhere")
		if code != exitFailure || !strings.Contains(errOut, "does not exist") || !strings.Contains(errOut, "idem migrate") {
			t.Errorf("%s of a missing table: exit %d\n%s%s", cmd, code, out, errOut)
		}
	}
}

func TestInspectSealedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	key := []byte("\xff\x00 raw AES-256 key of 32 bytes.\n")
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := idem.NewClient(pool, &idem.Config{Sealer: idem.NewAEADSealer(gcm)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, keys, "paid", "h1", func(pgx.Tx) (map[string]string, error) { return map[string]string{"charge": "ch_1"}, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, keys, "declined", "h2", func(pgx.Tx) (int, error) {
		return 0, idem.Refuse("card_declined", "insufficient funds").WithStatus(402)
	}); err == nil {
		t.Fatal("want the refusal")
	}
	dir := t.TempDir()
	files := map[string][]byte{
		"raw": key,
		"hex": []byte(hex.EncodeToString(key) + "\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	wrong := filepath.Join(dir, "wrong")
	if err := os.WriteFile(wrong, []byte(strings.Repeat("ab", 32)), 0o600); err != nil {
		t.Fatal(err)
	}

	// Without the key: the refusal is sealed, not corrupt.
	code, out, errOut := idemCmd(ctx, url, "inspect", "declined")
	if code != exitOK || !strings.Contains(out, "result:       sealed (pass -key-file") || strings.Contains(out+errOut, "cannot be read back") {
		t.Fatalf("inspect of a sealed refusal without the key: exit %d\n%s%s", code, out, errOut)
	}
	for name := range files {
		keyFile := filepath.Join(dir, name)
		code, out, errOut = idemCmd(ctx, url, "inspect", "-key-file", keyFile, "paid")
		if code != exitOK || !strings.Contains(out, `body:         {"charge":"ch_1"}`) {
			t.Fatalf("inspect -key-file (%s) of a sealed result: exit %d\n%s%s", name, code, out, errOut)
		}
		code, out, errOut = idemCmd(ctx, url, "inspect", "-key-file", keyFile, "declined")
		if code != exitOK || !strings.Contains(out, "card_declined: insufficient funds (status 402)") {
			t.Fatalf("inspect -key-file (%s) of a sealed refusal: exit %d\n%s%s", name, code, out, errOut)
		}
	}
	if code, out, errOut := idemCmd(ctx, url, "inspect", "-key-file", wrong, "paid"); code != exitFailure || !strings.Contains(errOut, "cannot be read back") {
		t.Fatalf("inspect with the wrong key: exit %d\n%s%s", code, out, errOut)
	}
}

func TestParseKey(t *testing.T) {
	t.Parallel()
	k := []byte("0123456789abcdef")
	for _, in := range []string{"30313233343536373839616263646566", " MDEyMzQ1Njc4OWFiY2RlZg==\n", "MDEyMzQ1Njc4OWFiY2RlZg", "0123456789abcdef"} {
		got, err := parseKey([]byte(in))
		if err != nil || string(got) != string(k) {
			t.Errorf("parseKey(%q) = %q, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "short", strings.Repeat("x", 33)} {
		if _, err := parseKey([]byte(in)); err == nil {
			t.Errorf("parseKey(%q) accepted", in)
		}
	}
}

type wallet struct{}

func (wallet) Withdraw(_ context.Context, _ pgx.Tx, amount int) (int, error) {
	return 100 - amount, nil
}

func TestInspectWrapKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	withdraw := idem.Wrap(pool, "wallet.withdraw", wallet{}.Withdraw)
	if _, _, err := withdraw(idem.ContextWithScope(ctx, "user:alice"), "w-1", 30); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := idemCmd(ctx, url, "inspect", "-operation", "wallet.withdraw", "-scope", "user:alice", "w-1")
	if code != exitOK || !strings.Contains(out, "body:         70") || !strings.Contains(out, "completed") {
		t.Fatalf("inspect -operation: exit %d\n%s%s", code, out, errOut)
	}
	code, _, errOut = idemCmd(ctx, url, "inspect", "-scope", "user:alice", "w-1")
	if code != exitNotFound || !strings.Contains(errOut, "-operation") {
		t.Fatalf("inspect without -operation: exit %d\n%s", code, errOut)
	}
	if code, _, errOut := idemCmd(ctx, url, "inspect", "-operation", "wallet.deposit", "-scope", "user:alice", "w-1"); code != exitNotFound {
		t.Fatalf("inspect under another operation: exit %d\n%s", code, errOut)
	}
}
