package kit

import (
	"strings"
	"sync"
	"testing"
)

// fakeTB is a testing.TB without subtests: kit.Run reports each scenario's
// failures on it, prefixed with the scenario's name.
type fakeTB struct {
	*Recorder
}

func TestRunWithoutSubtests(t *testing.T) {
	var order []string
	scenarios := []Scenario{
		{Name: "First", Run: func(t testing.TB) {
			order = append(order, "first")
			t.Errorf("one %d", 1)
			t.Error("two")
		}},
		{Name: "Fatal", Run: func(t testing.TB) {
			t.Cleanup(func() { order = append(order, "cleanup") })
			t.Fatalf("stop")
			order = append(order, "after Fatalf") // never runs
		}},
		{Name: "Skip", Run: func(t testing.TB) { t.Skip("not here") }},
		{Name: "Pass", Run: func(t testing.TB) { order = append(order, "pass") }},
	}
	tb := fakeTB{NewRecorder(t.Context(), "outer")}
	tb.Go(func(t testing.TB) { Run(t, scenarios) })
	want := []string{"First: one 1", "First: two", "Fatal: stop"}
	if got := tb.Failures(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("failures %q, want %q", got, want)
	}
	if got := strings.Join(order, " "); got != "first cleanup pass" {
		t.Errorf("ran %q, want %q", got, "first cleanup pass")
	}
	if logs := tb.Logs(); len(logs) != 1 || logs[0] != "Skip: skipped" {
		t.Errorf("logs %q, want the skip", logs)
	}
}

func TestRunAsSubtests(t *testing.T) {
	var names []string
	var mu sync.Mutex
	Run(t, []Scenario{
		{Name: "A", Run: func(t testing.TB) { mu.Lock(); names = append(names, t.Name()); mu.Unlock() }},
		{Name: "B", Run: func(t testing.TB) { mu.Lock(); names = append(names, t.Name()); mu.Unlock() }},
	})
	if want := t.Name() + "/A " + t.Name() + "/B"; strings.Join(names, " ") != want {
		t.Errorf("subtests %q, want %q", names, want)
	}
}

func TestRecorder(t *testing.T) {
	r := NewRecorder(t.Context(), "rec")
	var cleaned []int
	r.Go(func(tb testing.TB) {
		tb.Cleanup(func() { cleaned = append(cleaned, 1) })
		tb.Cleanup(func() {
			cleaned = append(cleaned, 2)
			tb.FailNow() // ends only this cleanup
		})
		dir := tb.TempDir()
		if dir == "" {
			tb.Error("no TempDir")
		}
		tb.Log("a log")
		tb.Fatal("fatal", 1)
	})
	if got := r.Failures(); len(got) != 1 || got[0] != "fatal 1" {
		t.Errorf("failures %q", got)
	}
	if !r.Failed() || r.Skipped() {
		t.Errorf("Failed %t Skipped %t, want true false", r.Failed(), r.Skipped())
	}
	if len(cleaned) != 2 || cleaned[0] != 2 || cleaned[1] != 1 {
		t.Errorf("cleanups ran %v, want [2 1]", cleaned)
	}
	if r.Context().Err() == nil {
		t.Error("the context is not cancelled after Go")
	}

	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the panic re-raised", p)
			}
		}()
		NewRecorder(t.Context(), "panics").Go(func(testing.TB) { panic("boom") })
	}()
}
