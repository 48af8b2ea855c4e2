package idemhttptest

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/idemhq/idem/testkit/kit"
)

// done runs Check after the scenario st.
func (r *run) done(t testing.TB, st *kit.Step) {
	t.Helper()
	if r.suite.Check == nil {
		return
	}
	r.suite.Check(t, Scenario{Name: st.Name, Keys: st.Keys, Executions: st.Executions, TotalExecutions: st.Total()})
}

// first sends the first request with a new key: the handler must execute
// it and answer 2xx.
func (r *run) first(t testing.TB, key string) answer {
	t.Helper()
	a := r.send(t, key)
	switch {
	case a.replayed():
		t.Fatalf("the first request with a new key was answered as a replay: %v", a)
	case !a.ok():
		t.Fatalf("the first request with a new key was answered %v, want 2xx: Request must build a request that the handler accepts and executes (check its method, path, body and credentials)", a)
	}
	return a
}

// expectEffects reports unless Effects rose by want since before.
func (r *run) expectEffects(t testing.TB, before, want int, when string) {
	t.Helper()
	r.session.ExpectEffects(t, before, want, when, "")
}

// expectReplay reports unless a replays first exactly.
func (r *run) expectReplay(t testing.TB, what string, first, a answer) {
	t.Helper()
	switch {
	case !a.replayed() && a.ok():
		t.Errorf("%s was answered %v without Idempotent-Replayed: true: the handler ran again instead of replaying the first answer; is the route behind idemhttp's middleware, for this method?", what, a)
	case !a.replayed():
		t.Errorf("%s was answered %v, want a replay of the first answer (%v)", what, a, first)
	default:
		if diff := r.differs(first, a); diff != "" {
			t.Errorf("%s was a replay with %s: a replay must repeat the first answer exactly; something outside idemhttp's middleware changes responses, or the stored answer is not the one the client got first", what, diff)
		}
	}
}

// expectUnchanged reports the tables that changed since before.
func (r *run) expectUnchanged(t testing.TB, before kit.Digest, what string) {
	t.Helper()
	r.session.ExpectUnchanged(t, before, what, "a replay must write nothing; a write outside idemhttp's transaction, or in front of its middleware, did")
}

// retries: a first request, then Retries retries with the same key.
func (r *run) retries(t testing.TB) {
	sc := r.session.Begin("Retries")
	key := sc.Key()
	before := r.session.Effects(t)
	first := r.first(t, key)
	sc.Executed()
	if got := r.session.Effects(t) - before; got == 0 {
		t.Fatalf("Effects did not rise after the first request was answered %v: Effects must count the operation's effect, and the handler's writes must commit", first)
	}
	r.expectEffects(t, before, 1, "for the first request")
	digest := r.session.Digest(t)
	n := r.suite.Retries
	for i := 1; i <= n; i++ {
		r.expectReplay(t, fmt.Sprintf("retry %d of %d", i, n), first, r.send(t, key))
	}
	r.expectEffects(t, before, 1, fmt.Sprintf("for a request and %d retries with its key", n))
	r.expectUnchanged(t, digest, "the retries")
	r.done(t, sc)
}

// lostAnswer: a request whose answer is lost after commit, then a retry.
func (r *run) lostAnswer(t testing.TB) {
	sc := r.session.Begin("LostAnswer")
	key := sc.Key()
	before := r.session.Effects(t)
	r.sendLost(t, key)
	sc.Executed()
	digest := r.session.Digest(t)
	retry := r.settle(t, key)
	switch {
	case !retry.replayed() && retry.ok():
		t.Errorf("the retry after a lost answer was answered %v without Idempotent-Replayed: true: the handler ran again for a request that had already taken effect", retry)
	case !retry.replayed():
		t.Errorf("the retry after a lost answer was answered %v, want a replay of the lost answer", retry)
	default:
		r.expectReplay(t, "a second retry after a lost answer", retry, r.send(t, key))
	}
	r.expectEffects(t, before, 1, "for a request whose answer was lost and its retries")
	r.expectUnchanged(t, digest, "the retries after a lost answer")
	r.done(t, sc)
}

// concurrent: Concurrency duplicates at once.
func (r *run) concurrent(t testing.TB) {
	sc := r.session.Begin("Concurrent")
	key := sc.Key()
	n := r.suite.Concurrency
	before := r.session.Effects(t)
	reqs := make([]*http.Request, n)
	for i := range reqs {
		reqs[i] = r.build(t, key, false)
	}
	answers := make([]answer, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Go(func() {
			<-start
			answers[i], errs[i] = r.roundTrip(reqs[i])
		})
	}
	close(start)
	wg.Wait()

	var executed, replayed, inProgress []int
	for i, a := range answers {
		switch {
		case errs[i] != nil:
			t.Errorf("duplicate %d of %d got no answer: %v", i+1, n, errs[i])
		case a.replayed():
			replayed = append(replayed, i)
		case a.inProgress():
			inProgress = append(inProgress, i)
		case a.ok():
			executed = append(executed, i)
		default:
			t.Errorf("duplicate %d of %d was answered %v, want 2xx (executed or replayed) or 409 (in progress)", i+1, n, a)
		}
	}
	summary := fmt.Sprintf("%d concurrent duplicates: %d executed, %d replayed, %d answered 409 in progress", n, len(executed), len(replayed), len(inProgress))
	t.Log(summary)
	if len(executed) > 1 {
		t.Errorf("%s: want exactly 1 executed (2xx without Idempotent-Replayed: true); concurrent duplicates must not all run the handler", summary)
	}
	final := r.settle(t, key)
	sc.Executed()
	if !final.replayed() {
		t.Errorf("after %s, a retry was answered %v, want a replay of the executed answer", summary, final)
	} else {
		var differ []int
		first := ""
		for _, i := range append(executed, replayed...) {
			if diff := r.differs(final, answers[i]); diff != "" {
				if first == "" {
					first = fmt.Sprintf("duplicate %d was answered with %s", i+1, diff)
				}
				differ = append(differ, i)
			}
		}
		if len(differ) > 0 {
			t.Errorf("%d of %d concurrent duplicates got an answer other than a later replay's (%s): every duplicate must get the one answer", len(differ), n, first)
		}
	}
	r.expectEffects(t, before, 1, fmt.Sprintf("for %d concurrent duplicates", n))
	r.done(t, sc)
}

