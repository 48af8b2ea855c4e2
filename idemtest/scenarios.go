package idemtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/kit"
)

// run is one Run of a Suite.
type run[Req, Resp any] struct {
	suite   Suite[Req, Resp]
	session *kit.Session
	req     Req // the request of the scenario that runs
}

// with returns scenario, run with its request: Request, or what NewRequest
// returns for it.
func (r *run[Req, Resp]) with(scenario func(t testing.TB)) func(t testing.TB) {
	return func(t testing.TB) {
		r.req = r.suite.Request
		if r.suite.NewRequest != nil {
			r.req = r.suite.NewRequest(t)
		}
		scenario(t)
	}
}

// done runs Check after the scenario st.
func (r *run[Req, Resp]) done(t testing.TB, st *kit.Step) {
	t.Helper()
	if r.suite.Check == nil {
		return
	}
	r.suite.Check(t, Scenario{Name: st.Name, Keys: st.Keys, Executions: st.Executions, TotalExecutions: st.Total()})
}

// show formats a result for a message.
func show(v any) string { return kit.Excerpt(fmt.Appendf(nil, "%+v", v)) }

// call calls Call with key and the request, or its changed form.
func (r *run[Req, Resp]) call(t testing.TB, key string, req Req) (Resp, error) {
	v, _, err := r.suite.Call(t.Context(), key, req)
	return v, err
}

// settle calls until the call is not refused as in progress.
func (r *run[Req, Resp]) settle(t testing.TB, key string) (Resp, error) {
	deadline := time.Now().Add(kit.Settle)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 250*time.Millisecond) {
		v, err := r.call(t, key, r.req)
		if !errors.Is(err, idem.ErrInProgress) || time.Now().After(deadline) {
			return v, err
		}
		select {
		case <-t.Context().Done():
			return v, err
		case <-time.After(wait):
		}
	}
}

// first makes the first call with a new key: it must succeed.
func (r *run[Req, Resp]) first(t testing.TB, key string) Resp {
	t.Helper()
	v, err := r.call(t, key, r.req)
	if err != nil {
		t.Fatalf("the first call with a new key failed: %v; Request must be a request that Call accepts and executes", err)
	}
	return v
}

// expectSame reports unless v, err is the result want, with no error.
func (r *run[Req, Resp]) expectSame(t testing.TB, what string, want, v Resp, err error) {
	t.Helper()
	switch {
	case err != nil:
		t.Errorf("%s failed: %v; want the first call's result", what, err)
	case !reflect.DeepEqual(want, v):
		t.Errorf("%s returned %s, want the first call's %s (reflect.DeepEqual): a replay must return the first result exactly; does Call change the result after idem returns it?", what, show(v), show(want))
	}
}

const executedAgain = ": Call runs the operation again for a used key; does it run it through idem.Do, idem.Run or idem.Wrap, with the key?"

// expectUnchanged reports the tables that changed since before.
func (r *run[Req, Resp]) expectUnchanged(t testing.TB, before kit.Digest, what string) {
	t.Helper()
	r.session.ExpectUnchanged(t, before, what, "a replay must write nothing; a write outside the operation's transaction did")
}

// retries: a first call, then Retries retries with the same key.
func (r *run[Req, Resp]) retries(t testing.TB) {
	sc := r.session.Begin("Retries")
	key := sc.Key()
	before := r.session.Effects(t)
	first := r.first(t, key)
	sc.Executed()
	if r.session.Effects(t) == before {
		t.Fatalf("Effects did not rise after the first call succeeded: Effects must count the operation's effect, and the operation's writes must commit")
	}
	r.session.ExpectEffects(t, before, 1, "for the first call", "")
	digest := r.session.Digest(t)
	n := r.suite.Retries
	for i := 1; i <= n; i++ {
		v, err := r.call(t, key, r.req)
		r.expectSame(t, fmt.Sprintf("retry %d of %d", i, n), first, v, err)
	}
	r.session.ExpectEffects(t, before, 1, fmt.Sprintf("for a call and %d retries with its key", n), executedAgain)
	r.expectUnchanged(t, digest, "the retries")
	r.done(t, sc)
}

