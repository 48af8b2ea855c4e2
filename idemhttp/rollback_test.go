package idemhttp_test

// A success must never reach the client for writes that rolled back, and a
// handler that fails after it began to answer must not have its partial
// success stored.

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/idemhq/idem/idemhttp"
)

// A handler that inserts, writes part of a success, and then fails with a
// 5xx: the late status is the answer, its writes roll back, nothing is
// stored, a retry runs the handler again, and the logger is warned.
func TestLateServerErrorRollsBack(t *testing.T) {
	t.Parallel()
	for name, fail := range map[string]func(w http.ResponseWriter){
		"Write then http.Error": func(w http.ResponseWriter) {
			w.Header().Set("Location", "/charges/1")
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"id":`)
			http.Error(w, "ledger down", http.StatusInternalServerError)
		},
		"WriteHeader 200, partial body, WriteHeader 500": func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusOK)
			fmt.Fprint(w, `{"id":`)
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, "ledger down\n")
		},
		"404, then http.Error": func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusNotFound)
			http.Error(w, "ledger down", http.StatusInternalServerError)
		},
	} {
		for _, key := range []string{"k", ""} {
			t.Run(fmt.Sprintf("%s/key=%q", name, key), func(t *testing.T) {
				t.Parallel()
				logs := &capturingHandler{}
				a := newConfigured(t, &idemhttp.Config{Logger: slog.New(logs)}, func(mux *http.ServeMux, a *app) {
					mux.HandleFunc("POST /late", func(w http.ResponseWriter, r *http.Request) {
						a.runs.Add(1)
						if _, err := idemhttp.Tx(r.Context()).Exec(r.Context(), "insert into charges (amount) values (1)"); err != nil {
							t.Error(err)
						}
						fail(w)
					})
				})
				for attempt := 1; attempt <= 2; attempt++ {
					w := a.send(http.MethodPost, "/late", key, []byte("{}"))
					if w.Code != http.StatusInternalServerError || w.Body.String() != "ledger down\n" {
						t.Fatalf("attempt %d: %d %q, want the late 500 and its text alone", attempt, w.Code, w.Body.String())
					}
					wantReplayed(t, w, false)
					if loc, ct := w.Header().Get("Location"), w.Header().Get("Content-Type"); loc != "" || ct != "text/plain; charset=utf-8" {
						t.Fatalf("attempt %d: Location %q and Content-Type %q, want those of the late answer alone", attempt, loc, ct)
					}
				}
				if c, k, runs := a.charges(t), a.keys(t), a.runs.Load(); c != 0 || k != 0 || runs != 2 {
					t.Fatalf("%d charges, %d keys, %d runs; want 0, 0, 2", c, k, runs)
				}
				if text := logs.text(); !strings.Contains(text, "WARN") {
					t.Fatalf("log:\n%s\nwant a warning", text)
				}
			})
		}
	}
}

// A later status of the same or a better class is dropped, as net/http
// drops it: the first success stands and commits.
func TestLateSuccessIsDropped(t *testing.T) {
	t.Parallel()
	a := newConfigured(t, nil, func(mux *http.ServeMux, a *app) {
		mux.HandleFunc("POST /twice", func(w http.ResponseWriter, r *http.Request) {
			if _, err := idemhttp.Tx(r.Context()).Exec(r.Context(), "insert into charges (amount) values (1)"); err != nil {
				t.Error(err)
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, "made")
			w.WriteHeader(http.StatusOK)
		})
	})
	first := a.send(http.MethodPost, "/twice", "k", []byte("{}"))
	retry := a.send(http.MethodPost, "/twice", "k", []byte("{}"))
	for i, w := range []int{first.Code, retry.Code} {
		if w != http.StatusCreated {
			t.Fatalf("response %d: %d, want 201", i, w)
		}
	}
	wantReplayed(t, retry, true)
	if c := a.charges(t); c != 1 {
		t.Fatalf("%d charges, want 1", c)
	}
}

// NoStore on a success rolls its writes back, so the success is not sent:
// the client receives 500, and the logger a warning.
func TestNoStoreSuccessIsNotSent(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"k", ""} {
		t.Run(fmt.Sprintf("key=%q", key), func(t *testing.T) {
			t.Parallel()
			logs := &capturingHandler{}
			a := newConfigured(t, &idemhttp.Config{Logger: slog.New(logs)}, func(mux *http.ServeMux, a *app) {
				mux.HandleFunc("POST /nostore", func(w http.ResponseWriter, r *http.Request) {
					a.runs.Add(1)
					if _, err := idemhttp.Tx(r.Context()).Exec(r.Context(), "insert into charges (amount) values (1)"); err != nil {
						t.Error(err)
					}
					idemhttp.NoStore(r.Context())
					w.WriteHeader(http.StatusCreated)
				})
			})
			for attempt := 1; attempt <= 2; attempt++ {
				wantProblem(t, a.send(http.MethodPost, "/nostore", key, []byte("{}")), http.StatusInternalServerError, idemhttp.ProblemInternal)
			}
			if c, k, runs := a.charges(t), a.keys(t), a.runs.Load(); c != 0 || k != 0 || runs != 2 {
				t.Fatalf("%d charges, %d keys, %d runs; want 0, 0, 2", c, k, runs)
			}
			if text := logs.text(); !strings.Contains(text, "WARN") || !strings.Contains(text, "NoStore") {
				t.Fatalf("log:\n%s\nwant a warning naming NoStore", text)
			}
		})
	}
}

// NoStore on a refusal keeps its meaning: the refusal reaches the client,
// and the key stays free.
func TestNoStoreRefusalIsSent(t *testing.T) {
	t.Parallel()
	a := newConfigured(t, nil, func(mux *http.ServeMux, a *app) {
		mux.HandleFunc("POST /nostore", func(w http.ResponseWriter, r *http.Request) {
			idemhttp.NoStore(r.Context())
			http.Error(w, "not yet", http.StatusConflict)
		})
	})
	w := a.send(http.MethodPost, "/nostore", "k", []byte("{}"))
	if w.Code != http.StatusConflict || w.Body.String() != "not yet\n" {
		t.Fatalf("%d %q, want the handler's 409", w.Code, w.Body.String())
	}
	if k := a.keys(t); k != 0 {
		t.Fatalf("%d keys, want 0", k)
	}
}