// changedRequest: a request, then a changed one with the same key.
func (r *run) changedRequest(t testing.TB) {
	sc := r.session.Begin("ChangedRequest")
	key := sc.Key()
	before := r.session.Effects(t)
	first := r.first(t, key)
	sc.Executed()
	a := r.do(t, r.build(t, key, true))
	const what = "the same key with a changed request"
	switch {
	case a.status == http.StatusUnprocessableEntity:
	case a.replayed() && a.ok():
		t.Errorf("%s was answered as a replay of the first answer (%v), want 422: the service's fingerprint does not cover what changed (a Config.Fingerprint that leaves out the body, say)", what, a)
	case a.ok():
		t.Errorf("%s was executed (%v), want 422: the key must be refused for another request", what, a)
	default:
		t.Errorf("%s was answered %v, want 422 (idemhttp.ProblemKeyMismatch)", what, a)
	}
	r.expectReplay(t, "the original request sent again after the changed one", first, r.send(t, key))
	r.expectEffects(t, before, 1, "for a request and a changed request with its key")
	r.done(t, sc)
}

// failOnce makes the next request with key fail after the handler ran, and
// returns its answer.
func (r *run) failOnce(t testing.TB, key string) answer {
	t.Helper()
	if f := r.suite.Faults; f != nil {
		f.arm(key)
		a := r.send(t, key)
		if !f.disarm(key) {
			t.Fatalf("the request armed to fail was answered %v and never reached Faults' middleware with its key: install Faults.Middleware inside idemhttp's middleware, around the handler", a)
		}
		if a.status < 500 {
			t.Fatalf("the request that Faults answered 503 reached the client as %v", a)
		}
		return a
	}
	fault := r.session.Fault(t)
	if err := fault.Arm(t.Context(), key); err != nil {
		t.Fatalf("arming the kit's fault: %v", err)
	}
	a := r.send(t, key)
	if err := fault.Disarm(t.Context(), key); err != nil {
		t.Fatalf("disarming the kit's fault: %v", err)
	}
	if a.status < 500 {
		t.Fatalf("the kit made the completion of the request's key fail in %s, yet the request was answered %v: its key never reached that table; is the handler behind idemhttp's middleware, on DB?", r.session.DB.Table(), a)
	}
	return a
}

// failureNotStored: an attempt fails after the handler ran; the retry
// executes once.
func (r *run) failureNotStored(t testing.TB) {
	sc := r.session.Begin("FailureNotStored")
	key := sc.Key()
	failed := r.failOnce(t, key)
	if r.session.Stored(t, key) {
		t.Errorf("the failed attempt's answer (%v) was stored under the key: a 5xx must leave the key free so that the retry executes (see idemhttp.Config.StoreStatus; the default stores no 5xx)", failed)
	}
	mid := r.session.Effects(t)
	retry := r.settle(t, key)
	switch {
	case retry.replayed():
		t.Errorf("the retry after a failed attempt was answered as a replay (%v): the failure was stored; the retry must execute", retry)
	case !retry.ok():
		t.Errorf("the retry after a failed attempt was answered %v, want 2xx: the retry must execute", retry)
	default:
		sc.Executed()
		r.expectEffects(t, mid, 1, "for the retry after a failed attempt")
	}
	if r.suite.Faults == nil {
		t.Logf("the attempt was made to fail in the database, at its commit; set Suite.Faults to also check that the service stores no 5xx answer of its handler")
	}
	r.done(t, sc)
}

// writesInTransaction: an attempt that fails after the handler ran leaves no
// effect and changes no table.
func (r *run) writesInTransaction(t testing.TB) {
	sc := r.session.Begin("WritesInTransaction")
	key := sc.Key()
	before := r.session.Effects(t)
	digest := r.session.Digest(t)
	failed := r.failOnce(t, key)
	after := r.session.Effects(t)
	var msgs []string
	if after != before {
		msgs = append(msgs, fmt.Sprintf("the attempt whose transaction rolled back (answered %v) left %d effect(s) (Effects went from %d to %d): the handler writes outside the request's transaction, through the pool or a transaction or connection of its own, instead of idemhttp.Tx(r.Context())", failed, after-before, before, after))
	}
	if changed := digest.Changed(r.session.Digest(t)); len(changed) > 0 {
		msgs = append(msgs, fmt.Sprintf("the attempt whose transaction rolled back changed table(s) %s: the handler writes there outside the request's transaction (use idemhttp.Tx(r.Context())), or in front of idemhttp's middleware; list tables written outside it on purpose in IgnoreTables", kit.Tables(changed)))
	}
	if len(msgs) > 0 {
		t.Error(strings.Join(msgs, "\n"))
	}
	r.done(t, sc)
}
