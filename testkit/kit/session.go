package kit

import (
	"context"
	"sync"
	"testing"
)

// A Session is one run of a kit's battery: the database, the keys sent, the
// fault if one was needed, and how many executions the scenarios so far
// expected.
type Session struct {
	DB   *DB
	Keys Keys

	effects func(ctx context.Context) (int, error)

	mu    sync.Mutex
	fault *Fault
	total int
}

// NewSession returns a Session on db that counts effects with effects. When
// t ends, it removes the fault if one was installed, and deletes the keys
// it sent if t passed; if t failed, it keeps them for inspection and logs
// them (they expire like any key).
func NewSession(t testing.TB, db *DB, effects func(ctx context.Context) (int, error)) *Session {
	s := &Session{DB: db, effects: effects}
	t.Cleanup(func() {
		ctx, cancel := CleanupContext(t)
		defer cancel()
		s.mu.Lock()
		f := s.fault
		s.mu.Unlock()
		if f != nil {
			if err := f.Remove(ctx); err != nil {
				t.Errorf("removing the kit's trigger %s from %s: %v", f.trg, db.Table(), err)
			}
		}
		keys := s.Keys.All()
		if len(keys) == 0 {
			return
		}
		if t.Failed() {
			t.Logf("kept the %d keys this run stored in %s, for inspection: %v", len(keys), db.Table(), keys)
			return
		}
		if err := db.Forget(ctx, keys); err != nil {
			t.Errorf("deleting the kit's keys from %s: %v", db.Table(), err)
		}
	})
	return s
}

// Effects returns the user's count of effects; an error ends the scenario.
func (s *Session) Effects(t testing.TB) int {
	t.Helper()
	n, err := s.effects(t.Context())
	if err != nil {
		t.Fatalf("Effects failed: %v", err)
	}
	return n
}

// Digest returns the digest of the tables; an error ends the scenario.
func (s *Session) Digest(t testing.TB) Digest {
	t.Helper()
	d, err := s.DB.Digest(t.Context())
	if err != nil {
		t.Fatalf("%v", err)
	}
	return d
}

// Stored reports whether a committed row holds key; an error ends the
// scenario.
func (s *Session) Stored(t testing.TB, key string) bool {
	t.Helper()
	stored, err := s.DB.Stored(t.Context(), key)
	if err != nil {
		t.Fatalf("looking up key %s in %s: %v", key, s.DB.Table(), err)
	}
	return stored
}

// Fault returns the session's fault, installing it on first use; an error
// ends the scenario.
func (s *Session) Fault(t testing.TB) *Fault {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fault == nil {
		f, err := s.DB.InstallFault(t.Context())
		if err != nil {
			t.Fatalf("%v", err)
		}
		s.fault = f
	}
	return s.fault
}

// Executed adds n executions that a scenario expected and returns the total
// so far.
func (s *Session) Executed(n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total += n
	return s.total
}

// Excerpt shortens b for a message.
func Excerpt(b []byte) string {
	const limit = 300
	if len(b) <= limit {
		return string(b)
	}
	return string(b[:limit]) + "…"
}

// A Step is the state of one scenario: its keys and the executions it
// expects.
type Step struct {
	s          *Session
	Name       string
	Keys       []string
	Executions int
}

// Begin starts the scenario name.
func (s *Session) Begin(name string) *Step { return &Step{s: s, Name: name} }

// Key returns a new key for the scenario and records it.
func (st *Step) Key() string {
	k := st.s.Keys.New()
	st.Keys = append(st.Keys, k)
	return k
}

// Executed records one execution the scenario expects.
func (st *Step) Executed() {
	st.Executions++
	st.s.Executed(1)
}

// Total returns the executions expected so far in the session.
func (st *Step) Total() int { return st.s.Executed(0) }

// ExpectEffects reports unless Effects rose by want since before. tooMany
// is the likely cause of a rise beyond want.
func (s *Session) ExpectEffects(t testing.TB, before, want int, when, tooMany string) {
	t.Helper()
	got := s.Effects(t) - before
	switch {
	case got > want:
		t.Errorf("the operation took effect %d times %s, want %d (Effects went from %d to %d)%s", got, when, want, before, before+got, tooMany)
	case got < want:
		t.Errorf("the operation took effect %d times %s, want %d (Effects went from %d to %d): Effects must count the operation's effect, and the operation's writes must commit", got, when, want, before, before+got)
	}
}

// ExpectUnchanged reports the tables that changed since before; cause is
// the likely cause.
func (s *Session) ExpectUnchanged(t testing.TB, before Digest, what, cause string) {
	t.Helper()
	if changed := before.Changed(s.Digest(t)); len(changed) > 0 {
		t.Errorf("%s changed table(s) %s: %s (list tables written outside it on purpose in IgnoreTables)", what, Tables(changed), cause)
	}
}
