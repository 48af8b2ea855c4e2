package idemhttptest_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemhq/idem/idemhttptest"
)

var scenarios = []string{"Retries", "LostAnswer", "Concurrent", "ChangedRequest", "FailureNotStored", "WritesInTransaction"}

// A correct service passes every scenario, as subtests of t, and the kit
// leaves nothing behind.
func TestCorrectServicePasses(t *testing.T) {
	t.Parallel()
	s := newService(t, correct)
	checked := map[string]idemhttptest.Scenario{}
	suite := s.suite()
	suite.Check = func(t testing.TB, sc idemhttptest.Scenario) {
		checked[sc.Name] = sc
		var charges int
		if err := s.pool.QueryRow(t.Context(), "select count(*) from charges").Scan(&charges); err != nil {
			t.Fatal(err)
		}
		if charges != sc.TotalExecutions {
			t.Errorf("after %s: %d charges, want TotalExecutions %d", sc.Name, charges, sc.TotalExecutions)
		}
	}
	t.Run("kit", func(t *testing.T) { suite.Run(t) })
	for _, name := range scenarios {
		if _, ok := checked[name]; !ok {
			t.Errorf("Check did not run after %s", name)
		}
	}
	if sc := checked["WritesInTransaction"]; sc.Executions != 0 || len(sc.Keys) != 1 {
		t.Errorf("WritesInTransaction: Scenario %+v, want 0 executions and 1 key", sc)
	}
	if objects, keys := kitObjects(t, s.pool); objects != 0 || keys != 0 {
		t.Errorf("after a passing run: %d kit objects and %d keys left, want none", objects, keys)
	}
}

// Without Faults, the kit makes attempts fail in the database, with a
// trigger it drops afterwards.
func TestCorrectServicePassesWithDatabaseFault(t *testing.T) {
	t.Parallel()
	s := newService(t, correct)
	suite := s.suite()
	suite.Faults = nil
	t.Run("kit", func(t *testing.T) { suite.Run(t) })
	if objects, keys := kitObjects(t, s.pool); objects != 0 || keys != 0 {
		t.Errorf("after a passing run: %d kit objects and %d keys left, want none", objects, keys)
	}
}

// A running service is tested by URL, with the fault in the database.
func TestCorrectServicePassesByURL(t *testing.T) {
	t.Parallel()
	s := newService(t, correct)
	srv := httptest.NewServer(s.handler)
	t.Cleanup(srv.Close)
	suite := s.suite()
	suite.Handler, suite.Faults, suite.URL = nil, nil, srv.URL
	suite.Concurrency = 8
	t.Run("kit", func(t *testing.T) { suite.Run(t) })
}

// Each defect fails the scenario that names it, with a message that says
// what is wrong.
func TestDefectsFailTheKit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		defect   defect
		scenario string
		want     string
		passes   []string // scenarios the defect does not affect
	}{
		{
			name: "writes through the pool", defect: poolWrites,
			scenario: "WritesInTransaction",
			want:     "the handler writes outside the request's transaction",
			passes:   []string{"Retries", "LostAnswer", "Concurrent", "ChangedRequest", "FailureNotStored"},
		},
		{
			name: "route outside the middleware", defect: noMiddleware,
			scenario: "Retries",
			want:     "without Idempotent-Replayed: true: the handler ran again",
		},
		{
			name: "5xx stored", defect: stores5xx,
			scenario: "FailureNotStored",
			want:     "was stored under the key: a 5xx must leave the key free",
			passes:   []string{"Retries", "LostAnswer", "Concurrent", "ChangedRequest", "WritesInTransaction"},
		},
		{
			name: "fingerprint ignores the body", defect: fingerprintNothing,
			scenario: "ChangedRequest",
			want:     "was answered as a replay of the first answer",
			passes:   []string{"Retries", "LostAnswer", "Concurrent", "FailureNotStored", "WritesInTransaction"},
		},
		{
			name: "responses stamped outside idemhttp", defect: envelope,
			scenario: "Retries",
			want:     "a replay must repeat the first answer exactly",
		},
		{
			name: "racy dedupe of its own", defect: racyDedupe,
			scenario: "Concurrent",
			want:     "want exactly 1 executed",
			passes:   []string{"Retries", "LostAnswer"},
		},
		{
			name: "Faults installed outside idemhttp", defect: faultsOutside,
			scenario: "FailureNotStored",
			want:     "install Faults.Middleware inside idemhttp's middleware",
			passes:   []string{"Retries", "LostAnswer", "Concurrent", "ChangedRequest"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newService(t, tc.defect)
			failures := results(t, s.suite())
			if !contains(failures[tc.scenario], tc.want) {
				t.Errorf("%s: failures %q, want one containing %q", tc.scenario, failures[tc.scenario], tc.want)
			}
			for _, name := range tc.passes {
				if len(failures[name]) > 0 {
					t.Errorf("%s failed, want it to pass with this defect: %q", name, failures[name])
				}
			}
		})
	}
}

func contains(msgs []string, want string) bool {
	for _, m := range msgs {
		if strings.Contains(m, want) {
			return true
		}
	}
	return false
}
