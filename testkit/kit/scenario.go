package kit

import (
	"context"
	"testing"
)

// A Scenario is one check of a kit's battery, run as a subtest.
type Scenario struct {
	Name string
	Run  func(t testing.TB)
}

// A Result is what one scenario reported when it ran on a recorder.
type Result struct {
	Scenario string
	Failures []string
	Skipped  bool
}

// subtester is *testing.T: a TB that runs subtests. *testing.B and
// *testing.F have Run methods of other types, so they are not subtesters.
type subtester interface {
	Run(name string, f func(t *testing.T)) bool
}

// Run runs each scenario in t: as a subtest when t is a *testing.T, and
// otherwise (a *testing.B, or any other testing.TB) each on a recorder of
// its own, whose failures are then reported on t prefixed with the
// scenario's name. Either way a FailNow in one scenario ends only that one.
func Run(t testing.TB, scenarios []Scenario) {
	t.Helper()
	if st, ok := t.(subtester); ok {
		for _, s := range scenarios {
			st.Run(s.Name, func(t *testing.T) { s.Run(t) })
		}
		return
	}
	for _, r := range Results(t.Context(), t.Name(), scenarios) {
		for _, f := range r.Failures {
			t.Errorf("%s: %s", r.Scenario, f)
		}
		if r.Skipped && len(r.Failures) == 0 {
			t.Logf("%s: skipped", r.Scenario)
		}
	}
}

// Results runs each scenario, in order, on a recorder of its own and returns
// what each reported.
func Results(ctx context.Context, parent string, scenarios []Scenario) []Result {
	results := make([]Result, 0, len(scenarios))
	for _, s := range scenarios {
		r := NewRecorder(ctx, parent+"/"+s.Name)
		r.Go(s.Run)
		results = append(results, Result{Scenario: s.Name, Failures: r.Failures(), Skipped: r.Skipped()})
	}
	return results
}