// lostAnswer: a call whose result is dropped, then retries.
func (r *run[Req, Resp]) lostAnswer(t testing.TB) {
	sc := r.session.Begin("LostAnswer")
	key := sc.Key()
	before := r.session.Effects(t)
	if _, err := r.call(t, key, r.req); err != nil {
		t.Fatalf("the call whose result the kit drops failed: %v; Request must be a request that Call accepts and executes", err)
	}
	sc.Executed()
	digest := r.session.Digest(t)
	retry, err := r.settle(t, key)
	if err != nil {
		t.Errorf("the retry after a lost answer failed: %v; want the lost result", err)
	} else {
		v, err := r.call(t, key, r.req)
		r.expectSame(t, "a second retry after a lost answer", retry, v, err)
	}
	r.session.ExpectEffects(t, before, 1, "for a call whose result was lost and its retries", executedAgain)
	r.expectUnchanged(t, digest, "the retries after a lost answer")
	r.done(t, sc)
}

// concurrent: Concurrency duplicate calls at once.
func (r *run[Req, Resp]) concurrent(t testing.TB) {
	sc := r.session.Begin("Concurrent")
	key := sc.Key()
	n := r.suite.Concurrency
	before := r.session.Effects(t)
	values := make([]Resp, n)
	errs := make([]error, n)
	ctx := t.Context()
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			values[i], _, errs[i] = r.suite.Call(ctx, key, r.req)
		})
	}
	close(start)
	wg.Wait()

	var ok, inProgress []int
	for i, err := range errs {
		switch {
		case err == nil:
			ok = append(ok, i)
		case errors.Is(err, idem.ErrInProgress):
			inProgress = append(inProgress, i)
		default:
			t.Errorf("duplicate %d of %d failed: %v; want the one result or idem.ErrInProgress", i+1, n, err)
		}
	}
	summary := fmt.Sprintf("%d concurrent duplicates: %d returned a result, %d idem.ErrInProgress", n, len(ok), len(inProgress))
	t.Log(summary)
	final, err := r.settle(t, key)
	sc.Executed()
	if err != nil {
		t.Errorf("after %s, a retry failed: %v; want the one result", summary, err)
	} else {
		var differ []int
		for _, i := range ok {
			if !reflect.DeepEqual(final, values[i]) {
				differ = append(differ, i)
			}
		}
		if len(differ) > 0 {
			i := differ[0]
			t.Errorf("%d of %d concurrent duplicates returned a result other than a later retry's (duplicate %d returned %s, the retry %s): every duplicate must get the one result", len(differ), n, i+1, show(values[i]), show(final))
		}
	}
	r.session.ExpectEffects(t, before, 1, fmt.Sprintf("for %d concurrent duplicates", n),
		": concurrent calls with one key all ran the operation; a check for the key made before the work, outside the work's transaction, races (idem.Do claims the key in the work's transaction)")
	r.done(t, sc)
}

// changed returns the changed form of the request.
func (r *run[Req, Resp]) changed(t testing.TB) Req {
	t.Helper()
	if r.suite.Change != nil {
		return r.suite.Change(r.req)
	}
	var zero Req
	orig, err := json.Marshal(r.req)
	if err != nil {
		t.Fatalf("the kit changes Request through its JSON form, which failed: %v; set Suite.Change", err)
	}
	doc, err := kit.ChangeJSON(orig)
	if err != nil {
		t.Fatalf("the kit changes Request through its JSON form, which failed: %v; set Suite.Change", err)
	}
	out := zero
	if err := json.Unmarshal(doc, &out); err != nil {
		t.Fatalf("the kit's change of Request's JSON form (%s) does not decode into %T: %v; set Suite.Change", doc, zero, err)
	}
	if again, err := json.Marshal(out); err != nil || bytes.Equal(again, orig) {
		t.Fatalf("the kit's change of Request's JSON form (%s) was lost decoding it back into %T; set Suite.Change", doc, zero)
	}
	return out
}

