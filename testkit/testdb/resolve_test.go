package testdb

import (
	"context"
	"strings"
	"testing"
	"time"
)

// With no URL in the environment, no local server and no Docker engine, the
// harness runs the container fallback, which fails, and says how to provide
// a server, with the fallback's own reason; it neither hangs nor reports
// success. On a machine with a Docker engine the container would start, so
// the test is skipped there.
func TestResolveWithoutServerOrDocker(t *testing.T) {
	if testing.Short() {
		t.Skip("builds tools/pgcontainer")
	}
	t.Setenv("IDEM_TEST_DATABASE_URL", "")
	t.Setenv("DATABASE_URL", "")
	ctx, cancel := context.WithTimeout(t.Context(), containerWait+time.Minute)
	defer cancel()
	u, err := resolveServer(ctx, "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2")
	if err == nil {
		stopContainer()
		t.Skipf("a Docker engine answered and the container fallback started %s", u)
	}
	msg := err.Error()
	t.Log(msg)
	for _, want := range []string{"IDEM_TEST_DATABASE_URL", "make test", "Docker engine", "pgcontainer"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
	if container != nil {
		t.Errorf("a failed fallback left tools/pgcontainer running")
	}
}