// changedRequest: a call, then a changed one with the same key.
func (r *run[Req, Resp]) changedRequest(t testing.TB) {
	sc := r.session.Begin("ChangedRequest")
	key := sc.Key()
	changed := r.changed(t)
	before := r.session.Effects(t)
	first := r.first(t, key)
	sc.Executed()
	v, err := r.call(t, key, changed)
	const what = "the same key with a changed request"
	switch {
	case errors.Is(err, idem.ErrMismatch):
	case err == nil && r.session.Effects(t) > before+1:
		t.Errorf("%s was executed (it returned %s), want idem.ErrMismatch: the key must be refused for another request", what, show(v))
	case err == nil:
		t.Errorf("%s returned a result (%s), want idem.ErrMismatch: the request hash that Call gives idem does not cover what changed", what, show(v))
	default:
		t.Errorf("%s failed with %v, want an error wrapping idem.ErrMismatch", what, err)
	}
	v, err = r.call(t, key, r.req)
	r.expectSame(t, "the original request again after the changed one", first, v, err)
	r.session.ExpectEffects(t, before, 1, "for a call and a changed call with its key", "")
	r.done(t, sc)
}

// failOnce makes a call with key fail after its work ran: the kit's trigger
// fails the key's completion. A call that does not fail ends the scenario.
func (r *run[Req, Resp]) failOnce(t testing.TB, key string) error {
	t.Helper()
	fault := r.session.Fault(t)
	if err := fault.Arm(t.Context(), key); err != nil {
		t.Fatalf("arming the kit's fault: %v", err)
	}
	_, err := r.call(t, key, r.req)
	if derr := fault.Disarm(t.Context(), key); derr != nil {
		t.Fatalf("disarming the kit's fault: %v", derr)
	}
	if err == nil {
		t.Fatalf("the call whose transaction the kit made fail (a trigger on %s fails its key's completion, before COMMIT) returned no error: Call does not run the operation through idem on DB with this key, or it drops the error", r.session.DB.Table())
	}
	return err
}

// failureNotStored: a call fails after its work ran; the retry executes
// once.
func (r *run[Req, Resp]) failureNotStored(t testing.TB) {
	sc := r.session.Begin("FailureNotStored")
	key := sc.Key()
	err := r.failOnce(t, key)
	if r.session.Stored(t, key) {
		t.Errorf("the failed call (%v) left its key stored: a failure must leave the key free so that the retry executes", err)
	}
	mid := r.session.Effects(t)
	if _, err := r.settle(t, key); err != nil {
		t.Errorf("the retry after a failed call failed: %v; the retry must execute", err)
	} else {
		sc.Executed()
		r.session.ExpectEffects(t, mid, 1, "for the retry after a failed call", "")
	}
	r.done(t, sc)
}

// writesInTransaction: a call that fails after its work ran leaves no effect
// and changes no table.
func (r *run[Req, Resp]) writesInTransaction(t testing.TB) {
	sc := r.session.Begin("WritesInTransaction")
	key := sc.Key()
	before := r.session.Effects(t)
	digest := r.session.Digest(t)
	err := r.failOnce(t, key)
	after := r.session.Effects(t)
	var msgs []string
	if after != before {
		msgs = append(msgs, fmt.Sprintf("the call whose transaction rolled back (%v) left %d effect(s) (Effects went from %d to %d): the operation writes outside the transaction idem gives it, through the pool or a transaction or connection of its own, instead of the pgx.Tx it is passed", err, after-before, before, after))
	}
	if changed := digest.Changed(r.session.Digest(t)); len(changed) > 0 {
		msgs = append(msgs, fmt.Sprintf("the call whose transaction rolled back changed table(s) %s: the operation writes there outside the transaction idem gives it (use the pgx.Tx it is passed); list tables written outside it on purpose in IgnoreTables", kit.Tables(changed)))
	}
	if len(msgs) > 0 {
		t.Error(strings.Join(msgs, "\n"))
	}
	r.done(t, sc)
}
